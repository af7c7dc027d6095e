// Cross-entropy from a vocab shard on the GPU (Megatron-LM's vocab-parallel loss): one block per
// row for the max and the sum of exponentials; the tensor-parallel code all-reduces them between
// the calls, exactly as on the CPU.
#include "backend/cuda/common.h"

__global__ static void cross_entropy_max_kernel(float *maxes, const float *logits, int V) {
    const float *l = logits + (size_t)blockIdx.x * V;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, l[j]);
    m = block_reduce<true>(m);
    if (threadIdx.x == 0) maxes[blockIdx.x] = m;
}

__global__ static void cross_entropy_sumexp_kernel(float *sumexp, float *target_logit,
                                                   const float *logits, const float *maxes,
                                                   const int *targets, int V, int vocab_start) {
    int n = blockIdx.x;
    const float *l = logits + (size_t)n * V;
    float m = maxes[n];
    float s = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) s += expf(l[j] - m);
    s = block_reduce<false>(s);
    if (threadIdx.x == 0) {
        sumexp[n] = s;
        int col = targets[n] - vocab_start;
        target_logit[n] = col >= 0 && col < V ? l[col] : 0.0f;
    }
}

__global__ static void cross_entropy_loss_kernel(float *losses, const float *maxes,
                                                 const float *sumexp, const float *target_logit,
                                                 int N) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n < N) losses[n] = logf(sumexp[n]) + maxes[n] - target_logit[n];
}

// grid (N rows, V tiles): one thread per logit. Rows go on x, which holds 2^31 - 1 blocks: N
// (micro_batch_size x seq_length) reaches 65536, one past the limit of y and z.
__global__ static void cross_entropy_backward_kernel(float *dlogits, const float *logits,
                                                     const float *maxes, const float *sumexp,
                                                     const int *targets, float dloss, int V,
                                                     int vocab_start) {
    int n = blockIdx.x;
    int j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= V) return;
    size_t idx = (size_t)n * V + j;
    // forward: loss = log(sumexp) + max - logit[target]
    // dlogits += dloss * (exp(logit - max) / sumexp - onehot(target)), in the CPU's two steps
    float inv = 1.0f / sumexp[n];
    float d = dlogits[idx] + dloss * (expf(logits[idx] - maxes[n]) * inv);
    if (j == targets[n] - vocab_start) d -= dloss;
    dlogits[idx] = d;
}

// logits (N, V), maxes (N)
void cross_entropy_max(float *maxes, const float *logits, int N, int V) {
    PROFILE(PROFILE_OTHER);
    if (N == 0) return;
    cross_entropy_max_kernel<<<N, ROW_THREADS>>>(maxes, logits, V);
    cudaCheckLaunch();
}

// maxes are the maxima over the full vocabulary, so every shard's exponentials share one scale
void cross_entropy_sumexp(float *sumexp, float *target_logit, const float *logits,
                          const float *maxes, const int *targets, int N, int V, int vocab_start) {
    PROFILE(PROFILE_OTHER);
    if (N == 0) return;
    cross_entropy_sumexp_kernel<<<N, ROW_THREADS>>>(sumexp, target_logit, logits, maxes, targets, V,
                                                    vocab_start);
    cudaCheckLaunch();
}

// -log softmax(logits)[target] = log(sum_j exp(l_j - max)) + max - l_target
void cross_entropy_loss(float *losses, const float *maxes, const float *sumexp,
                        const float *target_logit, int N) {
    PROFILE(PROFILE_OTHER);
    if (N == 0) return;
    cross_entropy_loss_kernel<<<blocks_for(N, 256), 256>>>(losses, maxes, sumexp, target_logit, N);
    cudaCheckLaunch();
}

void cross_entropy_backward(float *dlogits, const float *logits, const float *maxes,
                            const float *sumexp, const int *targets, float dloss, int N, int V,
                            int vocab_start) {
    PROFILE(PROFILE_OTHER);
    if (N == 0 || V == 0) return;
    dim3 grid(N, blocks_for(V, 256));
    cross_entropy_backward_kernel<<<grid, 256>>>(dlogits, logits, maxes, sumexp, targets, dloss, V,
                                                 vocab_start);
    cudaCheckLaunch();
}
