// Flash attention (Dao et al., FlashAttention-2) for the "bfloat16" dtype: the scores of each
// (64 queries, 64 keys) tile live in shared memory only, where attention.cu's GEMM path writes
// the whole (Tq, Tk) matrix to global memory. The products run on the tensor cores through WMMA
// (16x16x16 tiles, bf16 operands, fp32 accumulators): the kernels read fp32 q, k, v and dout and
// round them to bf16 as they stage a tile in shared memory, as autocast rounds a product's
// operands; the softmax, its statistics, the probabilities' sums and every output stay fp32.
//
// A block of 4 warps owns 64 rows (queries in the forward and dq, keys in dk/dv), 16 per warp;
// the other side streams through shared memory 64 rows at a time. Positions are any ints the
// ring hands over, so each (rows, tile) pair is judged by its positions' ranges: skipped when
// its smallest key position exceeds its largest query position, masked element by element only
// when its largest key position exceeds its smallest query position (or the tile runs past the
// end), and computed unmasked otherwise. Grouped-query heads read their kv head h / (H / KV) in
// place: K and V are never expanded.
// WMMA leaves the fragments' layout open, so row-wise work (mask, max, exp, sums, rescaling)
// goes through shared memory: a warp stores its (16, 64) scores there, two lanes work on each
// row, and the probabilities go back as bf16 for the next product.
// forward:  the running output of a warp's rows is fp32 in shared memory, rescaled as the max
//           moves (online softmax); at the end the block's softmax is merged into (out, lse)
//           with the log-sum-exp update, as attention.cu and the CPU twin do.
// backward: P is recomputed from the final lse, in two kernels and without atomics, so the
//           result is deterministic: dk_dv per (key tile, kv head), looping over the group's
//           query heads and their query tiles (the heads of a group add into one dk row, so one
//           block adds them all); dq per (query tile, head). S and dP are computed by both, 7
//           products per tile pair where FlashAttention-2's atomic dq needs 5.
// Head dims up to 128 run padded with zeros to DP = 16, 32, 64 or 128.
#include "backend/cuda/flash_attention.h"
#include "backend/cuda/flash_tiles.h"
#include <type_traits>

// Bytes of the shared tiles: staged inputs, bf16 (TILE, DP + 8); scores, fp32 (TILE, LDS);
// probabilities, bf16 (TILE, LDP). Each kernel's total counts its regions in the order it carves
// them; each region is a multiple of 128 bytes, so each starts aligned.
__host__ __device__ constexpr size_t staged_bytes(int DP) {
    return (size_t)TILE * (DP + 8) * sizeof(bf16);
}
#define SCORE_BYTES ((size_t)TILE * LDS * sizeof(float))
#define PROB_BYTES  ((size_t)TILE * LDP * sizeof(bf16))

