// The value of one element of a freshly initialised tensor, shared by backend/cpu/init.c and
// backend/cuda/init.cu so that both devices compute it from the same source: a counter-based
// generator (the idea of Salmon et al.'s Philox, with the simpler splitmix64 mixer) turns
// (seed, tensor name, element index) into a number, so any rank can create any block of a
// tensor and get the bits the whole tensor has.
#pragma once
#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define HOST_DEVICE __host__ __device__
#else
#define HOST_DEVICE
#endif

#define GOLDEN 0x9E3779B97F4A7C15ull // splitmix64's increment: 2^64 / golden ratio

// splitmix64's finaliser (Steele et al.): a bijection of 64-bit words that mixes every bit
static inline HOST_DEVICE uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// the counter-th draw of the stream `key`, uniform in [0, 1) with 53 random bits
static inline HOST_DEVICE double uniform01(uint64_t key, uint64_t counter) {
    return (double)(mix64(key + (counter + 1) * GOLDEN) >> 11) * 0x1.0p-53;
}

// element `index` of the tensor: draws 2*index and 2*index + 1 of the tensor's stream
static inline HOST_DEVICE float init_value(uint64_t key, uint64_t index, int kind, float bound) {
    if (kind == 2) return bound;
    double u1 = uniform01(key, 2 * index);
    if (kind == 0) return (float)((2.0 * u1 - 1.0) * bound);
    // Box-Muller; 1 - u1 is in (0, 1], so the log is finite
    double u2 = uniform01(key, 2 * index + 1);
    double z = sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2);
    return (float)(z * bound);
}
