// Mixture of experts: the router of Mixtral (Jiang et al. 2024, as Hugging Face transformers'
// MixtralTopKRouter computes it), Switch Transformer's load-balancing loss (Fedus et al. 2021,
// eq. 4-6) and the shuffles that put each expert's tokens in contiguous rows, with GShard's
// expert capacity (Lepikhin et al. 2020): an expert takes at most `capacity` pairs, the first
// ones in token order. The experts themselves are matmul_* and swiglu_* on those rows (moe.c).
#include "backend/backend.h"
#include "backend/moe_route.h"
#include <math.h>
#include <string.h>

void moe_router_forward(float *probs, int *topk_ids, float *topk_w, const float *logits, int N,
                        int E, int K) {
#pragma omp parallel for
    for (int n = 0; n < N; n++)
        moe_route_token(probs + (size_t)n * E, topk_ids + (size_t)n * K, topk_w + (size_t)n * K,
                        logits + (size_t)n * E, E, K);
}

void moe_dispatch(int *counts, int *offsets, int *pos, const int *topk_ids, int N, int E, int K,
                  int capacity) {
    memset(counts, 0, (size_t)E * sizeof(int));
    for (int i = 0; i < N * K; i++) counts[topk_ids[i]]++;
    offsets[0] = 0;
    for (int e = 0; e < E; e++) {
        int kept = capacity > 0 && counts[e] > capacity ? capacity : counts[e];
        offsets[e + 1] = offsets[e] + kept;
    }
    // counts again, as each expert's cursor: pair i is the r-th of its expert in token order
    memset(counts, 0, (size_t)E * sizeof(int));
    for (int i = 0; i < N * K; i++) {
        int e = topk_ids[i], r = counts[e]++;
        pos[i] = capacity > 0 && r >= capacity ? -1 : offsets[e] + r;
    }
}

void moe_load(float *load, const float *probs, const int *counts, int N, int E) {
    // load[e] = counts[e] (before capacity drops), load[E + e] = sum_n probs[n, e]
    for (int e = 0; e < E; e++) {
        double P = 0.0;
        for (int n = 0; n < N; n++) P += probs[(size_t)n * E + e];
        load[e] = (float)counts[e];
        load[E + e] = (float)P;
    }
}

void moe_gather_forward(float *x_sorted, const float *x, const int *pos, int N, int C, int K) {
#pragma omp parallel for
    for (int i = 0; i < N * K; i++) {
        if (pos[i] < 0) continue;
        memcpy(x_sorted + (size_t)pos[i] * C, x + (size_t)(i / K) * C, (size_t)C * sizeof(float));
    }
}

void moe_gather_backward(float *dx, const float *dx_sorted, const int *pos, int N, int C, int K) {
    // forward: x_sorted[pos[n, j]] = x[n]
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        for (int c = 0; c < C; c++) {
            float d = dx[(size_t)n * C + c];
            for (int j = 0; j < K; j++) {
                int p = pos[(size_t)n * K + j];
                if (p >= 0) d += dx_sorted[(size_t)p * C + c];
            }
            dx[(size_t)n * C + c] = d;
        }
    }
}

void moe_combine_forward(float *y, const float *out_sorted, const float *topk_w, const int *pos,
                         int N, int C, int K) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        for (int c = 0; c < C; c++) {
            float acc = 0.0f;
            for (int j = 0; j < K; j++) {
                int p = pos[(size_t)n * K + j];
                if (p >= 0) acc += topk_w[(size_t)n * K + j] * out_sorted[(size_t)p * C + c];
            }
            y[(size_t)n * C + c] = acc;
        }
    }
}

void moe_combine_backward(float *dout_sorted, float *dtopk_w, const float *dy,
                          const float *out_sorted, const float *topk_w, const int *pos, int N,
                          int C, int K) {
    // forward: y[n] = sum_j w[n, j] * out_sorted[pos[n, j]]
    // dout_sorted[pos] += w[n, j] * dy[n]; dw[n, j] += dy[n] . out_sorted[pos]
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *d = dy + (size_t)n * C;
        for (int j = 0; j < K; j++) {
            int p = pos[(size_t)n * K + j];
            if (p < 0) continue; // dropped: y does not depend on this pair
            float w = topk_w[(size_t)n * K + j], dot = 0.0f;
            float *ds = dout_sorted + (size_t)p * C;
            const float *o = out_sorted + (size_t)p * C;
            for (int c = 0; c < C; c++) ds[c] += w * d[c], dot += d[c] * o[c];
            dtopk_w[(size_t)n * K + j] += dot;
        }
    }
}

void moe_router_backward(float *dlogits, const float *dtopk_w, const float *probs,
                         const int *topk_ids, const float *topk_w, const float *counts,
                         float aux_scale, int tokens, int N, int E, int K) {
    // forward: aux = E * sum_e (counts[e] / tokens) * (1/tokens) sum_n p[n, e]
    //   => d aux / d p[n, e] = E * counts[e] / tokens^2
    float aux_coef = tokens > 0 ? aux_scale * (float)E / ((float)tokens * (float)tokens) : 0.0f;
#pragma omp parallel for
    for (int n = 0; n < N; n++)
        moe_route_token_backward(dlogits + (size_t)n * E, dtopk_w + (size_t)n * K,
                                 probs + (size_t)n * E, topk_ids + (size_t)n * K,
                                 topk_w + (size_t)n * K, counts, aux_coef, E, K);
}