// Forward. grid (query tiles, H, B), FLASH_THREADS threads, forward_bytes(DP) shared.
__host__ __device__ constexpr size_t forward_bytes(int DP) {
    return 2 * staged_bytes(DP) + SCORE_BYTES + PROB_BYTES + (size_t)TILE * (DP + 4) * 4 + TILE * 4;
}
template <int DP>
__global__ static void __launch_bounds__(FLASH_THREADS, resident_blocks(forward_bytes(DP)))
    flash_forward_kernel(float *out, float *lse, const float *q, const float *k, const float *v,
                         const int *q_pos, const int *k_pos, int Tq, int Tk, int H, int KV, int D,
                         float scale) {
    extern __shared__ __align__(128) char smem[];
    const int LDH = DP + 8, LDO = DP + 4;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // in a causal block the last query tiles see the most keys: they start first
    int i0 = (gridDim.x - 1 - blockIdx.x) * TILE, h = blockIdx.y, b = blockIdx.z;
    int r0 = i0 + warp * WARP_ROWS;                 // this warp's first query row
    bf16 *ks = (bf16 *)smem, *vs = ks + TILE * LDH; // (TILE, LDH) the tile's keys and values
    float *ss = (float *)(vs + TILE * LDH);         // (TILE, LDS) scores
    bf16 *ps = (bf16 *)(ss + TILE * LDS);           // (TILE, LDP) probabilities
    float *os = (float *)(ps + TILE * LDP);         // (TILE, LDO) output, not yet divided by l
    int *kp = (int *)(os + TILE * LDO);             // (TILE) the tile's key positions
    ss += warp * WARP_ROWS * LDS, ps += warp * WARP_ROWS * LDP, os += warp * WARP_ROWS * LDO;

    // this warp's query rows, as fragments for the whole loop (staged where its scores go)
    FragA qf[DP / 16];
    stage_rows<DP>((bf16 *)ss, q + ((size_t)b * Tq * H + h) * D, (size_t)H * D, r0, WARP_ROWS, Tq,
                   D, lane, 32);
    __syncwarp();
    load_rows<DP>(qf, (bf16 *)ss);
    for (int idx = lane; idx < WARP_ROWS * DP; idx += 32) os[idx / DP * LDO + idx % DP] = 0.0f;
    __syncwarp();

    int q_lo, q_hi, w_lo, w_hi;
    position_range(&q_lo, &q_hi, q_pos, i0, TILE, Tq);      // the block's queries
    position_range(&w_lo, &w_hi, q_pos, r0, WARP_ROWS, Tq); // this warp's
    // each lane: one row, half of its columns
    int r = lane / 2, half = lane % 2, i = r0 + r, qp = i < Tq ? q_pos[i] : INT_MIN;
    float m = -INFINITY, l = 0.0f; // the row's running max and sum of exp(s - m)
    const float *kh = k + ((size_t)b * Tk * KV + h / (H / KV)) * D;
    const float *vh = v + ((size_t)b * Tk * KV + h / (H / KV)) * D;
    for (int j0 = 0; j0 < Tk; j0 += TILE) {
        int k_lo, k_hi;
        position_range(&k_lo, &k_hi, k_pos, j0, TILE, Tk);
        if (k_lo > q_hi) continue; // every key of the tile is in every query's future
        __syncthreads();           // every warp is done with the previous tile
        stage_rows<DP>(ks, kh, (size_t)KV * D, j0, TILE, Tk, D, threadIdx.x, FLASH_THREADS);
        stage_rows<DP>(vs, vh, (size_t)KV * D, j0, TILE, Tk, D, threadIdx.x, FLASH_THREADS);
        int t = threadIdx.x;
        if (t < TILE) kp[t] = j0 + t < Tk ? k_pos[j0 + t] : INT_MAX;
        __syncthreads();
        if (k_lo > w_hi) continue; // none of it for this warp's rows
        bool per_element = k_hi > w_lo || j0 + TILE > Tk;

        times_tile_t<DP>(ss, qf, ks); // s = q @ k^T
        __syncwarp();
        // online softmax: m_new = max(m, rowmax(s)), p = exp(s - m_new), o and l rescaled
        float *sr = ss + r * LDS, tile_max = -INFINITY, sum = 0.0f;
        for (int c = half * TILE / 2; c < (half + 1) * TILE / 2; c++) {
            sr[c] = per_element && kp[c] > qp ? -INFINITY : sr[c] * scale;
            tile_max = fmaxf(tile_max, sr[c]);
        }
        float m_new = fmaxf(m, fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1)));
        float alpha = m_new == -INFINITY ? 1.0f : expf(m - m_new); // 0 while m = -inf
        for (int c = half * TILE / 2; c < (half + 1) * TILE / 2; c++) {
            float p = m_new == -INFINITY ? 0.0f : expf(sr[c] - m_new);
            ps[r * LDP + c] = __float2bfloat16_rn(p);
            sum += p;
        }
        l = l * alpha + sum + __shfl_xor_sync(0xffffffffu, sum, 1);
        m = m_new;
        for (int d = half * DP / 2; d < (half + 1) * DP / 2; d++) os[r * LDO + d] *= alpha;
        __syncwarp();
        // o += p @ v
        FragC o[DP / 16];
#pragma unroll
        for (int n = 0; n < DP / 16; n++)
            wmma::load_matrix_sync(o[n], os + n * 16, LDO, wmma::mem_row_major);
        add_times_tile<DP>(o, ps, vs);
