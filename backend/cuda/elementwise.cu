// Elementwise kernels and the two reductions (gradient norm, loss sum) on the GPU.
#include "backend/cuda/common.h"

__global__ static void fill_kernel(float *x, float value, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] = value;
}

// grid (N rows, column tiles): rows on x, which holds 2^31 - 1 blocks (as cross_entropy_backward)
__global__ static void fill_columns_kernel(float *x, float value, int V, int from) {
    int j = from + blockIdx.y * blockDim.x + threadIdx.x;
    if (j < V) x[(size_t)blockIdx.x * V + j] = value;
}

__global__ static void add_inplace_kernel(float *y, const float *x, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}

__global__ static void scale_inplace_kernel(float *x, float s, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

__global__ static void scale_rows_kernel(float *x, const float *scale, size_t n, int cols) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] *= scale[i / cols];
}

void fill(float *x, float value, size_t n) {
    PROFILE(PROFILE_OTHER);
    bf16_copies_stale(x, n * sizeof(float));
    if (n == 0) return;
    fill_kernel<<<blocks_for(n, 256), 256>>>(x, value, n);
    cudaCheckLaunch();
}

void fill_columns(float *x, float value, int N, int V, int from) {
    PROFILE(PROFILE_OTHER);
    bf16_copies_stale(x, (size_t)N * V * sizeof(float));
    if (N == 0 || from >= V) return;
    dim3 grid(N, blocks_for(V - from, 256));
    fill_columns_kernel<<<grid, 256>>>(x, value, V, from);
    cudaCheckLaunch();
}

void add_inplace(float *y, const float *x, size_t n) {
    PROFILE(PROFILE_OTHER);
    bf16_copies_stale(y, n * sizeof(float));
    if (n == 0) return;
    add_inplace_kernel<<<blocks_for(n, 256), 256>>>(y, x, n);
    cudaCheckLaunch();
}

void scale_inplace(float *x, float s, size_t n) {
    PROFILE(PROFILE_OTHER);
    bf16_copies_stale(x, n * sizeof(float));
    if (n == 0) return;
    scale_inplace_kernel<<<blocks_for(n, 256), 256>>>(x, s, n);
    cudaCheckLaunch();
}

void scale_rows(float *x, const float *scale, int rows, int cols) {
    PROFILE(PROFILE_OTHER);
    size_t n = (size_t)rows * cols;
    bf16_copies_stale(x, n * sizeof(float));
    if (n == 0) return;
    scale_rows_kernel<<<blocks_for(n, 256), 256>>>(x, scale, n, cols);
    cudaCheckLaunch();
}

// The sums are deterministic (fixed grid, fixed tree, no atomics) and accumulate in double: the
// gradient norm sums a whole parameter buffer, where a float accumulator would lose digits.
// Pass 1: each block sums a grid-stride share into partial[blockIdx.x].
// Pass 2: one block adds the partials into out[0].
#define REDUCE_BLOCKS  512
#define REDUCE_THREADS 256

__device__ static double block_sum(double x) {
    __shared__ double warp_sums[REDUCE_THREADS / 32];
    x = warp_sum_double(x);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = x;
    __syncthreads();
    x = threadIdx.x < REDUCE_THREADS / 32 ? warp_sums[threadIdx.x] : 0.0;
    if (threadIdx.x < 32) x = warp_sum_double(x);
    return x; // valid in thread 0
}

__global__ static void sum_partial_kernel(double *partial, const float *x, size_t n, int squares) {
    double acc = 0.0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        double xi = x[i];
        acc += squares ? xi * xi : xi;
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ static void sum_final_kernel(float *out, const double *partial, int num_partial) {
    double acc = 0.0;
    for (int i = threadIdx.x; i < num_partial; i += blockDim.x) acc += partial[i];
    acc = block_sum(acc);
    if (threadIdx.x == 0) out[0] = (float)((double)out[0] + acc);
}

static void sum_any(float *out, const float *x, size_t n, int squares) {
    static double *partial = NULL; // REDUCE_BLOCKS doubles, kept for the whole run
    if (!partial) partial = (double *)device_malloc(REDUCE_BLOCKS * sizeof(double));
    unsigned int blocks = blocks_for(n, REDUCE_THREADS);
    if (blocks > REDUCE_BLOCKS) blocks = REDUCE_BLOCKS;
    bf16_copies_stale(out, sizeof(float));
    sum_partial_kernel<<<blocks, REDUCE_THREADS>>>(partial, x, n, squares);
    cudaCheckLaunch();
    sum_final_kernel<<<1, REDUCE_THREADS>>>(out, partial, (int)blocks);
    cudaCheckLaunch();
}

void sum_squares(float *out, const float *x, size_t n) {
    PROFILE(PROFILE_OTHER);
    sum_any(out, x, n, 1);
}

void sum_reduce(float *out, const float *x, size_t n) {
    PROFILE(PROFILE_OTHER);
    sum_any(out, x, n, 0);
}
