// The CPU's causal attention at a model's shapes, against the ceiling: attention_forward_block
// and attention_backward_block (with its delta) over one block of the whole sequence, as plain
// attention runs them, each as GFLOP/s of the (query, key) pairs the mask keeps and as a share of
// the FMA peak of the cores used (memory.c's measurement). The FLOPs are the kernel timing's
// (kernel_time.c): 4 D a kept pair forward, 8 D backward. Best of REPS runs of each.
// usage: build/bench/bench_attention batch seq heads kv_heads head_dim [reps]
//        (bench/bench_attention.sh runs the large model of bench_vs_pytorch.sh at 1 and 2 threads)
#include "backend/backend.h"
#include "bench/filled.h"
#include "utils.h"
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: %s batch seq heads kv_heads head_dim [reps]\n", argv[0]);
        return 2;
    }
    int B = atoi(argv[1]), T = atoi(argv[2]), H = atoi(argv[3]), KV = atoi(argv[4]);
    int D = atoi(argv[5]), reps = argc > 6 ? atoi(argv[6]) : 5;
    if (B < 1 || T < 1 || H < 1 || KV < 1 || D < 1 || H % KV || reps < 1) {
        fprintf(stderr, "%s: sizes must be positive and heads a multiple of kv_heads\n", argv[0]);
        return 2;
    }
    size_t q_n = (size_t)B * T * H * D, kv_n = (size_t)B * T * KV * D, lse_n = (size_t)B * H * T;
    float *q = filled(q_n), *k = filled(kv_n), *v = filled(kv_n), *dout = filled(q_n);
    float *out = xmalloc(q_n * sizeof(float)), *lse = xmalloc(lse_n * sizeof(float));
    float *delta = xmalloc(lse_n * sizeof(float)), *dq = filled(q_n);
    float *dk = filled(kv_n), *dv = filled(kv_n);
    int *pos = xmalloc(T * sizeof(int));
    for (int t = 0; t < T; t++) pos[t] = t;
    double pairs = (double)B * H * T * (T + 1) / 2, peak = device_peak_flops(1);
    double best[2] = {1e30, 1e30}, flops[2] = {4.0 * D * pairs, 8.0 * D * pairs};
    for (int rep = 0; rep < reps; rep++) {
        for (size_t i = 0; i < q_n; i++) out[i] = 0.0f;
        for (size_t i = 0; i < lse_n; i++) lse[i] = -INFINITY;
        double t0 = now_seconds();
        attention_forward_block(out, lse, q, k, v, pos, pos, B, T, T, H, KV, D);
        double t1 = now_seconds();
        attention_backward_delta(delta, dout, out, B, T, H, D);
        attention_backward_block(dq, dk, dv, dout, q, k, v, lse, delta, pos, pos, B, T, T, H, KV,
                                 D);
        double t2 = now_seconds();
        best[0] = fmin(best[0], t1 - t0), best[1] = fmin(best[1], t2 - t1);
    }
    printf("%d thread(s), FMA peak %.1f GFLOP/s; batch %d, seq %d, %d heads, %d kv heads, "
           "head dim %d\n",
           omp_get_max_threads(), peak * 1e-9, B, T, H, KV, D);
    const char *names[2] = {"forward", "backward"};
    for (int p = 0; p < 2; p++)
        printf("  %-9s %9.3f ms %9.1f GFLOP/s %7.1f%% of peak\n", names[p], best[p] * 1e3,
               flops[p] / best[p] * 1e-9, 100 * flops[p] / best[p] / peak);
    double all = best[0] + best[1];
    printf("  %-9s %9.3f ms %9.1f GFLOP/s %7.1f%% of peak\n", "both", all * 1e3,
           (flops[0] + flops[1]) / all * 1e-9, 100 * (flops[0] + flops[1]) / all / peak);
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(delta), free(dq), free(dk);
    free(dv), free(pos);
    return 0;
}