#pragma unroll
        for (int n = 0; n < DP / 16; n++)
            wmma::store_matrix_sync(os + n * 16, o[n], LDO, wmma::mem_row_major);
        __syncwarp();
    }

    // merge: lse_new = log(exp(lse) + exp(lse_block)), out = out * exp(lse - lse_new) +
    // (o / l) * exp(lse_block - lse_new); a row that saw no key keeps (out, lse). The row's
    // two weights go through shared memory, so that consecutive lanes write consecutive floats.
    if (half == 0) {
        float w_old = -1.0f, w_new = 0.0f; // w_old < 0: leave the row
        if (i < Tq && l > 0.0f) {
            size_t li = ((size_t)b * H + h) * Tq + i;
            float block_lse = m + logf(l), top = fmaxf(lse[li], block_lse);
            float lse_new = top + logf(expf(lse[li] - top) + expf(block_lse - top));
            w_old = expf(lse[li] - lse_new);
            w_new = expf(block_lse - lse_new) / l;
            lse[li] = lse_new;
        }
        ss[r * LDS] = w_old, ss[r * LDS + 1] = w_new;
    }
    __syncwarp();
    for (int idx = lane; idx < WARP_ROWS * D; idx += 32) {
        int rr = idx / D, d = idx % D;
        float w_old = ss[rr * LDS], w_new = ss[rr * LDS + 1];
        if (w_old < 0.0f) continue;
        float *o_g = out + (((size_t)b * Tq + r0 + rr) * H + h) * D + d;
        *o_g = *o_g * w_old + os[rr * LDO + d] * w_new;
    }
}

