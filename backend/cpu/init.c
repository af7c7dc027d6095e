// Deterministic, layout-free init: a counter-based generator (the idea of Salmon et al.'s
// Philox, with the simpler splitmix64 mixer) turns (seed, tensor name, element index) into a
// number, so any rank can create any block of a tensor and get the bits the whole tensor has.
#include "backend/backend.h"
#include <math.h>

#define GOLDEN 0x9E3779B97F4A7C15ull // splitmix64's increment: 2^64 / golden ratio

// splitmix64's finaliser (Steele et al.): a bijection of 64-bit words that mixes every bit
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// the counter-th draw of the stream `key`, uniform in [0, 1) with 53 random bits
static double uniform01(uint64_t key, uint64_t counter) {
    return (double)(mix64(key + (counter + 1) * GOLDEN) >> 11) * 0x1.0p-53;
}

// element `index` of the tensor: draws 2*index and 2*index + 1 of the tensor's stream
static float init_value(uint64_t key, uint64_t index, int kind, float bound) {
    if (kind == 2) return bound;
    double u1 = uniform01(key, 2 * index);
    if (kind == 0) return (float)((2.0 * u1 - 1.0) * bound);
    // Box-Muller; 1 - u1 is in (0, 1], so the log is finite
    double u2 = uniform01(key, 2 * index + 1);
    double z = sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2);
    return (float)(z * bound);
}

// out (rows, cols) = the block [row0, row0+rows) x [col0, col0+cols) of a (.., global_cols)
// tensor; kind 0: uniform(-bound, bound), 1: normal(0, bound), 2: the constant bound
void init_tensor(float *out, uint64_t seed, uint64_t name_hash, int kind, float bound, int rows,
                 int cols, int row0, int col0, int global_cols) {
    // one stream per (seed, tensor): mixing twice keeps seed s, name n apart from seed n, name s
    uint64_t key = mix64(mix64(seed) ^ name_hash);
#pragma omp parallel for
    for (int r = 0; r < rows; r++) {
        for (int c = 0; c < cols; c++) {
            uint64_t index = (uint64_t)(row0 + r) * (uint64_t)global_cols + (uint64_t)(col0 + c);
            out[(size_t)r * cols + c] = init_value(key, index, kind, bound);
        }
    }
}
