// Elementwise helpers and the two reductions the trainer needs (gradient norm, loss sum).
// `simd` tells gcc that the elements are independent: inside an OpenMP region it cannot see that
// the pointers do not alias, and would not vectorise.
#include "backend/backend.h"
#include "backend/kernel_time.h"

void fill(float *x, float value, size_t n) {
    KERNEL_TIME(KT_ELEMENTWISE, 0, 4.0 * n);
#pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) x[i] = value;
}

void fill_columns(float *x, float value, int N, int V, int from) {
    KERNEL_TIME(KT_ELEMENTWISE, 0, 4.0 * N * (V - from));
#pragma omp parallel for
    for (int n = 0; n < N; n++)
        for (int j = from; j < V; j++) x[(size_t)n * V + j] = value;
}

void add_inplace(float *y, const float *x, size_t n) {
    KERNEL_TIME(KT_ELEMENTWISE, 0, 12.0 * n);
#pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

void scale_inplace(float *x, float s, size_t n) {
    KERNEL_TIME(KT_ELEMENTWISE, 0, 8.0 * n);
#pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

void scale_rows(float *x, const float *scale, int rows, int cols) {
    KERNEL_TIME(KT_ELEMENTWISE, 0, 8.0 * rows * cols);
#pragma omp parallel for
    for (int r = 0; r < rows; r++) {
        float *row = x + (size_t)r * cols, s = scale[r];
#pragma omp simd
        for (int c = 0; c < cols; c++) row[c] *= s;
    }
}

// accumulated in double: the gradient norm sums ~1e9 squares, float would lose the small ones
void sum_squares(float *out, const float *x, size_t n) {
    KERNEL_TIME(KT_ELEMENTWISE, 0, 4.0 * n);
    double sum = 0.0;
#pragma omp parallel for simd reduction(+ : sum)
    for (size_t i = 0; i < n; i++) sum += (double)x[i] * x[i];
    out[0] += (float)sum;
}

void sum_reduce(float *out, const float *x, size_t n) {
    KERNEL_TIME(KT_ELEMENTWISE, 0, 4.0 * n);
    double sum = 0.0;
#pragma omp parallel for simd reduction(+ : sum)
    for (size_t i = 0; i < n; i++) sum += x[i];
    out[0] += (float)sum;
}