// dq. grid (query tiles, H, B), FLASH_THREADS threads, dq_bytes(DP) shared.
__host__ __device__ constexpr size_t dq_bytes(int DP) {
    return 2 * staged_bytes(DP) + 2 * SCORE_BYTES + PROB_BYTES + TILE * 4;
}
template <int DP>
__global__ static void __launch_bounds__(FLASH_THREADS, resident_blocks(dq_bytes(DP)))
    flash_dq_kernel(float *dq, const float *dout, const float *q, const float *k, const float *v,
                    const float *lse, const float *delta, const int *q_pos, const int *k_pos,
                    int Tq, int Tk, int H, int KV, int D, float scale) {
    extern __shared__ __align__(128) char smem[];
    const int LDH = DP + 8, LDO = DP + 4;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int i0 = (gridDim.x - 1 - blockIdx.x) * TILE, h = blockIdx.y, b = blockIdx.z;
    int r0 = i0 + warp * WARP_ROWS;
    bf16 *ks = (bf16 *)smem, *vs = ks + TILE * LDH; // (TILE, LDH) the tile's keys and values
    float *ss = (float *)(vs + TILE * LDH);         // (TILE, LDS) scores
    float *dps = ss + TILE * LDS;                   // (TILE, LDS) dp
    bf16 *dss = (bf16 *)(dps + TILE * LDS);         // (TILE, LDP) ds
    int *kp = (int *)(dss + TILE * LDP);            // (TILE) the tile's key positions
    ss += warp * WARP_ROWS * LDS, dps += warp * WARP_ROWS * LDS, dss += warp * WARP_ROWS * LDP;

    // this warp's rows of q and dout as fragments, staged one after the other where s goes
    FragA qf[DP / 16], dof[DP / 16];
    size_t row0 = ((size_t)b * Tq * H + h) * D, stride = (size_t)H * D;
    stage_rows<DP>((bf16 *)ss, q + row0, stride, r0, WARP_ROWS, Tq, D, lane, 32);
    __syncwarp();
    load_rows<DP>(qf, (bf16 *)ss);
    __syncwarp();
    stage_rows<DP>((bf16 *)ss, dout + row0, stride, r0, WARP_ROWS, Tq, D, lane, 32);
    __syncwarp();
    load_rows<DP>(dof, (bf16 *)ss);
    __syncwarp();
    FragC dqf[DP / 16];
#pragma unroll
    for (int n = 0; n < DP / 16; n++) wmma::fill_fragment(dqf[n], 0.0f);

    int q_lo, q_hi, w_lo, w_hi;
    position_range(&q_lo, &q_hi, q_pos, i0, TILE, Tq);
    position_range(&w_lo, &w_hi, q_pos, r0, WARP_ROWS, Tq);
    int r = lane / 2, half = lane % 2, i = r0 + r, qp = i < Tq ? q_pos[i] : INT_MIN;
    // a row past Tq, or one that saw no key (lse = -inf), has no gradient: lse = +inf gives p = 0
    float lse_i = i < Tq ? lse[((size_t)b * H + h) * Tq + i] : INFINITY;
    float delta_i = i < Tq ? delta[((size_t)b * H + h) * Tq + i] : 0.0f;
    if (lse_i == -INFINITY) lse_i = INFINITY;
    const float *kh = k + ((size_t)b * Tk * KV + h / (H / KV)) * D;
    const float *vh = v + ((size_t)b * Tk * KV + h / (H / KV)) * D;
    for (int j0 = 0; j0 < Tk; j0 += TILE) {
        int k_lo, k_hi;
        position_range(&k_lo, &k_hi, k_pos, j0, TILE, Tk);
        if (k_lo > q_hi) continue;
        __syncthreads();
        stage_rows<DP>(ks, kh, (size_t)KV * D, j0, TILE, Tk, D, threadIdx.x, FLASH_THREADS);
        stage_rows<DP>(vs, vh, (size_t)KV * D, j0, TILE, Tk, D, threadIdx.x, FLASH_THREADS);
        int t = threadIdx.x;
        if (t < TILE) kp[t] = j0 + t < Tk ? k_pos[j0 + t] : INT_MAX;
        __syncthreads();
        if (k_lo > w_hi) continue;
        bool per_element = k_hi > w_lo || j0 + TILE > Tk;

        times_tile_t<DP>(ss, qf, ks);   // s = q @ k^T
        times_tile_t<DP>(dps, dof, vs); // forward: out = p @ v  =>  dp = dout @ v^T
        __syncwarp();
        // forward: p = exp(scale * s - lse)  =>  ds = p * (dp - delta) * scale
        for (int c = half * TILE / 2; c < (half + 1) * TILE / 2; c++) {
            float p = per_element && kp[c] > qp ? 0.0f : expf(ss[r * LDS + c] * scale - lse_i);
            dss[r * LDP + c] = __float2bfloat16_rn(p * (dps[r * LDS + c] - delta_i) * scale);
        }
        __syncwarp();
        add_times_tile<DP>(dqf, dss, ks); // forward: s = q @ k^T  =>  dq += ds @ k
    }
    __syncthreads(); // every warp is done with ks and vs: they hold the warps' dq rows now
    float *st = (float *)smem + warp * WARP_ROWS * LDO;
#pragma unroll
    for (int n = 0; n < DP / 16; n++)
        wmma::store_matrix_sync(st + n * 16, dqf[n], LDO, wmma::mem_row_major);
    __syncwarp();
    add_rows(dq + row0, stride, st, LDO, r0, Tq, D);
}

