// bf16 rounding on the host, for the GPU tests' references: the operands a bf16 product reads.
// Header-only, for test programs: static inline, so a file that does not use it draws no warning.
#pragma once
#include <stdint.h>
#include <string.h>
#include "utils.h"

// a copy of x (n) rounded to bf16, nearest even, as __float2bfloat16_rn (no NaN or inf in x)
static inline float *bf16_rounded(const float *x, size_t n) {
    float *r = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
        memcpy(&r[i], &u, 4);
    }
    return r;
}
