// A linear layer without bias through CBLAS (BLIS), weight stored as torch stores it (OC, C).
#include "backend/backend.h"
#include <cblas.h>
#include <stdlib.h>

// BLIS picks its AVX-512 kernels only when it can count the CPU's FMA units, which virtual
// machines hide; it then falls back to its AVX2 ones at half the speed (measured here: 62 vs
// 140 GFLOP/s a core). An AVX-512 CPU runs the skx kernels correctly whatever that count, so
// choose them before BLIS's first call reads the variable. A user's own BLIS_ARCH_TYPE wins.
__attribute__((constructor)) static void choose_blis_kernels(void) {
    if (__builtin_cpu_supports("avx512f")) setenv("BLIS_ARCH_TYPE", "skx", 0);
}

// out (N, OC) = inp (N, C) @ weight (OC, C)^T
void matmul_forward(float *out, const float *inp, const float *weight, int N, int C, int OC) {
    if (N == 0 || OC == 0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, 0.0f,
                out, OC);
}

// beta = 1 makes both products accumulate, as every backward does
void matmul_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                     const float *weight, int N, int C, int OC) {
    if (N == 0 || C == 0 || OC == 0) return;
    // forward: out = inp @ weight^T  =>  dinp (N, C) += dout (N, OC) @ weight (OC, C)
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C,
                    1.0f, dinp, C);
    // forward: out = inp @ weight^T  =>  dweight (OC, C) += dout^T (OC, N) @ inp (N, C)
    if (dweight)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f,
                    dweight, C);
}