// dk and dv. grid (key tiles, KV, B), FLASH_THREADS threads, dk_dv_bytes(DP) shared.
__host__ __device__ constexpr size_t dk_dv_bytes(int DP) {
    return 4 * staged_bytes(DP) + 2 * SCORE_BYTES + 2 * PROB_BYTES + 4 * TILE * 4;
}
template <int DP>
__global__ static void __launch_bounds__(FLASH_THREADS, resident_blocks(dk_dv_bytes(DP)))
    flash_dk_dv_kernel(float *dk, float *dv, const float *dout, const float *q, const float *k,
                       const float *v, const float *lse, const float *delta, const int *q_pos,
                       const int *k_pos, int Tq, int Tk, int H, int KV, int D, float scale) {
    extern __shared__ __align__(128) char smem[];
    const int LDH = DP + 8, LDO = DP + 4;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int j0 = blockIdx.x * TILE, g = blockIdx.y, b = blockIdx.z, group = H / KV;
    int r0 = j0 + warp * WARP_ROWS;                     // this warp's first key
    bf16 *ks = (bf16 *)smem, *vs = ks + TILE * LDH;     // (TILE, LDH) the block's keys, values
    bf16 *qs = vs + TILE * LDH, *dos = qs + TILE * LDH; // (TILE, LDH) a query tile, its dout
    float *sts = (float *)(dos + TILE * LDH);           // (TILE, LDS) s^T
    float *dpts = sts + TILE * LDS;                     // (TILE, LDS) dp^T
    bf16 *pts = (bf16 *)(dpts + TILE * LDS);            // (TILE, LDP) p^T
    bf16 *dsts = pts + TILE * LDP;                      // (TILE, LDP) ds^T
    float *lse_s = (float *)(dsts + TILE * LDP);        // (TILE) the query tile's lse
    float *delta_s = lse_s + TILE;                      // (TILE) its delta
    int *qp_s = (int *)(delta_s + TILE);                // (TILE) its positions
    int *kp = qp_s + TILE;                              // (TILE) the block's key positions
    sts += warp * WARP_ROWS * LDS, dpts += warp * WARP_ROWS * LDS;
    pts += warp * WARP_ROWS * LDP, dsts += warp * WARP_ROWS * LDP;

    size_t key0 = ((size_t)b * Tk * KV + g) * D, key_stride = (size_t)KV * D;
    stage_rows<DP>(ks, k + key0, key_stride, j0, TILE, Tk, D, threadIdx.x, FLASH_THREADS);
    stage_rows<DP>(vs, v + key0, key_stride, j0, TILE, Tk, D, threadIdx.x, FLASH_THREADS);
    int t = threadIdx.x;
    if (t < TILE) kp[t] = j0 + t < Tk ? k_pos[j0 + t] : INT_MAX;
    int k_lo, k_hi, w_lo, w_hi;
    position_range(&k_lo, &k_hi, k_pos, j0, TILE, Tk);      // the block's keys
    position_range(&w_lo, &w_hi, k_pos, r0, WARP_ROWS, Tk); // this warp's
    FragC dkf[DP / 16], dvf[DP / 16];
#pragma unroll
    for (int n = 0; n < DP / 16; n++) {
        wmma::fill_fragment(dkf[n], 0.0f);
        wmma::fill_fragment(dvf[n], 0.0f);
    }
    int r = lane / 2, half = lane % 2; // each lane: one key, half of the tile's queries

    for (int h = g * group; h < (g + 1) * group; h++) {
        size_t row0 = ((size_t)b * Tq * H + h) * D, stride = (size_t)H * D;
        const float *lse_h = lse + ((size_t)b * H + h) * Tq;
        const float *delta_h = delta + ((size_t)b * H + h) * Tq;
        for (int i0 = 0; i0 < Tq; i0 += TILE) {
            int q_lo, q_hi;
            position_range(&q_lo, &q_hi, q_pos, i0, TILE, Tq);
            if (k_lo > q_hi) continue;
            __syncthreads();
            stage_rows<DP>(qs, q + row0, stride, i0, TILE, Tq, D, t, FLASH_THREADS);
            stage_rows<DP>(dos, dout + row0, stride, i0, TILE, Tq, D, t, FLASH_THREADS);
            if (t < TILE) {
                // a query past Tq, or one that saw no key, has no gradient: lse = +inf, p = 0
                int i = i0 + t;
                float li = i < Tq ? lse_h[i] : INFINITY;
                lse_s[t] = li == -INFINITY ? INFINITY : li;
                delta_s[t] = i < Tq ? delta_h[i] : 0.0f;
                qp_s[t] = i < Tq ? q_pos[i] : INT_MIN;
            }
            __syncthreads();
            if (w_lo > q_hi) continue; // this warp's keys are in every query's future
            bool per_element = w_hi > q_lo || r0 + WARP_ROWS > Tk;

            rows_times_tile_t<DP>(sts, ks + warp * WARP_ROWS * LDH, qs);   // s^T = k @ q^T
            rows_times_tile_t<DP>(dpts, vs + warp * WARP_ROWS * LDH, dos); // dp^T = v @ dout^T
            __syncwarp();
            int kpos = kp[warp * WARP_ROWS + r];
            for (int c = half * TILE / 2; c < (half + 1) * TILE / 2; c++) {
                float p = per_element && kpos > qp_s[c] ? 0.0f
                                                        : expf(sts[r * LDS + c] * scale - lse_s[c]);
                float ds = p * (dpts[r * LDS + c] - delta_s[c]) * scale;
                pts[r * LDP + c] = __float2bfloat16_rn(p);
                dsts[r * LDP + c] = __float2bfloat16_rn(ds);
            }
            __syncwarp();
            add_times_tile<DP>(dvf, pts, dos); // forward: out = p @ v  =>  dv += p^T @ dout
            add_times_tile<DP>(dkf, dsts, qs); // forward: s = q @ k^T  =>  dk += ds^T @ q
        }
    }
    __syncthreads(); // every warp is done with qs and dos: they hold the warps' rows now
    float *st = (float *)qs + warp * WARP_ROWS * LDO;
#pragma unroll
    for (int n = 0; n < DP / 16; n++)
        wmma::store_matrix_sync(st + n * 16, dvf[n], LDO, wmma::mem_row_major);
    __syncwarp();
    add_rows(dv + key0, key_stride, st, LDO, r0, Tk, D);
    __syncwarp();
#pragma unroll
    for (int n = 0; n < DP / 16; n++)
        wmma::store_matrix_sync(st + n * 16, dkf[n], LDO, wmma::mem_row_major);
    __syncwarp();
    add_rows(dk + key0, key_stride, st, LDO, r0, Tk, D);
}

