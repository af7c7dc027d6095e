// Cross-entropy from a vocab shard (Megatron-LM's vocab-parallel loss): each rank reduces its
// columns to a max, a sum of exponentials and the target's logit; the tensor-parallel code
// merges those over the ranks (the max, then the sums rescaled to it) between the calls, so no
// rank holds the full vocabulary.
#include "backend/backend.h"
#include "backend/kernel_time.h"
#include <math.h>

// logits (N, V); maxes, sumexp, target_logit (N)
void cross_entropy_stats(float *maxes, float *sumexp, float *target_logit, const float *logits,
                         const int *targets, int N, int V, int vocab_start) {
    KERNEL_TIME(KT_LOSS, 0, 4.0 * N * V);
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *l = logits + (size_t)n * V;
        float m = -INFINITY, s = 0.0f;
        for (int j = 0; j < V; j++) m = l[j] > m ? l[j] : m;
        for (int j = 0; j < V; j++) s += expf(l[j] - m);
        maxes[n] = m;
        sumexp[n] = s;
        int col = targets[n] - vocab_start;
        target_logit[n] = col >= 0 && col < V ? l[col] : 0.0f;
    }
}

// sum_j exp(l_j - shard_max) * exp(shard_max - max) = sum_j exp(l_j - max)
void cross_entropy_rescale(float *sumexp, const float *shard_maxes, const float *maxes, int N) {
    for (int n = 0; n < N; n++) sumexp[n] *= expf(shard_maxes[n] - maxes[n]);
}

// -log softmax(logits)[target] = log(sum_j exp(l_j - max)) + max - l_target
void cross_entropy_loss(float *losses, const float *maxes, const float *sumexp,
                        const float *target_logit, int N) {
    for (int n = 0; n < N; n++) losses[n] = logf(sumexp[n]) + maxes[n] - target_logit[n];
}

void cross_entropy_backward(float *dlogits, const float *logits, const float *maxes,
                            const float *sumexp, const int *targets, float dloss, int N, int V,
                            int vocab_start) {
    KERNEL_TIME(KT_LOSS, 0, 8.0 * N * V);
    // forward: loss = log(sumexp) + max - logit[target]
    // dlogits = dloss * (exp(logit - max) / sumexp - onehot(target))
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *l = logits + (size_t)n * V;
        float *dl = dlogits + (size_t)n * V;
        float inv = 1.0f / sumexp[n];
        for (int j = 0; j < V; j++) dl[j] = dloss * (expf(l[j] - maxes[n]) * inv);
        int col = targets[n] - vocab_start;
        if (col >= 0 && col < V) dl[col] -= dloss;
    }
}
