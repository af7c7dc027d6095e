// Causal attention of one (query block, key/value block) pair on the GPU, the CPU twin's
// algorithm (backend/cpu/attention.c) with the heads batched: the products are cuBLAS
// strided-batched GEMMs (scores = scale * q @ k^T, then p @ v in the forward; dp, dq, dk, dv in
// the backward), and row kernels between them apply the causal mask, the softmax and its
// backward. The block's softmax is merged into (out, lse) with the log-sum-exp update, so ring
// attention (Liu et al.) visits the blocks one by one on either device; the backward recomputes
// the probabilities from the final lse (as flash attention does), so no (Tq, Tk) matrix is kept
// between the passes.
// A call handles the heads in sets: batch element b, offset hh inside each group of query heads
// that share a kv head, and a run of kv heads [g0, g0 + n). Inside a set, consecutive heads are
// group * D floats apart in q (B, T, H, D), D apart in k and v (B, T, KV, D), and Tq * Tk apart
// in the scores, so each product of the set is one strided-batched GEMM. n is as large as
// SCORES_CAP floats of scores allow.
// Which path runs: "float32" takes the GEMMs above in fp32 (no TF32), to match the CPU to 1e-5.
// "bfloat16" (autocast) takes flash attention (backend/cuda/flash_attention.cu: bf16 tiles on
// the tensor cores, fp32 softmax and accumulators, no (Tq, Tk) matrix in global memory) for head
// dims up to 128, and these GEMMs on the TF32 tensor cores (10-bit mantissa) for larger ones.
#include "backend/cuda/common.h"
#include "backend/cuda/flash_attention.h"

// floats per scores buffer: 256 MiB. `make GPU=emulate` sets 2048, so that the tests' small
// shapes also run in several sets.
#ifndef SCORES_CAP
#define SCORES_CAP (64u << 20)
#endif

static DeviceScratch scores_buf, grads_buf, block_lse_buf, block_out_buf;

// column-major C_i (m, n) = alpha * op(A_i) @ op(B_i) + beta * C_i, i < count, all fp32
static void batched_gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                         float alpha, const float *a, int lda, long long stride_a, const float *b,
                         int ldb, long long stride_b, float beta, float *c, int ldc,
                         long long stride_c, int count) {
    PROFILE(PROFILE_ATTENTION);
    cublasComputeType_t compute = compute_bf16 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cublasCheck(cublasGemmStridedBatchedEx(
        cublas_handle, ta, tb, m, n, k, &alpha, a, CUDA_R_32F, lda, stride_a, b, CUDA_R_32F, ldb,
        stride_b, &beta, c, CUDA_R_32F, ldc, stride_c, count, compute, CUBLAS_GEMM_DEFAULT));
}

// A set of heads (see the top of the file) and where its rows start.
typedef struct {
    int b, hh, g0, n; // batch element, offset in the group, first kv head, kv heads
} HeadSet;

// The three products of a set, per head, row-major, written column-major as in matmul.cu (a
// row-major (R, K) matrix with row stride ld is the column-major (K, R) one):
//   x_times_yt:  s (Tq, Tk) = alpha * x (Tq, D) @ y (Tk, D)^T
//   s_times_y:   z (Tq, D) = s @ y (Tk, D) + beta * z
//   st_times_x:  z (Tk, D) += s^T @ x (Tq, D)
// x is a query-side tensor: q, dout or out (heads group * D apart, rows H * D apart); y a
// key-side one: k, v, dk or dv (heads D apart, rows KV * D apart); s a scores buffer (heads
// Tq * Tk apart, rows Tk apart).
typedef struct {
    int Tq, Tk, H, KV, D, group;
} Shape;