// a kernel's dynamic shared memory beyond the default 48 KiB must be asked for
template <typename Kernel> static void allow_shared(Kernel *kernel, size_t bytes) {
    cudaCheck(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

// f(std::integral_constant<int, DP>()) for the padded head dim DP that holds D
template <typename F> static void with_padded_dim(int D, F f) {
    if (D <= 16) return f(std::integral_constant<int, 16>());
    if (D <= 32) return f(std::integral_constant<int, 32>());
    if (D <= 64) return f(std::integral_constant<int, 64>());
    f(std::integral_constant<int, 128>());
}

int flash_attention_supports(int D) {
    return D >= 1 && D <= 128;
}

void flash_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                             const int *q_pos, const int *k_pos, int B, int Tq, int Tk, int H,
                             int KV, int D) {
    with_padded_dim(D, [&](auto dp) {
        constexpr int DP = decltype(dp)::value;
        allow_shared(flash_forward_kernel<DP>, forward_bytes(DP));
        dim3 grid((Tq + TILE - 1) / TILE, H, B);
        flash_forward_kernel<DP><<<grid, FLASH_THREADS, forward_bytes(DP)>>>(
            out, lse, q, k, v, q_pos, k_pos, Tq, Tk, H, KV, D, 1.0f / sqrtf((float)D));
        cudaCheckLaunch();
    });
}

void flash_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                              const float *k, const float *v, const float *lse, const float *delta,
                              const int *q_pos, const int *k_pos, int B, int Tq, int Tk, int H,
                              int KV, int D) {
    float scale = 1.0f / sqrtf((float)D);
    with_padded_dim(D, [&](auto dp) {
        constexpr int DP = decltype(dp)::value;
        allow_shared(flash_dk_dv_kernel<DP>, dk_dv_bytes(DP));
        dim3 key_tiles((Tk + TILE - 1) / TILE, KV, B), query_tiles((Tq + TILE - 1) / TILE, H, B);
        flash_dk_dv_kernel<DP><<<key_tiles, FLASH_THREADS, dk_dv_bytes(DP)>>>(
            dk, dv, dout, q, k, v, lse, delta, q_pos, k_pos, Tq, Tk, H, KV, D, scale);
        cudaCheckLaunch();
        allow_shared(flash_dq_kernel<DP>, dq_bytes(DP));
        flash_dq_kernel<DP><<<query_tiles, FLASH_THREADS, dq_bytes(DP)>>>(
            dq, dout, q, k, v, lse, delta, q_pos, k_pos, Tq, Tk, H, KV, D, scale);
        cudaCheckLaunch();
    });
}
