// Where a Mamba mixer's time goes on the CPU: one layer's mixer forward and backward (mamba.c)
// against the selective scan's forward and backward alone (backend/cpu/mamba.c), at a shape,
// timed over ITERS after a warm-up; the scan's share of the mixer is their ratio.
// usage: build/bench/bench_mamba B T C I S R W [iters]   (bench/bench_mamba.sh runs two shapes)
#include <stdio.h>
#include <stdlib.h>
#include "backend/backend.h"
#include "mamba.h"
#include "utils.h"

static float *random_device(size_t n, float scale, unsigned *seed) {
    float *host = xmalloc(n * sizeof(float)), *dev = device_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) host[i] = scale * ((float)rand_r(seed) / RAND_MAX - 0.5f);
    host_to_device(dev, host, n * sizeof(float));
    free(host);
    return dev;
}

int main(int argc, char **argv) {
    if (argc < 8) {
        fprintf(stderr, "usage: %s B T C I S R W [iters]\n", argv[0]);
        return 2;
    }
    int d[7];
    for (int i = 0; i < 7; i++) d[i] = atoi(argv[i + 1]);
    int iters = argc > 8 ? atoi(argv[8]) : 10;
    MambaSizes s = mamba_sizes(d[0], d[1], d[2], d[3], d[4], d[5], d[6]);
    unsigned seed = 1;
    size_t sizes[MAMBA_TENSORS];
    mamba_tensor_sizes(sizes, &s);
    float *t[MAMBA_TENSORS], *dt[MAMBA_TENSORS];
    for (int i = 0; i < MAMBA_TENSORS; i++) {
        t[i] = random_device(sizes[i], 0.2f, &seed);
        dt[i] = device_malloc(sizes[i] * sizeof(float));
    }
    MambaWeights w = mamba_weights_point(t), dw = mamba_weights_point(dt);
    size_t NC = (size_t)s.N * s.C;
    float *x = random_device(NC, 1.0f, &seed), *dy = random_device(NC, 1.0f, &seed);
    float *y = device_malloc(NC * sizeof(float)), *dx = device_malloc(NC * sizeof(float));
    MambaActivations a;
    MambaGrads g;
    mamba_activations_alloc(&a, &s);
    mamba_grads_alloc(&g, &s);
    double mixer = 0, scan = 0;
    for (int it = -2; it < iters; it++) { // two warm-up rounds
        double t0 = now_seconds();
        mamba_forward(y, &a, x, &w, &s);
        mamba_backward(dx, &dw, &g, dy, &a, x, &w, &s);
        device_synchronize();
        double t1 = now_seconds();
        selective_scan_forward(a.y, a.u, a.dt, w.dt_proj_bias, w.A_log, a.Bm, a.Cm, w.D, s.B, s.T,
                               s.I, s.S);
        selective_scan_backward(g.du, g.ddt, g.dBm, g.dCm, dw.dt_proj_bias, dw.A_log, dw.D, dy, a.u,
                                a.dt, w.dt_proj_bias, w.A_log, a.Bm, a.Cm, w.D, s.B, s.T, s.I, s.S);
        device_synchronize();
        if (it >= 0) mixer += t1 - t0, scan += now_seconds() - t1;
    }
    printf("mixer B %d T %d C %d I %d S %d R %d W %d: forward + backward %.2f ms, the selective "
           "scan's forward + backward %.2f ms: %.0f%% of the mixer\n",
           s.B, s.T, s.C, s.I, s.S, s.R, s.W, 1e3 * mixer / iters, 1e3 * scan / iters,
           100 * scan / mixer);
    mamba_activations_free(&a);
    mamba_grads_free(&g);
    for (int i = 0; i < MAMBA_TENSORS; i++) device_free(t[i]), device_free(dt[i]);
    device_free(x), device_free(dy), device_free(y), device_free(dx);
    return 0;
}
