// The checks a layer's test makes (tests/test_moe.c, tests/test_mamba*.c): one line per claim, a
// gradient against central finite differences of a scalar loss, and a tensor against a record of a
// transformers fixture. Header-only, for test programs: every function is static inline, so a test
// that uses a few draws no unused warning.
#pragma once
#include <stdio.h>
#include "tests/fixture.h"
#include "tests/test_util.h"

static int failures; // the claims that failed; main returns failures ? 1 : 0

// err <= tol, printed with the claim; a NaN fails
static inline void check(const char *what, double err, double tol) {
    int ok = err <= tol;
    printf("  %-4s %-62s %.2e (tol %.0e)\n", ok ? "ok" : "FAIL", what, err, tol);
    if (!ok) failures++;
}

static inline float *device_zeros(size_t n) {
    return device_malloc(n * sizeof(float));
} // device_malloc zeroes

// sum(dev * R) in double: the loss a test's upstream gradient R defines
static inline double dot_host(const float *dev, const float *R, size_t n) {
    float *h = to_host(dev, n);
    double L = 0.0;
    for (size_t i = 0; i < n; i++) L += (double)h[i] * R[i];
    free(h);
    return L;
}

// central differences of loss(ctx) with steps of +-eps over every element of the device tensor x
// (n), against the device gradient grad: max |fd - grad| / max |grad|
static inline double fd_err(float eps, double (*loss)(void *), void *ctx, float *x,
                            const float *grad, size_t n) {
    float *h = to_host(x, n), *fd = xmalloc(n * sizeof(float)), *g = to_host(grad, n);
    for (size_t i = 0; i < n; i++) {
        float x0 = h[i], hi = x0 + eps, lo = x0 - eps;
        host_to_device(x + i, &hi, sizeof hi);
        double Lhi = loss(ctx);
        host_to_device(x + i, &lo, sizeof lo);
        double Llo = loss(ctx);
        host_to_device(x + i, &x0, sizeof x0);
        fd[i] = (float)((Lhi - Llo) / ((double)hi - lo)); // the step float really took
    }
    loss(ctx); // leave the saved tensors as the unperturbed inputs give them
    double err = rel_to_max(fd, g, n);
    free(h), free(fd), free(g);
    return err;
}

// a fixture record that must hold count values; script: the one that writes the fixture
static inline const float *fixture_values(const Fixture *fx, const char *name, size_t count,
                                          const char *script) {
    const FixtureRecord *r = fixture_find(fx, name);
    if (r->count != count)
        FAIL("regenerate the fixture with its script (tests/reference/README.md)",
             "fixture record %s holds %zu values, the layer wants %zu (%s writes it)", name,
             r->count, count, script);
    return r->data;
}

// the device tensor dev (n) against fixture record name, within tol of its largest value
static inline void check_vs_fixture(const char *what, const float *dev, const Fixture *fx,
                                    const char *name, size_t n, const char *script, double tol) {
    float *got = to_host(dev, n);
    char line[256];
    snprintf(line, sizeof line, "%s vs transformers (%s)", what, name);
    check(line, rel_to_max(got, fixture_values(fx, name, n, script), n), tol);
    free(got);
}
