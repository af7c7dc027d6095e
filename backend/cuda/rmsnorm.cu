// RMSNorm over the last dimension on the GPU: the forward one block per row, the backward one
// block per RMS_ROWS rows (below); deterministic, no atomics.
#include "backend/cuda/common.h"

// out16: out's bf16 copy for the products that read it, or NULL
__global__ static void rmsnorm_forward_kernel(float *out, __nv_bfloat16 *out16, float *rstd,
                                              const float *inp, const float *weight, int C,
                                              float eps) {
    int n = blockIdx.x;
    const float *x = inp + (size_t)n * C;
    float *o = out + (size_t)n * C;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) ss += x[c] * x[c];
    ss = block_reduce<false>(ss);
    float r = 1.0f / sqrtf(ss / C + eps);
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float y = x[c] * r * weight[c];
        o[c] = y;
        if (out16) out16[(size_t)n * C + c] = __float2bfloat16_rn(y);
    }
    if (threadIdx.x == 0) rstd[n] = r;
}

// The backward reads each row of dout and inp once for both gradients. A block takes RMS_ROWS
// consecutive rows: dinp row by row, and the block's share of dweight, sum over its rows of
// dout * inp * rstd, kept per column in shared memory (thread t owns columns t, t + blockDim, ..,
// so no two threads touch one word) and written as one row of `partial` (blocks, C). Those rows
// are added by the next kernel in a fixed order: deterministic, no atomics, and N / RMS_ROWS
// blocks (1024 for 8192 tokens) where a grid over the columns alone has C / 32.
#define RMS_ROWS 8
__global__ static void rmsnorm_backward_kernel(float *dinp, float *partial, const float *dout,
                                               const float *inp, const float *weight,
                                               const float *rstd, int N, int C) {
    extern __shared__ float dw[]; // (C)
    for (int c = threadIdx.x; c < C; c += blockDim.x) dw[c] = 0.0f;
    int n_first = blockIdx.x * RMS_ROWS;
    int n_end = n_first + RMS_ROWS < N ? n_first + RMS_ROWS : N;
    for (int n = n_first; n < n_end; n++) {
        const float *x = inp + (size_t)n * C;
        const float *d = dout + (size_t)n * C;
        float *dx = dinp + (size_t)n * C;
        float r = rstd[n];
        float dot = 0.0f;
        for (int c = threadIdx.x; c < C; c += blockDim.x) dot += d[c] * weight[c] * x[c];
        dot = block_reduce<false>(dot);
        // forward: out = inp * rstd * weight, rstd = (mean(inp^2) + eps)^(-1/2)
        float k = dot * r * r * r / C;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            dx[c] += r * d[c] * weight[c] - k * x[c];
            // forward: out = inp * rstd * weight  =>  dweight += sum_n dout * inp * rstd
            dw[c] += d[c] * x[c] * r;
        }
    }
    for (int c = threadIdx.x; c < C; c += blockDim.x) partial[(size_t)blockIdx.x * C + c] = dw[c];
}

// dweight += the sum of the P rows of partial. A block owns 32 columns; its 32 x 32 threads
// split the rows 32 ways, then add the 32 partial sums in a fixed order.
#define DW_COLS 32
#define DW_ROWS 32
__global__ static void rmsnorm_dweight_kernel(float *dweight, const float *partial, int P, int C) {
    __shared__ float sums[DW_ROWS][DW_COLS];
    int c = blockIdx.x * DW_COLS + threadIdx.x;
    float acc = 0.0f;
    if (c < C)
        for (int p = threadIdx.y; p < P; p += DW_ROWS) acc += partial[(size_t)p * C + c];
    sums[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float sum = 0.0f;
        for (int y = 0; y < DW_ROWS; y++) sum += sums[y][threadIdx.x];
        dweight[c] += sum;
    }
}

// out, inp: (N, C)  weight: (C)  rstd: (N), saved for the backward
void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N, int C,
                     float eps) {
    PROFILE(PROFILE_OTHER);
    if (N == 0 || C == 0) return;
    __nv_bfloat16 *out16 = bf16_copy_to_write(out, (size_t)N * C);
    bf16_copies_stale(rstd, (size_t)N * sizeof(float));
    rmsnorm_forward_kernel<<<N, ROW_THREADS>>>(out, out16, rstd, inp, weight, C, eps);
    cudaCheckLaunch();
}

static DeviceScratch partial_buf;

void rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                      const float *weight, const float *rstd, int N, int C) {
    PROFILE(PROFILE_OTHER);
    if (N == 0 || C == 0) return;
    bf16_copies_stale(dinp, (size_t)N * C * sizeof(float));
    bf16_copies_stale(dweight, (size_t)C * sizeof(float));
    int P = (int)blocks_for(N, RMS_ROWS);
    float *partial = (float *)device_scratch(&partial_buf, (size_t)P * C * sizeof(float));
    // a block may use 48 KiB of shared memory in all (block_reduce's few words included) unless
    // its kernel asks for more: C > 12032 asks
    static size_t smem_granted = 47 * 1024;
    size_t smem = (size_t)C * sizeof(float);
    if (smem > smem_granted) {
        cudaCheck(cudaFuncSetAttribute(rmsnorm_backward_kernel,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        smem_granted = smem;
    }
    rmsnorm_backward_kernel<<<P, ROW_THREADS, smem>>>(dinp, partial, dout, inp, weight, rstd, N, C);
    cudaCheckLaunch();
    dim3 threads(DW_COLS, DW_ROWS);
    rmsnorm_dweight_kernel<<<blocks_for(C, DW_COLS), threads>>>(dweight, partial, P, C);
    cudaCheckLaunch();
}
