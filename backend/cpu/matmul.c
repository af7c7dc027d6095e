// A linear layer without bias, weight stored as torch stores it (OC, C), through gemm.c's
// product. The threads split each product, the rows of C or its columns, and every one runs the
// product on its share, with its own packed panels: no thread waits for another inside a
// product. (BLIS's own threads meet at barriers inside every product and spin there; with
// anything else on a core, another rank or another program, a 2-thread product of our shapes
// measured 2 to 20x slower than one thread.) Every element sums its products in the same order
// wherever it sits: the same bits as one thread.
#include "backend/backend.h"
#include "backend/kernel_time.h"
#include "backend/cpu/gemm.h"
#include <omp.h>
#include <string.h>

#define MIN_SPLIT 56 // fewer rows or columns than this run on one thread

// thread t's share [*i0, *i1) of n, in whole units, as even as they can be: the slowest thread
// sets the product's time, and a ragged micro-tile costs a whole one
static void share(int *i0, int *i1, int t, int threads, int n, int unit) {
    long units = (n + unit - 1) / unit;
    *i0 = (int)(units * t / threads) * unit;
    *i1 = (int)(units * (t + 1) / threads) * unit;
    if (*i1 > n) *i1 = n;
}

// C (M, N) = alpha * op(A) (M, K) @ op(B) (K, N) + beta * C, row-major, one share per thread.
// Each thread packs the panels it reads: every one all of B in a split of the rows, its own
// columns of B in a split of the columns (and then every one all of A, where A is transposed
// and must be packed). The split that packs less.
static void gemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                 int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    double pack_rows = (double)threads * K * N + (trans_a ? (double)M * K : 0.0);
    double pack_cols = (double)K * N + (trans_a ? (double)threads * M * K : 0.0);
    int by_cols = N >= MIN_SPLIT && pack_cols < pack_rows;
    if (threads == 1 || (M < MIN_SPLIT && !by_cols)) {
        sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    sgemm_reserve(threads);
#pragma omp parallel for
    for (int t = 0; t < threads; t++) {
        int i0, i1;
        if (by_cols) { // columns [i0, i1) of op(B) and C
            share(&i0, &i1, t, threads, N, SGEMM_NR);
            const float *B_cols = trans_b ? B + (size_t)i0 * ldb : B + i0;
            if (i1 > i0)
                sgemm(trans_a, trans_b, M, i1 - i0, K, alpha, A, lda, B_cols, ldb, beta, C + i0,
                      ldc);
        } else { // rows [i0, i1) of op(A) and C: rows of A, or columns where A is transposed
            share(&i0, &i1, t, threads, M, SGEMM_MR);
            const float *A_rows = trans_a ? A + i0 : A + (size_t)i0 * lda;
            if (i1 > i0)
                sgemm(trans_a, trans_b, i1 - i0, N, K, alpha, A_rows, lda, B, ldb, beta,
                      C + (size_t)i0 * ldc, ldc);
        }
    }
}

// out (N, OC) = inp (N, C) @ weight (OC, C)^T
void matmul_forward(float *out, const float *inp, const float *weight, int N, int C, int OC) {
    KERNEL_TIME(KT_GEMM, 2.0 * N * C * OC, 0);
    if (N == 0 || OC == 0) return;
    gemm(0, 1, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC);
}

// dinp_beta 1 adds into dinp (matmul_backward), 0 writes it (matmul_backward_write); dweight
// always adds (beta = 1)
static void backward(float *dinp, float *dweight, const float *dout, const float *inp,
                     const float *weight, int N, int C, int OC, float dinp_beta) {
    KERNEL_TIME(KT_GEMM, 2.0 * N * C * OC * ((dinp != NULL) + (dweight != NULL)), 0);
    if (N == 0 || C == 0) return;
    if (OC == 0) { // an empty sum: dinp is 0 (written) or unchanged
        if (dinp && dinp_beta == 0.0f) memset(dinp, 0, (size_t)N * C * sizeof(float));
        return;
    }
    // forward: out = inp @ weight^T  =>  dinp (N, C) += dout (N, OC) @ weight (OC, C)
    if (dinp) gemm(0, 0, N, C, OC, 1.0f, dout, OC, weight, C, dinp_beta, dinp, C);
    // forward: out = inp @ weight^T  =>  dweight (OC, C) += dout^T (OC, N) @ inp (N, C)
    if (dweight) gemm(1, 0, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
}

void matmul_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                     const float *weight, int N, int C, int OC) {
    backward(dinp, dweight, dout, inp, weight, N, C, OC, 1.0f);
}

void matmul_backward_write(float *dinp, float *dweight, const float *dout, const float *inp,
                           const float *weight, int N, int C, int OC) {
    backward(dinp, dweight, dout, inp, weight, N, C, OC, 0.0f);
}