static void x_times_yt(float *s, const float *x, const float *y, float alpha, Shape sh, int n) {
    batched_gemm(CUBLAS_OP_T, CUBLAS_OP_N, sh.Tk, sh.Tq, sh.D, alpha, y, sh.KV * sh.D, sh.D, x,
                 sh.H * sh.D, (long long)sh.group * sh.D, 0.0f, s, sh.Tk, (long long)sh.Tq * sh.Tk,
                 n);
}
static void s_times_y(float *z, const float *s, const float *y, float beta, Shape sh, int n) {
    batched_gemm(CUBLAS_OP_N, CUBLAS_OP_N, sh.D, sh.Tq, sh.Tk, 1.0f, y, sh.KV * sh.D, sh.D, s,
                 sh.Tk, (long long)sh.Tq * sh.Tk, beta, z, sh.H * sh.D, (long long)sh.group * sh.D,
                 n);
}
static void st_times_x(float *z, const float *s, const float *x, Shape sh, int n) {
    batched_gemm(CUBLAS_OP_N, CUBLAS_OP_T, sh.D, sh.Tk, sh.Tq, 1.0f, x, sh.H * sh.D,
                 (long long)sh.group * sh.D, s, sh.Tk, (long long)sh.Tq * sh.Tk, 1.0f, z,
                 sh.KV * sh.D, sh.D, n);
}

// kv heads per set: as many as SCORES_CAP floats of scores allow
static int heads_per_set(Shape sh) {
    size_t per_head = (size_t)sh.Tq * sh.Tk;
    size_t n = per_head >= SCORES_CAP ? 1 : SCORES_CAP / per_head;
    return n < (size_t)sh.KV ? (int)n : sh.KV;
}

// first element of head (b, h) of a (B, T, heads, D) tensor
static size_t head_offset(int b, int t_len, int heads, int h, int D) {
    return ((size_t)b * t_len * heads + h) * D;
}

// f(set, qh, kh) for every head set of a call, in order; qh and kh are the offsets of the set's
// first head in the query-side (B, Tq, H, D) and key-side (B, Tk, KV, D) tensors
template <typename F> static void for_each_head_set(int B, Shape sh, F f) {
    int per_set = heads_per_set(sh);
    for (int b = 0; b < B; b++)
        for (int hh = 0; hh < sh.group; hh++)
            for (int g0 = 0; g0 < sh.KV; g0 += per_set) {
                HeadSet set = {b, hh, g0, per_set < sh.KV - g0 ? per_set : sh.KV - g0};
                f(set, head_offset(b, sh.Tq, sh.H, g0 * sh.group + hh, sh.D),
                  head_offset(b, sh.Tk, sh.KV, g0, sh.D));
            }
}

// element (head gi of the set, query row i) of a (B, H, Tq) tensor: lse, its block's, delta
__device__ static size_t row_index(HeadSet set, int gi, int i, int H, int group, int Tq) {
    return ((size_t)set.b * H + (set.g0 + gi) * group + set.hh) * Tq + i;
}

// Forward, per row (i, head gi of the set): the mask, then p = exp(s - lse_block), where lse_block
// is the log of the row's sum of exp over the keys it sees (-inf when it sees none).
// grid (Tq, n), ROW_THREADS threads
__global__ static void softmax_rows_kernel(float *s, float *block_lse, const int *q_pos,
                                           const int *k_pos, int Tq, int Tk, int H, HeadSet set,
                                           int group) {
    int i = blockIdx.x, gi = blockIdx.y;
    float *row = s + ((size_t)gi * Tq + i) * Tk;
    int qp = q_pos[i];
    float m = -INFINITY;
    for (int j = threadIdx.x; j < Tk; j += blockDim.x) {
        float x = k_pos[j] > qp ? -INFINITY : row[j]; // key j is seen iff k_pos[j] <= q_pos[i]
        row[j] = x;
        m = fmaxf(m, x);
    }
    m = block_reduce<true>(m);
    float sum = 0.0f;
    if (m != -INFINITY)
        for (int j = threadIdx.x; j < Tk; j += blockDim.x) sum += expf(row[j] - m);
    sum = block_reduce<false>(sum);
    float lse = sum > 0.0f ? m + logf(sum) : -INFINITY;
    for (int j = threadIdx.x; j < Tk; j += blockDim.x)
        row[j] = lse == -INFINITY ? 0.0f : expf(row[j] - lse);
    if (threadIdx.x == 0) block_lse[row_index(set, gi, i, H, group, Tq)] = lse;
}

