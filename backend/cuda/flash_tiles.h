// The building blocks of flash attention's kernels (backend/cuda/flash_attention.cu): WMMA's
// 16x16x16 tiles (bf16 operands, fp32 accumulators), the tile sizes and shared-memory strides,
// the staging of fp32 rows as bf16 tiles, and the products one warp computes on them.
#pragma once
#include "backend/cuda/common.h"
#include <cuda_bf16.h>
#include <limits.h>
#include <mma.h>

using namespace nvcuda;
typedef __nv_bfloat16 bf16;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> FragA;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> FragB;
// the transpose of a row-major tile: B (k, n) = X (n, k)
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> FragBt;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> FragC;

#define TILE          64  // rows a block owns, and rows of each tile it streams through
#define WARP_ROWS     16  // rows a warp owns: WMMA's tile side
#define FLASH_THREADS 128 // TILE / WARP_ROWS warps
// Row strides, in elements, of the shared tiles: 16 bytes past the row keeps each 16-row block
// 32-byte aligned for WMMA and moves successive rows to other banks.
#define LDS (TILE + 4) // fp32 (., TILE): scores, dP
#define LDP (TILE + 8) // bf16 (., TILE): probabilities, dS
// bf16 (., DP) staged inputs: DP + 8; fp32 (., DP) outputs: DP + 4

// Blocks of a kernel that fit on one multiprocessor by their shared memory (Hopper: 228 KiB,
// 1 KiB of it reserved per block), given to __launch_bounds__ so that the compiler spends the
// registers that many blocks leave each thread, and registers never cut the occupancy further.
__host__ __device__ constexpr int resident_blocks(size_t bytes) {
    return (int)((228 * 1024) / (bytes + 1024));
}

// rows [t0, t0 + rows) of a tensor whose row t starts at x + t * stride, as bf16 (rows, DP) with
// row stride DP + 8; rows past T and columns past D are 0. `thread` of `threads` takes part.
template <int DP>
__device__ static void stage_rows(bf16 *dst, const float *x, size_t stride, int t0, int rows, int T,
                                  int D, int thread, int threads) {
    for (int idx = thread; idx < rows * DP; idx += threads) {
        int r = idx / DP, d = idx % DP, t = t0 + r;
        float val = t < T && d < D ? x[(size_t)t * stride + d] : 0.0f;
        dst[r * (DP + 8) + d] = __float2bfloat16_rn(val);
    }
}

// min and max of pos[t0, min(t0 + n, T)) to every lane of the warp; (INT_MAX, INT_MIN) if empty
__device__ static void position_range(int *lo, int *hi, const int *pos, int t0, int n, int T) {
    int a = INT_MAX, b = INT_MIN;
    for (int t = t0 + threadIdx.x % 32; t < t0 + n && t < T; t += 32) {
        a = pos[t] < a ? pos[t] : a;
        b = pos[t] > b ? pos[t] : b;
    }
    for (int o = 16; o > 0; o >>= 1) {
        int a2 = __shfl_xor_sync(0xffffffffu, a, o), b2 = __shfl_xor_sync(0xffffffffu, b, o);
        a = a2 < a ? a2 : a;
        b = b2 > b ? b2 : b;
    }
    *lo = a, *hi = b;
}

// s (16, TILE) fp32 = a (16, DP) @ x^T, x a staged (TILE, DP) tile: one warp
template <int DP>
__device__ static void times_tile_t(float *s, const FragA (&a)[DP / 16], const bf16 *x) {
    for (int n = 0; n < TILE / 16; n++) {
        FragC acc;
        wmma::fill_fragment(acc, 0.0f);
#pragma unroll
        for (int kk = 0; kk < DP / 16; kk++) {
            FragBt b;
            wmma::load_matrix_sync(b, x + n * 16 * (DP + 8) + kk * 16, DP + 8);
            wmma::mma_sync(acc, a[kk], b, acc);
        }
        wmma::store_matrix_sync(s + n * 16, acc, LDS, wmma::mem_row_major);
    }
}

// the same with a as 16 staged rows, read one 16-column slice at a time: the dk/dv kernel's
// accumulators fill the registers, and this holds 4 fragments of s where the above holds DP / 16
// of a (the slices are read once either way)
template <int DP> __device__ static void rows_times_tile_t(float *s, const bf16 *a, const bf16 *x) {
    FragC acc[TILE / 16];
#pragma unroll
    for (int n = 0; n < TILE / 16; n++) wmma::fill_fragment(acc[n], 0.0f);
    for (int kk = 0; kk < DP / 16; kk++) {
        FragA slice;
        wmma::load_matrix_sync(slice, a + kk * 16, DP + 8);
#pragma unroll
        for (int n = 0; n < TILE / 16; n++) {
            FragBt b;
            wmma::load_matrix_sync(b, x + n * 16 * (DP + 8) + kk * 16, DP + 8);
            wmma::mma_sync(acc[n], slice, b, acc[n]);
        }
    }
#pragma unroll
    for (int n = 0; n < TILE / 16; n++)
        wmma::store_matrix_sync(s + n * 16, acc[n], LDS, wmma::mem_row_major);
}

// acc (16, DP) += p (16, TILE) @ y, p bf16 with row stride LDP, y a staged (TILE, DP) tile
template <int DP>
__device__ static void add_times_tile(FragC (&acc)[DP / 16], const bf16 *p, const bf16 *y) {
    for (int kk = 0; kk < TILE / 16; kk++) {
        FragA slice; // one 16-column slice of p at a time: acc holds most of the registers
        wmma::load_matrix_sync(slice, p + kk * 16, LDP);
#pragma unroll
        for (int n = 0; n < DP / 16; n++) {
            FragB b;
            wmma::load_matrix_sync(b, y + kk * 16 * (DP + 8) + n * 16, DP + 8);
            wmma::mma_sync(acc[n], slice, b, acc[n]);
        }
    }
}

// a (16, DP) as fragments, from 16 staged rows
template <int DP> __device__ static void load_rows(FragA (&a)[DP / 16], const bf16 *rows) {
#pragma unroll
    for (int kk = 0; kk < DP / 16; kk++) wmma::load_matrix_sync(a[kk], rows + kk * 16, DP + 8);
}

// rows [t0, t0 + 16) of a tensor whose row t starts at x + t * stride += st (16, D) with row
// stride LDO, the rows that exist (t < T): one warp, consecutive lanes on consecutive floats
__device__ static void add_rows(float *x, size_t stride, const float *st, int LDO, int t0, int T,
                                int D) {
    for (int idx = threadIdx.x % 32; idx < WARP_ROWS * D; idx += 32) {
        int rr = idx / D, d = idx % D;
        if (t0 + rr < T) x[(size_t)(t0 + rr) * stride + d] += st[rr * LDO + d];
    }
}
