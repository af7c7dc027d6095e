// Cross-entropy from a vocab shard on the GPU (Megatron-LM's vocab-parallel loss), in two passes
// over the (N, V) logits: one block per row reduces its shard to (max, sum of exp) in a single
// read, with the online softmax's running rescale (Milakov & Gimelshein 2018); the
// tensor-parallel code merges the shards' pairs between the calls, exactly as on the CPU; then
// the backward reads the logits once more and writes dlogits whole, so no pass of zeros over the
// (N, V) buffer is needed before it.
#include "backend/cuda/common.h"

// (m, s): a running max and the sum of exp(x - m) over the values seen so far
__device__ static inline void online_add(float &m, float &s, float x) {
    if (x > m) {
        s = s * expf(m - x) + 1.0f;
        m = x;
    } else {
        s += expf(x - m);
    }
}

// merges (m2, s2) into (m, s); a pair that saw nothing is (-INFINITY, 0), and adds nothing
__device__ static inline void online_merge(float &m, float &s, float m2, float s2) {
    if (m2 == -INFINITY) return;
    float mm = fmaxf(m, m2);
    s = s * expf(m - mm) + s2 * expf(m2 - mm);
    m = mm;
}

// one block of ROW_THREADS per row. Each thread walks its columns j, j + ROW_THREADS, .. four
// loads at a time; the threads' pairs merge in a fixed order (each warp's butterfly, then thread
// 0 over the warps in turn), so a row's result is the same bits from run to run.
__global__ static void cross_entropy_stats_kernel(float *maxes, float *sumexp, float *target_logit,
                                                  const float *logits, const int *targets, int V,
                                                  int vocab_start) {
    __shared__ float warp_m[ROW_THREADS / 32], warp_s[ROW_THREADS / 32];
    int n = blockIdx.x;
    const float *l = logits + (size_t)n * V;
    float m = -INFINITY, s = 0.0f;
    int j = threadIdx.x;
    for (; j + 3 * ROW_THREADS < V; j += 4 * ROW_THREADS) {
        float x0 = l[j], x1 = l[j + ROW_THREADS], x2 = l[j + 2 * ROW_THREADS];
        float x3 = l[j + 3 * ROW_THREADS];
        online_add(m, s, x0), online_add(m, s, x1), online_add(m, s, x2), online_add(m, s, x3);
    }
    for (; j < V; j += ROW_THREADS) online_add(m, s, l[j]);
    for (int o = 16; o > 0; o >>= 1)
        online_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
    if (threadIdx.x % 32 == 0) warp_m[threadIdx.x / 32] = m, warp_s[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < ROW_THREADS / 32; w++) online_merge(m, s, warp_m[w], warp_s[w]);
        maxes[n] = m;
        sumexp[n] = s;
        int col = targets[n] - vocab_start;
        target_logit[n] = col >= 0 && col < V ? l[col] : 0.0f;
    }
}

__global__ static void cross_entropy_rescale_kernel(float *sumexp, const float *shard_maxes,
                                                    const float *maxes, int N) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n < N) sumexp[n] *= expf(shard_maxes[n] - maxes[n]);
}

__global__ static void cross_entropy_loss_kernel(float *losses, const float *maxes,
                                                 const float *sumexp, const float *target_logit,
                                                 int N) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n < N) losses[n] = logf(sumexp[n]) + maxes[n] - target_logit[n];
}

// grid (N rows, V tiles): one thread per logit. Rows go on x, which holds 2^31 - 1 blocks: N
// (micro_batch_size x seq_length) reaches 65536, one past the limit of y and z.
// dlogits16: dlogits' bf16 copy for the head's products, or NULL
__global__ static void cross_entropy_backward_kernel(float *dlogits, __nv_bfloat16 *dlogits16,
                                                     const float *logits, const float *maxes,
                                                     const float *sumexp, const int *targets,
                                                     float dloss, int V, int vocab_start) {
    int n = blockIdx.x;
    int j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= V) return;
    size_t idx = (size_t)n * V + j;
    // forward: loss = log(sumexp) + max - logit[target]
    // dlogits = dloss * (exp(logit - max) / sumexp - onehot(target)), in the CPU's two steps
    float inv = 1.0f / sumexp[n];
    float d = dloss * (expf(logits[idx] - maxes[n]) * inv);
    if (j == targets[n] - vocab_start) d -= dloss;
    dlogits[idx] = d;
    if (dlogits16) dlogits16[idx] = __float2bfloat16_rn(d);
}

// logits (N, V); maxes, sumexp, target_logit (N)
void cross_entropy_stats(float *maxes, float *sumexp, float *target_logit, const float *logits,
                         const int *targets, int N, int V, int vocab_start) {
    PROFILE(PROFILE_OTHER);
    if (N == 0) return;
    bf16_copies_stale(maxes, N * sizeof(float));
    bf16_copies_stale(sumexp, N * sizeof(float));
    bf16_copies_stale(target_logit, N * sizeof(float));
    cross_entropy_stats_kernel<<<N, ROW_THREADS>>>(maxes, sumexp, target_logit, logits, targets, V,
                                                   vocab_start);
    cudaCheckLaunch();
}

void cross_entropy_rescale(float *sumexp, const float *shard_maxes, const float *maxes, int N) {
    PROFILE(PROFILE_OTHER);
    if (N == 0) return;
    bf16_copies_stale(sumexp, N * sizeof(float));
    cross_entropy_rescale_kernel<<<blocks_for(N, 256), 256>>>(sumexp, shard_maxes, maxes, N);
    cudaCheckLaunch();
}

// -log softmax(logits)[target] = log(sum_j exp(l_j - max)) + max - l_target
void cross_entropy_loss(float *losses, const float *maxes, const float *sumexp,
                        const float *target_logit, int N) {
    PROFILE(PROFILE_OTHER);
    if (N == 0) return;
    bf16_copies_stale(losses, N * sizeof(float));
    cross_entropy_loss_kernel<<<blocks_for(N, 256), 256>>>(losses, maxes, sumexp, target_logit, N);
    cudaCheckLaunch();
}

void cross_entropy_backward(float *dlogits, const float *logits, const float *maxes,
                            const float *sumexp, const int *targets, float dloss, int N, int V,
                            int vocab_start) {
    PROFILE(PROFILE_OTHER);
    if (N == 0 || V == 0) return;
    dim3 grid(N, blocks_for(V, 256));
    __nv_bfloat16 *dlogits16 = bf16_copy_to_write(dlogits, (size_t)N * V);
    cross_entropy_backward_kernel<<<grid, 256>>>(dlogits, dlogits16, logits, maxes, sumexp,
                                                 targets, dloss, V, vocab_start);
    cudaCheckLaunch();
}
