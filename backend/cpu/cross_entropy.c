// Cross-entropy from a vocab shard (Megatron-LM's vocab-parallel loss): each rank reduces its
// columns to a max, a sum of exponentials and the target's logit; the tensor-parallel code
// all-reduces those (max, then sums) between the calls, so no rank holds the full vocabulary.
#include "backend/backend.h"
#include <math.h>

// logits (N, V), maxes (N)
void cross_entropy_max(float *maxes, const float *logits, int N, int V) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *l = logits + (size_t)n * V;
        float m = -INFINITY;
        for (int j = 0; j < V; j++) m = l[j] > m ? l[j] : m;
        maxes[n] = m;
    }
}

// maxes are the maxima over the full vocabulary, so every shard's exponentials share one scale
void cross_entropy_sumexp(float *sumexp, float *target_logit, const float *logits,
                          const float *maxes, const int *targets, int N, int V, int vocab_start) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *l = logits + (size_t)n * V;
        float s = 0.0f;
        for (int j = 0; j < V; j++) s += expf(l[j] - maxes[n]);
        sumexp[n] = s;
        int col = targets[n] - vocab_start;
        target_logit[n] = col >= 0 && col < V ? l[col] : 0.0f;
    }
}

// -log softmax(logits)[target] = log(sum_j exp(l_j - max)) + max - l_target
void cross_entropy_loss(float *losses, const float *maxes, const float *sumexp,
                        const float *target_logit, int N) {
    for (int n = 0; n < N; n++) losses[n] = logf(sumexp[n]) + maxes[n] - target_logit[n];
}

void cross_entropy_backward(float *dlogits, const float *logits, const float *maxes,
                            const float *sumexp, const int *targets, float dloss, int N, int V,
                            int vocab_start) {
    // forward: loss = log(sumexp) + max - logit[target]
    // dlogits += dloss * (exp(logit - max) / sumexp - onehot(target))
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *l = logits + (size_t)n * V;
        float *dl = dlogits + (size_t)n * V;
        float inv = 1.0f / sumexp[n];
        for (int j = 0; j < V; j++) dl[j] += dloss * (expf(l[j] - maxes[n]) * inv);
        int col = targets[n] - vocab_start;
        if (col >= 0 && col < V) dl[col] -= dloss;
    }
}
