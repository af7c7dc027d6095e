// A linear layer without bias through CBLAS (BLIS), weight stored as torch stores it (OC, C).
#include "backend/backend.h"
#include <cblas.h>

// out (N, OC) = inp (N, C) @ weight (OC, C)^T
void matmul_forward(float *out, const float *inp, const float *weight, int N, int C, int OC) {
    if (N == 0 || OC == 0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C,
                0.0f, out, OC);
}

// beta = 1 makes both products accumulate, as every backward does
void matmul_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                     const float *weight, int N, int C, int OC) {
    if (N == 0 || C == 0 || OC == 0) return;
    // forward: out = inp @ weight^T  =>  dinp (N, C) += dout (N, OC) @ weight (OC, C)
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight,
                    C, 1.0f, dinp, C);
    // forward: out = inp @ weight^T  =>  dweight (OC, C) += dout^T (OC, N) @ inp (N, C)
    if (dweight)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C,
                    1.0f, dweight, C);
}
