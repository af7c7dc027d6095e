// Device memory on the CPU: the device is the host, so allocations are aligned host memory and
// every copy is a memcpy. The peak FLOP/s for MFU is measured, not looked up in a table.
#include "backend/backend.h"
#include "utils.h"
#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#define ALIGN 64 // one cache line, and a whole AVX-512 vector

void backend_init(int local_rank) {
    (void)local_rank;
}

// The CPU computes in fp32 only; config_validate already refuses "bfloat16" in this build.
void backend_set_dtype(const char *dtype) {
    if (strcmp(dtype, "float32") != 0)
        FAIL("the CPU build computes in float32", "backend_set_dtype(\"%s\")", dtype);
}

void *device_malloc(size_t bytes) {
    // aligned_alloc wants a multiple of the alignment
    size_t padded = (bytes + ALIGN - 1) / ALIGN * ALIGN;
    if (padded == 0) padded = ALIGN;
    void *ptr = aligned_alloc(ALIGN, padded);
    if (!ptr)
        FAIL("the model or batch is too large for this machine's memory",
             "out of memory allocating %zu bytes", bytes);
    memset(ptr, 0, padded);
    return ptr;
}

void device_free(void *ptr) {
    free(ptr);
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

// A CPU has no datasheet number we could trust across machines, so the peak is the best
// single-precision GEMM rate this process reaches with the threads BLIS gives it: MFU then
// says how close training gets to the fastest kernel this CPU runs. PICOTRON_PEAK_FLOPS
// overrides it (e.g. to compare with a vendor figure).
double device_peak_flops(void) {
    static double peak = 0.0;
    if (peak > 0.0) return peak;
    const char *env = getenv("PICOTRON_PEAK_FLOPS");
    if (env && env[0]) {
        char *end;
        double value = strtod(env, &end);
        if (*end != '\0' || !(value > 0.0))
            user_error("PICOTRON_PEAK_FLOPS = '%s' is not a positive number of FLOP/s "
                       "(e.g. 1e12), unset it to measure the CPU instead",
                       env);
        peak = value;
        return peak;
    }
    const int n = 512;
    float *a = xmalloc((size_t)n * n * sizeof(float));
    float *b = xmalloc((size_t)n * n * sizeof(float));
    float *c = xmalloc((size_t)n * n * sizeof(float));
    for (size_t i = 0; i < (size_t)n * n; i++) {
        a[i] = (float)(i % 7) * 0.1f;
        b[i] = (float)(i % 5) * 0.1f;
    }
    double best = 1e30;
    for (int rep = 0; rep < 10; rep++) { // the first run warms caches and BLIS's threads
        double t0 = now_seconds();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c,
                    n);
        double dt = now_seconds() - t0;
        if (dt < best) best = dt;
    }
    free(a);
    free(b);
    free(c);
    peak = 2.0 * n * n * n / best;
    return peak;
}
