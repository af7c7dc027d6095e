// Device memory on the CPU: the device is the host, so allocations are aligned host memory and
// every copy is a memcpy. The peak FLOP/s for MFU is measured, not looked up in a table.
#define _GNU_SOURCE // sched_getaffinity
#include "backend/backend.h"
#include "utils.h"
#include <malloc.h>
#include <omp.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#define ALIGN 64 // one cache line, and a whole AVX-512 vector

static size_t allocated, allocated_peak; // device_malloc's own count, in usable bytes

void backend_init(int local_rank) {
    (void)local_rank;
}

// The CPU computes in fp32 only; config_validate already refuses "bfloat16" in this build.
void backend_set_dtype(const char *dtype) {
    if (strcmp(dtype, "float32") != 0)
        FAIL("the CPU build computes in float32", "backend_set_dtype(\"%s\")", dtype);
}

// the CPU multiplies the fp32 tensors themselves: nothing is kept from one step to the next
void backend_step_begin(void) {}

void *device_malloc(size_t bytes) {
    // aligned_alloc wants a multiple of the alignment
    size_t padded = (bytes + ALIGN - 1) / ALIGN * ALIGN;
    if (padded == 0) padded = ALIGN;
    void *ptr = aligned_alloc(ALIGN, padded);
    if (!ptr)
        FAIL("the model or batch is too large for this machine's memory",
             "out of memory allocating %zu bytes", bytes);
    memset(ptr, 0, padded);
    allocated += malloc_usable_size(ptr);
    if (allocated > allocated_peak) allocated_peak = allocated;
    return ptr;
}

void device_free(void *ptr) {
    if (ptr) allocated -= malloc_usable_size(ptr);
    free(ptr);
}

size_t device_allocated_peak(void) {
    return allocated_peak;
}
void device_zero(void *ptr, size_t bytes) {
    memset(ptr, 0, bytes);
}
void device_copy(void *dst, const void *src, size_t bytes) {
    memcpy(dst, src, bytes);
}
void host_to_device(void *dst, const void *src, size_t bytes) {
    memcpy(dst, src, bytes);
}
void device_to_host(void *dst, const void *src, size_t bytes) {
    memcpy(dst, src, bytes);
}
void device_synchronize(void) {}

size_t device_memory_used(void) {
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    return (size_t)usage.ru_maxrss * 1024; // Linux reports kilobytes
}

// One core's peak: independent chains of vector FMAs that never leave the registers, in the widest
// vectors this build uses (AVX-512 under -march=native on such a CPU). No real kernel beats it,
// as no GPU kernel beats the datasheet's dense peak.
#ifdef __AVX512F__
typedef float FloatVector __attribute__((vector_size(64)));
#else // AVX2 and below: a 16-float vector would be split in halves and spill to memory
typedef float FloatVector __attribute__((vector_size(32)));
#endif
#define LANES (int)(sizeof(FloatVector) / sizeof(float))
// optimised and uninstrumented whatever the build (make test-asan builds -O1 with sanitizers,
// which would keep the chains in memory and measure that instead)
__attribute__((optimize("O2"), no_sanitize_address, no_sanitize_undefined)) static double
core_fma_peak(void) {
    FloatVector x, y;
    for (int i = 0; i < LANES; i++) x[i] = 0.999f, y[i] = 1e-3f;
    // 12 independent chains, enough in flight to hide the FMA latency on two ports; each starts
    // elsewhere, or the compiler would see they are equal and compute one
    FloatVector a0 = x * 0.1f, a1 = x * 0.2f, a2 = x * 0.3f, a3 = x * 0.4f, a4 = x * 0.5f,
                a5 = x * 0.6f, a6 = x * 0.7f, a7 = x * 0.8f, a8 = x * 0.9f, a9 = x * 1.1f,
                a10 = x * 1.2f, a11 = x * 1.3f;
    const long iters = 1 << 20;
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_seconds();
        for (long i = 0; i < iters; i++) {
            a0 = a0 * x + y, a1 = a1 * x + y, a2 = a2 * x + y, a3 = a3 * x + y;
            a4 = a4 * x + y, a5 = a5 * x + y, a6 = a6 * x + y, a7 = a7 * x + y;
            a8 = a8 * x + y, a9 = a9 * x + y, a10 = a10 * x + y, a11 = a11 * x + y;
        }
        double dt = now_seconds() - t0;
        if (dt < best) best = dt;
    }
    FloatVector sum = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
    if (sum[0] != sum[0]) FAIL("", "the FMA chains overflowed");
    return 2.0 * LANES * 12 * iters / best;
}

// The peak this rank may count on, so that MFU means what it means on a GPU: the cores its node
// gives the job (one per thread, no more than the node has) shared among the node's ranks. With
// 8 one-thread ranks on 2 cores each rank's peak is a quarter core, and the ranks' peaks add up to
// the 2-core peak. Measured once (train.c measures it while the other ranks wait);
// PICOTRON_PEAK_FLOPS (this rank's share, FLOP/s) overrides it.
double device_peak_flops(int ranks_on_node) {
    static double core = 0.0;
    const char *env = getenv("PICOTRON_PEAK_FLOPS");
    if (env && env[0]) {
        char *end;
        double value = strtod(env, &end);
        if (*end != '\0' || !(value > 0.0))
            user_error("PICOTRON_PEAK_FLOPS = '%s' is not a positive number of FLOP/s "
                       "(e.g. 1e12), unset it to measure the CPU instead",
                       env);
        return value;
    }
    if (core == 0.0) core = core_fma_peak();
    cpu_set_t set;
    int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    int ranks = ranks_on_node > 0 ? ranks_on_node : 1;
    double used = (double)ranks * omp_get_max_threads();
    return core * (used < cores ? used : cores) / ranks;
}