// merge, per element of out (B, Tq, H, D): out = out * exp(lse - lse_new) + block_out *
// exp(block_lse - lse_new), lse_new = log(exp(lse) + exp(block_lse)); lse itself changes in
// merge_lse_kernel, after every element has read it
__device__ static float log_add_exp(float a, float b) {
    float top = fmaxf(a, b);
    return top + logf(expf(a - top) + expf(b - top));
}
__global__ static void merge_out_kernel(float *out, const float *lse, const float *block_out,
                                        const float *block_lse, int Tq, int H, int D, size_t n) {
    size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (idx >= n) return;
    size_t row = idx / D; // (b, i, h)
    int h = (int)(row % H), i = (int)((row / H) % Tq), b = (int)(row / H / Tq);
    size_t li = ((size_t)b * H + h) * Tq + i;
    if (block_lse[li] == -INFINITY) return; // every key of this block is in the row's future
    float lse_new = log_add_exp(lse[li], block_lse[li]);
    out[idx] = out[idx] * expf(lse[li] - lse_new) + block_out[idx] * expf(block_lse[li] - lse_new);
}
__global__ static void merge_lse_kernel(float *lse, const float *block_lse, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n && block_lse[i] != -INFINITY) lse[i] = log_add_exp(lse[i], block_lse[i]);
}

