// Deterministic, layout-free init on the GPU: the same counter-based generator as
// backend/cpu/init.c (splitmix64's mixer over (seed, tensor name, element index)), one thread per
// element, so each rank creates its shard directly on its device with the CPU build's bits.
// Uniform and constant values are exact integer and double arithmetic, bit-identical by
// construction. Normal values go through log and cos in double, where CUDA's libm (1-2 ulp) and
// glibc's may differ in the last double bit; after rounding to float that shows up only when a
// value sits within a few double ulps of a float rounding boundary (~1e-8 of the elements).
// tests/gpu/test_kernels_vs_cpu.c counts such elements.
#include "backend/cuda/common.h"
#include "backend/init_value.h"

__global__ static void init_kernel(float *out, uint64_t key, int kind, float bound, int rows,
                                   int cols, int row0, int col0, int global_cols) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * cols) return;
    int r = (int)(i / cols), c = (int)(i % cols);
    uint64_t index = (uint64_t)(row0 + r) * (uint64_t)global_cols + (uint64_t)(col0 + c);
    out[i] = init_value(key, index, kind, bound);
}

// out (rows, cols) = the block [row0, row0+rows) x [col0, col0+cols) of a (.., global_cols)
// tensor; kind 0: uniform(-bound, bound), 1: normal(0, bound), 2: the constant bound
void init_tensor(float *out, uint64_t seed, uint64_t name_hash, int kind, float bound, int rows,
                 int cols, int row0, int col0, int global_cols) {
    PROFILE(PROFILE_OTHER);
    size_t n = (size_t)rows * cols;
    bf16_copies_stale(out, n * sizeof(float));
    if (n == 0) return;
    // one stream per (seed, tensor): mixing twice keeps seed s, name n apart from seed n, name s
    uint64_t key = mix64(mix64(seed) ^ name_hash);
    init_kernel<<<blocks_for(n, 256), 256>>>(out, key, kind, bound, rows, cols, row0, col0,
                                             global_cols);
    cudaCheckLaunch();
}
