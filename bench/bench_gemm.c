// The CPU's matrix products at a model's shapes, against the ceiling and against BLIS: each linear
// layer's forward (out = inp @ W^T), input gradient (dinp = dout @ W) and weight gradient
// (dW += dout^T @ inp) through backend/cpu/gemm.c as matmul.c runs them (the rows or the columns
// split among the threads, whichever packs less), beside BLIS's SGEMM on a split of the rows,
// each as GFLOP/s and as a share of the FMA peak of the cores used (memory.c's measurement).
// Best of REPS runs of each product.
// usage: build/bench/bench_gemm tokens hidden intermediate kv_features vocab [reps]
//        (bench/bench_gemm.sh runs the large model of bench_vs_pytorch.sh at 1 and 2 threads)
#include "backend/backend.h"
#include "backend/cpu/gemm.h"
#include "bench/filled.h"
#include "utils.h"
#include <blis.h> // BLIS, the reference
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    const char *name;
    int out, in; // the weight's (OC, C)
} Layer;

// the reference: BLIS's SGEMM, single-threaded on each thread's rows, as matmul.c split them
// before gemm.c (BLIS's own threads spin at their barriers)
static void blis_rows(int trans_a, int trans_b, int M, int N, int K, const float *A, int lda,
                      const float *B, int ldb, float beta, float *C, int ldc) {
    int threads = omp_get_max_threads(), share = (M + threads - 1) / threads;
#pragma omp parallel for
    for (int t = 0; t < threads; t++) {
        int m0 = t * share, m = M - m0 < share ? M - m0 : share;
        if (m > 0)
            cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                        trans_b ? CblasTrans : CblasNoTrans, m, N, K, 1.0f,
                        trans_a ? A + m0 : A + (size_t)m0 * lda, lda, B, ldb, beta,
                        C + (size_t)m0 * ldc, ldc);
    }
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: %s tokens hidden intermediate kv_features vocab [reps]\n",
                argv[0]);
        return 2;
    }
    int N = atoi(argv[1]), C = atoi(argv[2]), I = atoi(argv[3]), KV = atoi(argv[4]);
    int V = atoi(argv[5]), reps = argc > 6 ? atoi(argv[6]) : 5;
    // BLIS's AVX-512 kernels on an AVX-512 CPU, as the backend chose them before gemm.c (BLIS
    // counts FMA units to decide, which virtual machines hide); 0 is skx in BLIS 0.9's list
    if (__builtin_cpu_supports("avx512f")) setenv("BLIS_ARCH_TYPE", "0", 0);
    setenv("BLIS_NUM_THREADS", "1", 1);
    bli_init(); // reads the two variables; bli_arch_query_id needs it
    double peak = device_peak_flops(1);
    printf("%d thread(s), FMA peak %.1f GFLOP/s; %d tokens; gemm.c tiles %dx%d; BLIS %s kernels\n",
           omp_get_max_threads(), peak * 1e-9, N, SGEMM_MR, SGEMM_NR,
           bli_arch_string(bli_arch_query_id()));
    Layer layers[] = {{"q_proj, o_proj", C, C},     {"k_proj, v_proj", KV, C},
                      {"gate_proj, up_proj", I, C}, {"down_proj", C, I},
                      {"lm_head", V, C}};
    printf("%-30s %-8s %12s %9s %12s %9s %9s\n", "layer (OC x C)", "product", "gemm.c GF/s",
           "of peak", "BLIS GF/s", "of peak", "ratio");
    double total[2] = {0, 0}, flops_all = 0;
    for (size_t l = 0; l < sizeof layers / sizeof layers[0]; l++) {
        int OC = layers[l].out, IC = layers[l].in;
        float *x = filled((size_t)N * IC), *w = filled((size_t)OC * IC);
        float *y = filled((size_t)N * OC), *dx = filled((size_t)N * IC);
        float *dw = filled((size_t)OC * IC);
        const char *names[3] = {"forward", "dinp", "dweight"};
        for (int p = 0; p < 3; p++) {
            double best[2] = {1e30, 1e30}, flops = 2.0 * N * IC * OC;
            for (int rep = 0; rep < reps; rep++)
                for (int lib = 0; lib < 2; lib++) {
                    double t0 = now_seconds();
                    if (lib == 0 && p == 0) matmul_forward(y, x, w, N, IC, OC);
                    if (lib == 0 && p == 1) matmul_backward_write(dx, NULL, y, x, w, N, IC, OC);
                    if (lib == 0 && p == 2) matmul_backward(NULL, dw, y, x, w, N, IC, OC);
                    if (lib == 1 && p == 0) blis_rows(0, 1, N, OC, IC, x, IC, w, IC, 0, y, OC);
                    if (lib == 1 && p == 1) blis_rows(0, 0, N, IC, OC, y, OC, w, IC, 0, dx, IC);
                    if (lib == 1 && p == 2) blis_rows(1, 0, OC, IC, N, y, OC, x, IC, 1, dw, IC);
                    best[lib] = fmin(best[lib], now_seconds() - t0);
                }
            total[0] += best[0], total[1] += best[1], flops_all += flops;
            char shape[32];
            snprintf(shape, sizeof shape, "%s (%dx%d)", layers[l].name, OC, IC);
            printf("%-30s %-8s %12.1f %8.1f%% %12.1f %8.1f%% %9.2f\n", p == 0 ? shape : "",
                   names[p], flops / best[0] * 1e-9, 100 * flops / best[0] / peak,
                   flops / best[1] * 1e-9, 100 * flops / best[1] / peak, best[1] / best[0]);
        }
        free(x), free(w), free(y), free(dx), free(dw);
    }
    printf("%-39s %12.1f %8.1f%% %12.1f %8.1f%% %9.2f\n", "all (one of each product)",
           flops_all / total[0] * 1e-9, 100 * flops_all / total[0] / peak,
           flops_all / total[1] * 1e-9, 100 * flops_all / total[1] / peak, total[1] / total[0]);
    return 0;
}
