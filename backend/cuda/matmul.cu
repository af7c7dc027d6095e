// The linear layer's products through cuBLAS, in fp32 (CUBLAS_COMPUTE_32F: no TF32).
// cuBLAS is column-major; a row-major (R, K) matrix is the column-major (K, R) one, its
// transpose. So each row-major product below is written as the product of the transposes:
//   out = inp @ W^T        (row-major)  <=>  out^T  = W @ inp^T          (column-major)
//   dinp += dout @ W       (row-major)  <=>  dinp^T += W^T @ dout^T      (column-major)
//   dW += dout^T @ inp     (row-major)  <=>  dW^T   += inp^T @ dout      (column-major)
// where, column-major, W is (C, OC) with ld C, inp^T is (C, N) with ld C, dout^T is (OC, N).
#include "backend/cuda/common.h"

static void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float *a,
                 int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    const float alpha = 1.0f;
    if (!device_selected)
        FAIL("call backend_init(local_rank) first", "a GEMM before the GPU was selected");
    cublasCheck(cublasGemmEx(cublas_handle, ta, tb, m, n, k, &alpha, a, CUDA_R_32F, lda, b,
                             CUDA_R_32F, ldb, &beta, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                             CUBLAS_GEMM_DEFAULT));
}

// out (N, OC) = inp (N, C) @ weight (OC, C)^T
void matmul_forward(float *out, const float *inp, const float *weight, int N, int C, int OC) {
    if (N == 0 || OC == 0) return;
    if (C == 0) {
        device_zero(out, (size_t)N * OC * sizeof(float));
        return;
    }
    // column-major: out^T (OC, N) = W^T-as-stored (OC x C, op T of the (C, OC) buffer) @ inp^T
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, weight, C, inp, C, 0.0f, out, OC);
}

// dinp (N, C) += dout (N, OC) @ weight (OC, C); dweight (OC, C) += dout^T @ inp
void matmul_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                     const float *weight, int N, int C, int OC) {
    if (N == 0 || C == 0 || OC == 0) return;
    // column-major: dinp^T (C, N) += W (C, OC) @ dout^T (OC, N)
    if (dinp) gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, weight, C, dout, OC, 1.0f, dinp, C);
    // column-major: dW^T (C, OC) += inp^T (C, N) @ (dout^T)^T (N, OC)
    if (dweight) gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, inp, C, dout, OC, 1.0f, dweight, C);
}
