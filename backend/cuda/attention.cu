// Causal attention of one (query block, key/value block) pair on the GPU, flash-attention style
// (Dao et al.): keys and values stream through shared memory in tiles of KT rows, each warp
// keeps one query row's running max, sum and output (the online softmax), and the block's
// softmax is merged into (out, lse) with the same log-sum-exp update as backend/cpu/attention.c,
// so ring attention (Liu et al.) visits the blocks one by one on either device.
// Correctness first: fp32 throughout, one warp per row, no tensor cores; the backward recomputes
// probabilities from the final lse in two kernels (dq by query rows, dk and dv by key rows), so
// every output element has one owner and no atomics are needed.
#include "backend/cuda/common.h"

#define KT    32 // key (or query) rows per shared-memory tile: one per lane
#define WARPS 4  // rows per block, one per warp

// Shared memory above the 48 KiB default must be asked for (D = 256 needs it).
template <typename Kernel> static void allow_smem(Kernel kernel, size_t bytes) {
    if (bytes > 48 * 1024)
        cudaCheck(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

// rows [r0, r0 + KT) of a (T, heads, D) slice, head `head`, into tile (KT, D + 1); the padding
// column keeps lane j's walk along row j off the other lanes' memory banks. Rows >= T are zero.
__device__ static void load_tile(float *tile, const float *src, int r0, int T, int heads, int head,
                                 int D) {
    for (int idx = threadIdx.x; idx < KT * D; idx += blockDim.x) {
        int r = idx / D, d = idx % D;
        float x = 0.0f;
        if (r0 + r < T) x = src[((size_t)(r0 + r) * heads + head) * D + d];
        tile[r * (D + 1) + d] = x;
    }
}

__device__ static float dot_tile_row(const float *a, const float *tile_row, int D) {
    float s = 0.0f;
    for (int d = 0; d < D; d++) s += a[d] * tile_row[d];
    return s;
}

// grid (Tq / WARPS, H, B); warp w of block x takes query row i = x * WARPS + w
__global__ static void attention_forward_kernel(float *out, float *lse, const float *q,
                                                const float *k, const float *v, const int *q_pos,
                                                const int *k_pos, int Tq, int Tk, int H, int KV,
                                                int D, float scale) {
    extern __shared__ float smem[];
    float *ktile = smem;                 // (KT, D + 1)
    float *vtile = ktile + KT * (D + 1); // (KT, D + 1)
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *qrow = vtile + KT * (D + 1) + warp * D;                   // (D) this warp's query
    float *acc = vtile + KT * (D + 1) + WARPS * D + warp * D;        // (D) unnormalised output
    float *ptile = vtile + KT * (D + 1) + 2 * WARPS * D + warp * KT; // (KT) probabilities
    int b = blockIdx.z, h = blockIdx.y, kvh = h / (H / KV);
    int i = blockIdx.x * WARPS + warp;
    bool valid = i < Tq;
    const float *kb = k + (size_t)b * Tk * KV * D;
    const float *vb = v + (size_t)b * Tk * KV * D;
    if (valid)
        for (int d = lane; d < D; d += 32) {
            qrow[d] = q[(((size_t)b * Tq + i) * H + h) * D + d];
            acc[d] = 0.0f;
        }
    int qp = valid ? q_pos[i] : 0;
    float m = -INFINITY, l = 0.0f; // running max and sum of exp(score - m)
    for (int j0 = 0; j0 < Tk; j0 += KT) {
        __syncthreads(); // the previous tile is no longer read
        load_tile(ktile, kb, j0, Tk, KV, kvh, D);
        load_tile(vtile, vb, j0, Tk, KV, kvh, D);
        __syncthreads();
        if (!valid) continue;
        int j = j0 + lane;
        // key j is seen by query i iff k_pos[j] <= q_pos[i]
        float s = -INFINITY;
        if (j < Tk && k_pos[j] <= qp) s = scale * dot_tile_row(qrow, ktile + lane * (D + 1), D);
        float m_new = fmaxf(m, warp_max(s));
        if (m_new == -INFINITY) continue; // no key of this query seen yet
        float p = s == -INFINITY ? 0.0f : expf(s - m_new);
        float alpha = expf(m - m_new); // 0 while m = -inf
        l = l * alpha + warp_sum(p);
        ptile[lane] = p;
        __syncwarp();
        for (int d = lane; d < D; d += 32) {
            float a = acc[d] * alpha;
            for (int jj = 0; jj < KT; jj++) a += ptile[jj] * vtile[jj * (D + 1) + d];
            acc[d] = a;
        }
        __syncwarp(); // ptile is rewritten by the next tile
        m = m_new;
    }
    if (!valid || m == -INFINITY) return; // every key of this block is in the future
    // merge: lse = log(exp(lse) + exp(lse_block)), out = weighted mean of both
    float *lse_i = lse + ((size_t)b * H + h) * Tq + i;
    float lse_old = *lse_i;
    float lse_block = m + logf(l);
    float top = fmaxf(lse_old, lse_block);
    float lse_new = top + logf(expf(lse_old - top) + expf(lse_block - top));
    float w_old = expf(lse_old - lse_new); // 0 when lse = -inf
    float w_block = expf(lse_block - lse_new) / l;
    float *oi = out + (((size_t)b * Tq + i) * H + h) * D;
    for (int d = lane; d < D; d += 32) oi[d] = oi[d] * w_old + acc[d] * w_block;
    __syncwarp();
    if (lane == 0) *lse_i = lse_new;
}

// delta (B, H, T) = rowsum(dout * out): one warp per (b, t, h) row
__global__ static void attention_delta_kernel(float *delta, const float *dout, const float *out,
                                              int T, int H, int D, size_t rows) {
    size_t row = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return; // whole warps leave together
    float s = 0.0f;
    for (int d = lane; d < D; d += 32) s += dout[row * D + d] * out[row * D + d];
    s = warp_sum(s);
    int h = (int)(row % H), t = (int)((row / H) % T), b = (int)(row / H / T);
    if (lane == 0) delta[((size_t)b * H + h) * T + t] = s;
}

// dq for one query row per warp: grid (Tq / WARPS, H, B)
__global__ static void attention_backward_dq_kernel(float *dq, const float *dout, const float *q,
                                                    const float *k, const float *v,
                                                    const float *lse, const float *delta,
                                                    const int *q_pos, const int *k_pos, int Tq,
                                                    int Tk, int H, int KV, int D, float scale) {
    extern __shared__ float smem[];
    float *ktile = smem;                 // (KT, D + 1)
    float *vtile = ktile + KT * (D + 1); // (KT, D + 1)
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *rows = vtile + KT * (D + 1) + warp * 3 * D;
    float *qrow = rows, *dorow = rows + D, *acc = rows + 2 * D;       // (D) each
    float *dstile = vtile + KT * (D + 1) + 3 * WARPS * D + warp * KT; // (KT) ds of the tile
    int b = blockIdx.z, h = blockIdx.y, kvh = h / (H / KV);
    int i = blockIdx.x * WARPS + warp;
    size_t row = (((size_t)b * Tq + (i < Tq ? i : 0)) * H + h) * D;
    float lse_i = i < Tq ? lse[((size_t)b * H + h) * Tq + i] : -INFINITY;
    bool valid = lse_i != -INFINITY; // a row that saw no key at all has no gradient
    float delta_i = valid ? delta[((size_t)b * H + h) * Tq + i] : 0.0f;
    int qp = valid ? q_pos[i] : 0;
    if (valid)
        for (int d = lane; d < D; d += 32) {
            qrow[d] = q[row + d];
            dorow[d] = dout[row + d];
            acc[d] = 0.0f;
        }
    const float *kb = k + (size_t)b * Tk * KV * D;
    const float *vb = v + (size_t)b * Tk * KV * D;
    for (int j0 = 0; j0 < Tk; j0 += KT) {
        __syncthreads();
        load_tile(ktile, kb, j0, Tk, KV, kvh, D);
        load_tile(vtile, vb, j0, Tk, KV, kvh, D);
        __syncthreads();
        if (!valid) continue;
        int j = j0 + lane;
        float ds = 0.0f;
        if (j < Tk && k_pos[j] <= qp) {
            // forward: p = exp(scale * q.k - lse), out = sum_j p_j v_j
            float p = expf(scale * dot_tile_row(qrow, ktile + lane * (D + 1), D) - lse_i);
            float dp = dot_tile_row(dorow, vtile + lane * (D + 1), D); // dp = dout . v
            ds = p * (dp - delta_i) * scale;                           // softmax backward
        }
        if (__all_sync(0xffffffffu, ds == 0.0f)) continue;
        dstile[lane] = ds;
        __syncwarp();
        for (int d = lane; d < D; d += 32) { // dq += ds * k * scale
            float a = acc[d];
            for (int jj = 0; jj < KT; jj++) a += dstile[jj] * ktile[jj * (D + 1) + d];
            acc[d] = a;
        }
        __syncwarp();
    }
    if (!valid) return;
    for (int d = lane; d < D; d += 32) dq[row + d] += acc[d];
}

// dk, dv for one key row per warp, summed over the query heads that share its kv head:
// grid (Tk / WARPS, KV, B)
__global__ static void attention_backward_dkv_kernel(float *dk, float *dv, const float *dout,
                                                     const float *q, const float *k, const float *v,
                                                     const float *lse, const float *delta,
                                                     const int *q_pos, const int *k_pos, int Tq,
                                                     int Tk, int H, int KV, int D, float scale) {
    extern __shared__ float smem[];
    float *qtile = smem;                     // (KT, D + 1) query rows
    float *dotile = qtile + KT * (D + 1);    // (KT, D + 1) their dout rows
    float *lse_tile = dotile + KT * (D + 1); // (KT)
    float *delta_tile = lse_tile + KT;       // (KT)
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *rows = delta_tile + KT + warp * 4 * D;
    float *krow = rows, *vrow = rows + D, *dk_acc = rows + 2 * D, *dv_acc = rows + 3 * D;
    float *ptile = delta_tile + KT + 4 * WARPS * D + warp * 2 * KT; // (KT) p of the tile
    float *dstile = ptile + KT;                                     // (KT) ds of the tile
    int b = blockIdx.z, g = blockIdx.y, group = H / KV;
    int j = blockIdx.x * WARPS + warp;
    bool valid = j < Tk;
    size_t row = (((size_t)b * Tk + (valid ? j : 0)) * KV + g) * D;
    int kp = valid ? k_pos[j] : 0;
    if (valid)
        for (int d = lane; d < D; d += 32) {
            krow[d] = k[row + d];
            vrow[d] = v[row + d];
            dk_acc[d] = 0.0f;
            dv_acc[d] = 0.0f;
        }
    const float *qb = q + (size_t)b * Tq * H * D;
    const float *dob = dout + (size_t)b * Tq * H * D;
    for (int h = g * group; h < (g + 1) * group; h++) {
        for (int i0 = 0; i0 < Tq; i0 += KT) {
            __syncthreads();
            load_tile(qtile, qb, i0, Tq, H, h, D);
            load_tile(dotile, dob, i0, Tq, H, h, D);
            for (int r = threadIdx.x; r < KT; r += blockDim.x) {
                bool in = i0 + r < Tq;
                lse_tile[r] = in ? lse[((size_t)b * H + h) * Tq + i0 + r] : -INFINITY;
                delta_tile[r] = in ? delta[((size_t)b * H + h) * Tq + i0 + r] : 0.0f;
            }
            __syncthreads();
            if (!valid) continue;
            int i = i0 + lane;
            float p = 0.0f, ds = 0.0f;
            if (i < Tq && lse_tile[lane] != -INFINITY && kp <= q_pos[i]) {
                const float *qi = qtile + lane * (D + 1), *doi = dotile + lane * (D + 1);
                p = expf(scale * dot_tile_row(krow, qi, D) - lse_tile[lane]);
                float dp = dot_tile_row(vrow, doi, D);
                ds = p * (dp - delta_tile[lane]) * scale;
            }
            if (__all_sync(0xffffffffu, p == 0.0f)) continue;
            ptile[lane] = p;
            dstile[lane] = ds;
            __syncwarp();
            for (int d = lane; d < D; d += 32) {
                float a_k = dk_acc[d], a_v = dv_acc[d];
                for (int ii = 0; ii < KT; ii++) {
                    a_v += ptile[ii] * dotile[ii * (D + 1) + d]; // dv += p * dout
                    a_k += dstile[ii] * qtile[ii * (D + 1) + d]; // dk += ds * q * scale
                }
                dk_acc[d] = a_k;
                dv_acc[d] = a_v;
            }
            __syncwarp();
        }
    }
    if (!valid) return;
    for (int d = lane; d < D; d += 32) {
        dk[row + d] += dk_acc[d];
        dv[row + d] += dv_acc[d];
    }
}

// q: (B, Tq, H, D)  k, v: (B, Tk, KV, D)  q_pos (Tq), k_pos (Tk)  out: (B, Tq, H, D)
// lse: (B, H, Tq), both running values merged with this block's softmax
void attention_forward_block(float *out, float *lse, const float *q, const float *k, const float *v,
                             const int *q_pos, const int *k_pos, int B, int Tq, int Tk, int H,
                             int KV, int D) {
    PROFILE(PROFILE_ATTENTION);
    if (B == 0 || Tq == 0 || Tk == 0 || H == 0) return;
    float scale = 1.0f / sqrtf((float)D);
    size_t smem = (2 * KT * (D + 1) + 2 * WARPS * D + WARPS * KT) * sizeof(float);
    allow_smem(attention_forward_kernel, smem);
    dim3 grid((Tq + WARPS - 1) / WARPS, H, B);
    attention_forward_kernel<<<grid, WARPS * 32, smem>>>(out, lse, q, k, v, q_pos, k_pos, Tq, Tk, H,
                                                         KV, D, scale);
    cudaCheckLaunch();
}

// delta (B, H, T) = rowsum(dout * out): the softmax backward's sum_j p_j dp_j, per query row
void attention_backward_delta(float *delta, const float *dout, const float *out, int B, int T,
                              int H, int D) {
    PROFILE(PROFILE_ATTENTION);
    size_t rows = (size_t)B * T * H;
    if (rows == 0) return;
    attention_delta_kernel<<<blocks_for(rows * 32, 256), 256>>>(delta, dout, out, T, H, D, rows);
    cudaCheckLaunch();
}

void attention_backward_block(float *dq, float *dk, float *dv, const float *dout, const float *q,
                              const float *k, const float *v, const float *lse, const float *delta,
                              const int *q_pos, const int *k_pos, int B, int Tq, int Tk, int H,
                              int KV, int D) {
    PROFILE(PROFILE_ATTENTION);
    if (B == 0 || Tq == 0 || Tk == 0 || H == 0) return;
    float scale = 1.0f / sqrtf((float)D);
    size_t smem_dq = (2 * KT * (D + 1) + 3 * WARPS * D + WARPS * KT) * sizeof(float);
    allow_smem(attention_backward_dq_kernel, smem_dq);
    dim3 grid_dq((Tq + WARPS - 1) / WARPS, H, B);
    attention_backward_dq_kernel<<<grid_dq, WARPS * 32, smem_dq>>>(
        dq, dout, q, k, v, lse, delta, q_pos, k_pos, Tq, Tk, H, KV, D, scale);
    cudaCheckLaunch();
    size_t smem_dkv = (2 * KT * (D + 1) + 2 * KT + 4 * WARPS * D + 2 * WARPS * KT) * sizeof(float);
    allow_smem(attention_backward_dkv_kernel, smem_dkv);
    dim3 grid_dkv((Tk + WARPS - 1) / WARPS, KV, B);
    attention_backward_dkv_kernel<<<grid_dkv, WARPS * 32, smem_dkv>>>(
        dk, dv, dout, q, k, v, lse, delta, q_pos, k_pos, Tq, Tk, H, KV, D, scale);
    cudaCheckLaunch();
}
