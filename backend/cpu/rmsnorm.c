// RMSNorm over the last dimension, as Llama uses it (no mean subtraction, no bias).
#include "backend/backend.h"
#include "backend/kernel_time.h"
#include <math.h>

#define COL_CHUNK 64 // columns per thread in the weight gradient: rows stay contiguous

// out, inp: (N, C)  weight: (C)  rstd: (N), saved for the backward
void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N, int C,
                     float eps) {
    KERNEL_TIME(KT_ELEMENTWISE, 0, 8.0 * N * C);
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *o = out + (size_t)n * C;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int c = 0; c < C; c++) ss += x[c] * x[c];
        float r = 1.0f / sqrtf(ss / C + eps);
        for (int c = 0; c < C; c++) o[c] = x[c] * r * weight[c];
        rstd[n] = r;
    }
}

void rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                      const float *weight, const float *rstd, int N, int C) {
    KERNEL_TIME(KT_ELEMENTWISE, 0, 16.0 * N * C);
    // forward: out = inp * rstd * weight, rstd = (mean(inp^2) + eps)^(-1/2)
    // dinp = rstd * dout * weight - inp * rstd^3 / C * sum_c(dout * weight * inp)
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        const float *d = dout + (size_t)n * C;
        float *dx = dinp + (size_t)n * C;
        float r = rstd[n];
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int c = 0; c < C; c++) dot += d[c] * weight[c] * x[c];
        float k = dot * r * r * r / C;
        for (int c = 0; c < C; c++) dx[c] += r * d[c] * weight[c] - k * x[c];
    }
    // forward: out = inp * rstd * weight  =>  dweight += sum_n dout * inp * rstd
    // parallel over column chunks: a loop over rows would race on dweight
    int chunks = (C + COL_CHUNK - 1) / COL_CHUNK;
#pragma omp parallel for
    for (int chunk = 0; chunk < chunks; chunk++) {
        int c0 = chunk * COL_CHUNK, c1 = c0 + COL_CHUNK < C ? c0 + COL_CHUNK : C;
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C;
            const float *d = dout + (size_t)n * C;
            for (int c = c0; c < c1; c++) dweight[c] += d[c] * x[c] * rstd[n];
        }
    }
}
