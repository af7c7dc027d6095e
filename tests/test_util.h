// Helpers of the test programs: random inputs, host <-> device copies, and the comparison they
// all make (the error relative to the reference's largest element).
// Header-only: every function is static inline, so a test that uses a few draws no unused warning.
#pragma once
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include "backend/backend.h"
#include "utils.h"

// CHECK(cond, fmt, ...): a FAIL line naming the file and line when cond is false, counted in
// failures for the exit status
static int failures __attribute__((unused)) = 0;
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                            \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

// The state of uniform(): mpi_test_init seeds it, with the same seed on every rank, so that every
// rank draws the same inputs.
static uint64_t rng_state;

static inline float uniform(void) { // [-1, 1), a 64-bit LCG
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(rng_state >> 40) / (float)(1 << 23) - 1.0f;
}

static inline float *random_host(size_t n) {
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = uniform();
    return x;
}

static inline void *to_device(const void *host, size_t bytes) {
    void *d = device_malloc(bytes);
    host_to_device(d, host, bytes);
    return d;
}

static inline float *to_host(const float *dev, size_t n) {
    float *h = xmalloc(n * sizeof(float));
    device_to_host(h, dev, n * sizeof(float));
    return h;
}

// max |got - want| / max |want|; a NaN anywhere makes it infinite, so it fails every tolerance
static inline double rel_to_max(const float *got, const float *want, size_t n) {
    double diff = 0, ref = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        diff = isnan(d) ? INFINITY : fmax(diff, d);
        ref = fmax(ref, fabs((double)want[i]));
    }
    return ref > 0 ? diff / ref : diff;
}

// rel_to_max of a device tensor against host values, the worst over every rank of the job
static inline double rel_to_max_all_ranks(const float *got_dev, const float *want, size_t n) {
    float *got = to_host(got_dev, n);
    double rel = rel_to_max(got, want, n), worst;
    mpiCheck(MPI_Allreduce(&rel, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    free(got);
    return worst;
}

// The start of an MPI test program: MPI, the backend on device 0, and uniform() seeded with seed.
// Returns the world size.
static inline int mpi_test_init(int *argc, char ***argv, uint64_t seed) {
    mpiCheck(MPI_Init(argc, argv));
    backend_init(0);
    rng_state = seed;
    int world;
    mpiCheck(MPI_Comm_size(MPI_COMM_WORLD, &world));
    return world;
}
