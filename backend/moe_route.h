// Mixtral's routing of one token, forward and backward, shared by backend/cpu/moe.c and
// backend/cuda/moe.cu (one thread per token there) so that both devices compute from the same
// source: the softmax of the router's logits in float, as Mixtral's router_logits.float(), the K
// largest probabilities, and those K renormalised to sum to 1.
#pragma once
#include <math.h>
#include "backend/host_device.h"

// p (E) = softmax(l (E)); ids (K) the experts chosen, largest first; w (K) their renormalised probs
static HOST_DEVICE void moe_route_token(float *p, int *ids, float *w, const float *l, int E,
                                        int K) {
    float m = -INFINITY, sum = 0.0f;
    for (int e = 0; e < E; e++) m = fmaxf(m, l[e]);
    for (int e = 0; e < E; e++) p[e] = expf(l[e] - m), sum += p[e];
    for (int e = 0; e < E; e++) p[e] /= sum;
    // choice j is the largest prob that comes after choice j-1 in the order (prob descending,
    // index ascending): ties go to the lower index, and no "taken" mask is needed
    float chosen = 0.0f;
    for (int j = 0, prev = -1; j < K; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int after = prev < 0 || p[e] < p[prev] || (p[e] == p[prev] && e > prev);
            if (after && (best < 0 || p[e] > p[best])) best = e;
        }
        if (best < 0) best = j; // only a NaN row gets here: keep the index valid, NaN flows on
        ids[j] = prev = best;
        chosen += p[best];
    }
    for (int j = 0; j < K; j++) w[j] = p[ids[j]] / chosen;
}

// dl (E) += the gradient of the token's logits, from dw (K), the gradient of its weights w (K),
// and the load-balancing loss's d aux / d p[e] = aux_coef * counts[e] (aux_coef: its scale times
// E / tokens^2; the counts are constants)
static HOST_DEVICE void moe_route_token_backward(float *dl, const float *dw, const float *p,
                                                 const int *ids, const float *w,
                                                 const float *counts, float aux_coef, int E,
                                                 int K) {
    // forward: w_j = p[ids_j] / s, s = sum_j p[ids_j]
    //   => d/dp[ids_i] = (dw_i - sum_j dw_j w_j) / s, and 0 for the experts not chosen
    float s = 0.0f, dot = 0.0f;
    for (int j = 0; j < K; j++) s += p[ids[j]], dot += dw[j] * w[j];
    // forward: p = softmax(l)  =>  dl_e = p_e * (dp_e - sum_k p_k dp_k)
    float pdp = 0.0f;
    for (int e = 0; e < E; e++) pdp += p[e] * aux_coef * counts[e];
    for (int j = 0; j < K; j++) pdp += p[ids[j]] * (dw[j] - dot) / s;
    for (int e = 0; e < E; e++) dl[e] += p[e] * (aux_coef * counts[e] - pdp);
    for (int j = 0; j < K; j++) dl[ids[j]] += p[ids[j]] * (dw[j] - dot) / s;
}