// q: (B, Tq, H, D)  k, v: (B, Tk, KV, D)  q_pos (Tq), k_pos (Tk)  out: (B, Tq, H, D)
// lse: (B, H, Tq), both running values merged with this block's softmax
void attention_forward_block(float *out, float *lse, const float *q, const float *k, const float *v,
                             const int *q_pos, const int *k_pos, int B, int Tq, int Tk, int H,
                             int KV, int D) {
    PROFILE(PROFILE_ATTENTION);
    if (B == 0 || Tq == 0 || Tk == 0 || H == 0) return;
    bf16_copies_stale(out, (size_t)B * Tq * H * D * sizeof(float));
    bf16_copies_stale(lse, (size_t)B * H * Tq * sizeof(float));
    if (compute_bf16 && flash_attention_supports(D))
        return flash_attention_forward(out, lse, q, k, v, q_pos, k_pos, B, Tq, Tk, H, KV, D);
    Shape sh = {Tq, Tk, H, KV, D, H / KV};
    size_t n_out = (size_t)B * Tq * H * D, n_lse = (size_t)B * H * Tq;
    float *s =
        (float *)device_scratch(&scores_buf, (size_t)heads_per_set(sh) * Tq * Tk * sizeof(float));
    float *block_lse = (float *)device_scratch(&block_lse_buf, n_lse * sizeof(float));
    float *block_out = (float *)device_scratch(&block_out_buf, n_out * sizeof(float));
    for_each_head_set(B, sh, [&](HeadSet set, size_t qh, size_t kh) {
        x_times_yt(s, q + qh, k + kh, 1.0f / sqrtf((float)D), sh, set.n);
        softmax_rows_kernel<<<dim3(Tq, set.n), ROW_THREADS>>>(s, block_lse, q_pos, k_pos, Tq, Tk, H,
                                                              set, sh.group);
        cudaCheckLaunch();
        s_times_y(block_out + qh, s, v + kh, 0.0f, sh, set.n); // block_out = p @ v
    });
    merge_out_kernel<<<blocks_for(n_out, 256), 256>>>(out, lse, block_out, block_lse, Tq, H, D,
                                                      n_out);
    cudaCheckLaunch();
    merge_lse_kernel<<<blocks_for(n_lse, 256), 256>>>(lse, block_lse, n_lse);
    cudaCheckLaunch();
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

// the softmax's sum_j p_j dp_j of each query row: delta (B, H, T) = rowsum(dout * out)
void attention_backward_delta(float *delta, const float *dout, const float *out, int B, int T,
                              int H, int D) {
    PROFILE(PROFILE_ATTENTION);
    size_t rows = (size_t)B * T * H;
    if (rows == 0) return;
    bf16_copies_stale(delta, rows * sizeof(float));
    attention_delta_kernel<<<blocks_for(rows * 32, 256), 256>>>(delta, dout, out, T, H, D, rows);
    cudaCheckLaunch();
}

// Backward, per element (head gi of the set, i, j): forward p = exp(scale * q.k - lse) on the
// keys row i sees (0 elsewhere, and 0 for a row that saw no key at all: it has no gradient)
__global__ static void probs_kernel(float *s, const float *lse, const int *q_pos, const int *k_pos,
                                    int Tq, int Tk, int H, HeadSet set, int group, size_t n) {
    size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (idx >= n) return;
    int j = (int)(idx % Tk), i = (int)((idx / Tk) % Tq), gi = (int)(idx / Tk / Tq);
    float lse_i = lse[row_index(set, gi, i, H, group, Tq)];
    s[idx] = lse_i == -INFINITY || k_pos[j] > q_pos[i] ? 0.0f : expf(s[idx] - lse_i);
}

// softmax backward: ds = p * (dp - delta), times scale for s = scale * q @ k^T; in place in dp
__global__ static void softmax_backward_kernel(float *dp, const float *p, const float *delta,
                                               float scale, int Tq, int Tk, int H, HeadSet set,
                                               int group, size_t n) {
    size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (idx >= n) return;
    int i = (int)((idx / Tk) % Tq), gi = (int)(idx / Tk / Tq);
    float delta_i = delta[row_index(set, gi, i, H, group, Tq)];
    dp[idx] = p[idx] * (dp[idx] - delta_i) * scale;
}

// dq (B, Tq, H, D), dk, dv (B, Tk, KV, D) += the gradients of this block; the query heads of a
// group add into their kv head's dk and dv one set after another (hh), never at once
void attention_backward_block(float *dq, float *dk, float *dv, const float *dout, const float *q,
                              const float *k, const float *v, const float *lse, const float *delta,
                              const int *q_pos, const int *k_pos, int B, int Tq, int Tk, int H,
                              int KV, int D) {
    PROFILE(PROFILE_ATTENTION);
    if (B == 0 || Tq == 0 || Tk == 0 || H == 0) return;
    bf16_copies_stale(dq, (size_t)B * Tq * H * D * sizeof(float));
    bf16_copies_stale(dk, (size_t)B * Tk * KV * D * sizeof(float));
    bf16_copies_stale(dv, (size_t)B * Tk * KV * D * sizeof(float));
    if (compute_bf16 && flash_attention_supports(D))
        return flash_attention_backward(dq, dk, dv, dout, q, k, v, lse, delta, q_pos, k_pos, B, Tq,
                                        Tk, H, KV, D);
    Shape sh = {Tq, Tk, H, KV, D, H / KV};
    float scale = 1.0f / sqrtf((float)D);
    size_t set_bytes = (size_t)heads_per_set(sh) * Tq * Tk * sizeof(float);
    float *p = (float *)device_scratch(&scores_buf, set_bytes);
    float *ds = (float *)device_scratch(&grads_buf, set_bytes);
    for_each_head_set(B, sh, [&](HeadSet set, size_t qh, size_t kh) {
        size_t n = (size_t)set.n * Tq * Tk;
        x_times_yt(p, q + qh, k + kh, scale, sh, set.n);
        probs_kernel<<<blocks_for(n, 256), 256>>>(p, lse, q_pos, k_pos, Tq, Tk, H, set, sh.group,
                                                  n);
        cudaCheckLaunch();
        // forward: out = p @ v  =>  dv += p^T @ dout, dp = dout @ v^T
        st_times_x(dv + kh, p, dout + qh, sh, set.n);
        x_times_yt(ds, dout + qh, v + kh, 1.0f, sh, set.n);
        softmax_backward_kernel<<<blocks_for(n, 256), 256>>>(ds, p, delta, scale, Tq, Tk, H, set,
                                                             sh.group, n);
        cudaCheckLaunch();
        // forward: s = q @ k^T  =>  dq += ds @ k, dk += ds^T @ q
        s_times_y(dq + qh, ds, k + kh, 1.0f, sh, set.n);
        st_times_x(dk + kh, ds, q + qh, sh, set.n);
    });
}
