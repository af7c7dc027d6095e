// Deterministic, layout-free init on the GPU: the same counter-based generator as
// backend/cpu/init.c (splitmix64's mixer over (seed, tensor name, element index)), one thread per
// element, so each rank creates its shard directly on its device with the CPU build's bits.
// Uniform and constant values are exact integer and double arithmetic, bit-identical by
// construction. Normal values go through log and cos in double, where CUDA's libm (1-2 ulp) and
// glibc's may differ in the last double bit; after rounding to float that shows up only when a
// value sits within a few double ulps of a float rounding boundary (~1e-8 of the elements).
// tests/gpu/test_kernels_vs_cpu.c counts such elements.
#include "backend/cuda/common.h"
#include <math.h>

#define GOLDEN 0x9E3779B97F4A7C15ull // splitmix64's increment: 2^64 / golden ratio

// splitmix64's finaliser (Steele et al.): a bijection of 64-bit words that mixes every bit
__host__ __device__ static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// the counter-th draw of the stream `key`, uniform in [0, 1) with 53 random bits
__device__ static double uniform01(uint64_t key, uint64_t counter) {
    return (double)(mix64(key + (counter + 1) * GOLDEN) >> 11) * 0x1.0p-53;
}

// element `index` of the tensor: draws 2*index and 2*index + 1 of the tensor's stream
__device__ static float init_value(uint64_t key, uint64_t index, int kind, float bound) {
    if (kind == 2) return bound;
    double u1 = uniform01(key, 2 * index);
    if (kind == 0) return (float)((2.0 * u1 - 1.0) * bound);
    // Box-Muller; 1 - u1 is in (0, 1], so the log is finite
    double u2 = uniform01(key, 2 * index + 1);
    double z = sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2);
    return (float)(z * bound);
}

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
    if (n == 0) return;
    // one stream per (seed, tensor): mixing twice keeps seed s, name n apart from seed n, name s
    uint64_t key = mix64(mix64(seed) ^ name_hash);
    init_kernel<<<blocks_for(n, 256), 256>>>(out, key, kind, bound, rows, cols, row0, col0,
                                             global_cols);
    cudaCheckLaunch();
}
