// RMSNorm over the last dimension on the GPU: one block per row, the weight gradient by column
// tiles (deterministic, no atomics).
#include "backend/cuda/common.h"

__global__ static void rmsnorm_forward_kernel(float *out, float *rstd, const float *inp,
                                              const float *weight, int C, float eps) {
    int n = blockIdx.x;
    const float *x = inp + (size_t)n * C;
    float *o = out + (size_t)n * C;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) ss += x[c] * x[c];
    ss = block_reduce<false>(ss);
    float r = 1.0f / sqrtf(ss / C + eps);
    for (int c = threadIdx.x; c < C; c += blockDim.x) o[c] = x[c] * r * weight[c];
    if (threadIdx.x == 0) rstd[n] = r;
}

__global__ static void rmsnorm_backward_dinp_kernel(float *dinp, const float *dout,
                                                    const float *inp, const float *weight,
                                                    const float *rstd, int C) {
    int n = blockIdx.x;
    const float *x = inp + (size_t)n * C;
    const float *d = dout + (size_t)n * C;
    float *dx = dinp + (size_t)n * C;
    float r = rstd[n];
    float dot = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dot += d[c] * weight[c] * x[c];
    dot = block_reduce<false>(dot);
    // forward: out = inp * rstd * weight, rstd = (mean(inp^2) + eps)^(-1/2)
    float k = dot * r * r * r / C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dx[c] += r * d[c] * weight[c] - k * x[c];
}

// A block owns 32 columns; its 32 x 8 threads split the rows 8 ways, then add the 8 partial
// sums in a fixed order, so the result does not depend on scheduling.
#define DW_COLS 32
#define DW_ROWS 8
__global__ static void rmsnorm_backward_dweight_kernel(float *dweight, const float *dout,
                                                       const float *inp, const float *rstd, int N,
                                                       int C) {
    __shared__ float partial[DW_ROWS][DW_COLS];
    int c = blockIdx.x * DW_COLS + threadIdx.x;
    float acc = 0.0f;
    if (c < C)
        for (int n = threadIdx.y; n < N; n += DW_ROWS)
            acc += dout[(size_t)n * C + c] * inp[(size_t)n * C + c] * rstd[n];
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float sum = 0.0f;
        for (int y = 0; y < DW_ROWS; y++) sum += partial[y][threadIdx.x];
        // forward: out = inp * rstd * weight  =>  dweight += sum_n dout * inp * rstd
        dweight[c] += sum;
    }
}

// out, inp: (N, C)  weight: (C)  rstd: (N), saved for the backward
void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N, int C,
                     float eps) {
    PROFILE(PROFILE_OTHER);
    if (N == 0 || C == 0) return;
    rmsnorm_forward_kernel<<<N, ROW_THREADS>>>(out, rstd, inp, weight, C, eps);
    cudaCheckLaunch();
}

void rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                      const float *weight, const float *rstd, int N, int C) {
    PROFILE(PROFILE_OTHER);
    if (N == 0 || C == 0) return;
    rmsnorm_backward_dinp_kernel<<<N, ROW_THREADS>>>(dinp, dout, inp, weight, rstd, C);
    cudaCheckLaunch();
    dim3 threads(DW_COLS, DW_ROWS);
    rmsnorm_backward_dweight_kernel<<<blocks_for(C, DW_COLS), threads>>>(dweight, dout, inp, rstd,
                                                                         N, C);
    cudaCheckLaunch();
}
