// A CPU kernel's scratch, kept from call to call and grown when a larger call comes: allocating
// it per call had the kernel clear fresh pages for every layer of every step. Grown outside the
// kernels' threads, so a failing malloc can end the job.
#pragma once
#include "utils.h"
#include <stdlib.h>

typedef struct {
    float *ptr;
    size_t n;
} Scratch;

static inline float *scratch_floats(Scratch *s, size_t n) {
    if (n > s->n) {
        free(s->ptr);
        s->ptr = xmalloc(n * sizeof(float));
        s->n = n;
    }
    return s->ptr;
}
