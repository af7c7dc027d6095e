// The benchmarks' operands: n floats in [-1, 1], a fixed pattern (Knuth's multiplicative hash),
// so that every run times the same numbers.
#pragma once
#include "utils.h"
#include <stddef.h>

static inline float *filled(size_t n) {
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    return x;
}
