// The CPU backend's matrix product (gemm.c), called by matmul.c and attention.c.
#pragma once
#include <stddef.h>

// C (M, N) = alpha * op(A) (M, K) @ op(B) (K, N) + beta * C, row-major, op(X) = X^T when
// trans_x; on the calling thread. beta = 0 writes C without reading it.
void sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
           const float *B, int ldb, float beta, float *C, int ldc);

// The rows of gemm.c's micro-tile: a caller that cuts a product into tiles of rows (attention's
// query tiles) keeps them whole with a multiple of it; and its columns, two vectors
#if defined(__AVX512F__)
#define SGEMM_MR 14
#define SGEMM_NR 32
#elif defined(__AVX__)
#define SGEMM_MR 6
#define SGEMM_NR 16
#else
#define SGEMM_MR 6
#define SGEMM_NR 8
#endif

// B packed once for several products that read it (attention's keys and values): op(B) (K, N),
// sgemm_packed_floats(K, N) floats at panels
typedef struct {
    float *panels;
    int K, N;
} SgemmPacked;
size_t sgemm_packed_floats(int K, int N);
void sgemm_pack(SgemmPacked b, int trans_b, const float *B, int ldb);
// C (M, N) = alpha * op(A) (M, K) @ b's first K rows and N columns + beta * C: the bits of sgemm
void sgemm_packed(int trans_a, int M, int N, int K, float alpha, const float *A, int lda,
                  SgemmPacked b, float beta, float *C, int ldc);

// Room for the packed panels of `threads` threads: called before a parallel region whose
// threads call sgemm (a call outside one reserves its own)
void sgemm_reserve(int threads);
