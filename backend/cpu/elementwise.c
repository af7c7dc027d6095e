// Elementwise helpers and the two reductions the trainer needs (gradient norm, loss sum).
// `simd` tells gcc that the elements are independent: inside an OpenMP region it cannot see that
// the pointers do not alias, and would not vectorise.
#include "backend/backend.h"
#include "backend/kernel_time.h"
#include "backend/cpu/lanes.h"
#include "backend/cpu/scratch.h"

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

// The two sums in double (the gradient norm sums ~1e9 squares, float would lose the small
// ones), in an order that depends on nothing but n: blocks of SUM_BLOCK elements, each in
// SUM_LANES lanes (lanes.h), the blocks' sums then added in order. The same bits on any number
// of threads and any vector width, so that gradient clipping scales a step's gradients alike.
#define SUM_BLOCK 4096
static Scratch block_sums; // doubles, two floats' room each

static void sum_in_blocks(float *out, const float *x, size_t n, int squares) {
    size_t blocks = (n + SUM_BLOCK - 1) / SUM_BLOCK;
    double *partial = (double *)scratch_floats(&block_sums, 2 * blocks);
#pragma omp parallel for
    for (size_t blk = 0; blk < blocks; blk++) {
        const float *xb = x + blk * SUM_BLOCK;
        size_t m = n - blk * SUM_BLOCK < SUM_BLOCK ? n - blk * SUM_BLOCK : SUM_BLOCK, i = 0;
        double lane[SUM_LANES] = {0};
        for (; i + SUM_LANES <= m; i += SUM_LANES)
            for (int l = 0; l < SUM_LANES; l++)
                lane[l] += squares ? (double)xb[i + l] * xb[i + l] : xb[i + l];
        for (; i < m; i++) lane[i % SUM_LANES] += squares ? (double)xb[i] * xb[i] : xb[i];
        for (int width = SUM_LANES / 2; width > 0; width /= 2)
            for (int l = 0; l < width; l++) lane[l] += lane[l + width];
        partial[blk] = lane[0];
    }
    double sum = 0.0;
    for (size_t blk = 0; blk < blocks; blk++) sum += partial[blk];
    out[0] += (float)sum;
}

void sum_squares(float *out, const float *x, size_t n) {
    KERNEL_TIME(KT_ELEMENTWISE, 0, 4.0 * n);
    sum_in_blocks(out, x, n, 1);
}

void sum_reduce(float *out, const float *x, size_t n) {
    KERNEL_TIME(KT_ELEMENTWISE, 0, 4.0 * n);
    sum_in_blocks(out, x, n, 0);
}
