// RMSNorm over the last dimension, as Llama uses it (no mean subtraction, no bias).
#include "backend/backend.h"
#include "backend/kernel_time.h"
#include "backend/cpu/lanes.h"
#include "backend/cpu/scratch.h"
#include <math.h>

#define ROW_BLOCK 64 // rows whose terms of the weight gradient are summed together
#define COL_CHUNK 64 // columns per thread in the sum of the blocks: rows stay contiguous

static Scratch partial_scratch; // the blocks' sums of the weight gradient

// out, inp: (N, C)  weight: (C)  rstd: (N), saved for the backward
void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N, int C,
                     float eps) {
    KERNEL_TIME(KT_ELEMENTWISE, 0, 8.0 * N * C);
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *o = out + (size_t)n * C;
        float lane[SUM_LANES] = {0}; // sum_c x^2, in lanes.h's fixed lanes
        int c = 0;
        for (; c + SUM_LANES <= C; c += SUM_LANES)
            for (int l = 0; l < SUM_LANES; l++) lane[l] += x[c + l] * x[c + l];
        for (; c < C; c++) lane[c % SUM_LANES] += x[c] * x[c];
        float ss = sum_lanes(lane);
        float r = 1.0f / sqrtf(ss / C + eps);
        for (int c = 0; c < C; c++) o[c] = x[c] * r * weight[c];
        rstd[n] = r;
    }
}

void rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                      const float *weight, const float *rstd, int N, int C) {
    KERNEL_TIME(KT_ELEMENTWISE, 0, 12.0 * N * C);
    // forward: out = inp * rstd * weight, rstd = (mean(inp^2) + eps)^(-1/2)
    // dinp = rstd * dout * weight - inp * rstd^3 / C * sum_c(dout * weight * inp)
    // dweight += sum_n dout * inp * rstd, summed by blocks of ROW_BLOCK rows while the rows are
    // read for dinp, then the blocks in order: the same bits on any number of threads, and the
    // rows read once (a second pass over them cost as much as the first)
    int blocks = (N + ROW_BLOCK - 1) / ROW_BLOCK;
    float *partial = scratch_floats(&partial_scratch, (size_t)blocks * C); // (blocks, C)
#pragma omp parallel for
    for (int blk = 0; blk < blocks; blk++) {
        float *pw = partial + (size_t)blk * C;
        for (int c = 0; c < C; c++) pw[c] = 0.0f;
        int n1 = (blk + 1) * ROW_BLOCK < N ? (blk + 1) * ROW_BLOCK : N;
        for (int n = blk * ROW_BLOCK; n < n1; n++) {
            const float *x = inp + (size_t)n * C;
            const float *d = dout + (size_t)n * C;
            float *dx = dinp + (size_t)n * C;
            float r = rstd[n];
            float lane[SUM_LANES] = {0}; // sum_c d * weight * x, in fixed lanes
            int c = 0;
            for (; c + SUM_LANES <= C; c += SUM_LANES)
                for (int l = 0; l < SUM_LANES; l++) lane[l] += d[c + l] * weight[c + l] * x[c + l];
            for (; c < C; c++) lane[c % SUM_LANES] += d[c] * weight[c] * x[c];
            float dot = sum_lanes(lane);
            float k = dot * r * r * r / C;
            for (int c = 0; c < C; c++) {
                dx[c] += r * d[c] * weight[c] - k * x[c];
                pw[c] += d[c] * x[c] * r;
            }
        }
    }
#pragma omp parallel for
    for (int c0 = 0; c0 < C; c0 += COL_CHUNK)
        for (int blk = 0; blk < blocks; blk++)
            for (int c = c0; c < C && c < c0 + COL_CHUNK; c++)
                dweight[c] += partial[(size_t)blk * C + c];
}
