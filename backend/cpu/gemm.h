// The CPU backend's matrix product (gemm.c), called by matmul.c and attention.c.
#pragma once

// C (M, N) = alpha * op(A) (M, K) @ op(B) (K, N) + beta * C, row-major, op(X) = X^T when
// trans_x; on the calling thread. beta = 0 writes C without reading it.
void sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
           const float *B, int ldb, float beta, float *C, int ldc);
// Room for the packed panels of `threads` threads: called before a parallel region whose
// threads call sgemm (a call outside one reserves its own)
void sgemm_reserve(int threads);
