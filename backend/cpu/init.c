// Deterministic, layout-free init on the CPU; the generator is in backend/init_value.h.
#include "backend/backend.h"
#include "backend/init_value.h"

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
