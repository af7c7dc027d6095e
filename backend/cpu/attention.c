// Causal attention of one (query block, key/value block) pair, flash-attention style (Dao et
// al.): the softmax of each block is folded into the running (out, lse) with the log-sum-exp
// update, so ring attention (Liu et al.) can visit the key/value blocks one by one and plain
// attention is the ring of one. The backward recomputes probabilities from the final lse.
#include "backend/backend.h"
#include "utils.h"
#include <math.h>
#include <stdlib.h>

static inline float dot(const float *a, const float *b, int D) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int d = 0; d < D; d++) s += a[d] * b[d];
    return s;
}

static inline void axpy(float *y, float a, const float *x, int D) {
#pragma omp simd
    for (int d = 0; d < D; d++) y[d] += a * x[d];
}

// q: (B, Tq, H, D)  k, v: (B, Tk, KV, D)  q_pos (Tq), k_pos (Tk)  out: (B, Tq, H, D)
// lse: (B, H, Tq), both running values merged with this block's softmax
void attention_forward_block(float *out, float *lse, const float *q, const float *k,
                             const float *v, const int *q_pos, const int *k_pos, int B, int Tq,
                             int Tk, int H, int KV, int D) {
    float scale = 1.0f / sqrtf((float)D);
    int group = H / KV;   // query heads per kv head
#pragma omp parallel
    {
        float *scores = xmalloc(((size_t)Tk + 1) * sizeof(float));   // (Tk)
        float *acc = xmalloc((size_t)D * sizeof(float));              // (D)
        // rows get dearer further down a causal block: hand them out in small chunks
#pragma omp for collapse(3) schedule(dynamic, 8)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < H; h++) {
                for (int i = 0; i < Tq; i++) {
                    const float *qi = q + (((size_t)b * Tq + i) * H + h) * D;
                    const float *kb = k + ((size_t)b * Tk * KV + h / group) * D;
                    const float *vb = v + ((size_t)b * Tk * KV + h / group) * D;
                    // scores of the keys this query sees, and their max
                    float m = -INFINITY;
                    for (int j = 0; j < Tk; j++) {
                        if (k_pos[j] > q_pos[i]) {
                            scores[j] = -INFINITY;
                            continue;
                        }
                        scores[j] = scale * dot(qi, kb + (size_t)j * KV * D, D);
                        if (scores[j] > m) m = scores[j];
                    }
                    if (m == -INFINITY) continue;   // every key of this block is in the future
                    // this block's unnormalised softmax times v
                    float sum = 0.0f;
                    for (int d = 0; d < D; d++) acc[d] = 0.0f;
                    for (int j = 0; j < Tk; j++) {
                        if (scores[j] == -INFINITY) continue;
                        float p = expf(scores[j] - m);
                        sum += p;
                        axpy(acc, p, vb + (size_t)j * KV * D, D);
                    }
                    // merge: lse = log(exp(lse) + exp(lse_block)), out = weighted mean of both
                    float *lse_i = lse + ((size_t)b * H + h) * Tq + i;
                    float lse_block = m + logf(sum);
                    float top = fmaxf(*lse_i, lse_block);
                    float lse_new = top + logf(expf(*lse_i - top) + expf(lse_block - top));
                    float w_old = expf(*lse_i - lse_new);            // 0 when lse = -inf
                    float w_block = expf(lse_block - lse_new) / sum;
                    float *oi = out + (((size_t)b * Tq + i) * H + h) * D;
                    for (int d = 0; d < D; d++) oi[d] = oi[d] * w_old + acc[d] * w_block;
                    *lse_i = lse_new;
                }
            }
        }
        free(scores);
        free(acc);
    }
}

// delta (B, H, T) = rowsum(dout * out): the softmax backward's sum_j p_j dp_j, per query row
void attention_backward_delta(float *delta, const float *dout, const float *out, int B, int T,
                              int H, int D) {
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < H; h++) {
                size_t row = (((size_t)b * T + t) * H + h) * D;
                delta[((size_t)b * H + h) * T + t] = dot(dout + row, out + row, D);
            }
        }
    }
}

// Parallel over (batch, kv head): the query heads that share a kv head all add into its dk, dv,
// so they run on one thread; dq rows of different kv heads never overlap.
void attention_backward_block(float *dq, float *dk, float *dv, const float *dout, const float *q,
                              const float *k, const float *v, const float *lse,
                              const float *delta, const int *q_pos, const int *k_pos, int B,
                              int Tq, int Tk, int H, int KV, int D) {
    float scale = 1.0f / sqrtf((float)D);
    int group = H / KV;
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < B; b++) {
        for (int g = 0; g < KV; g++) {
            const float *kb = k + ((size_t)b * Tk * KV + g) * D;
            const float *vb = v + ((size_t)b * Tk * KV + g) * D;
            float *dkb = dk + ((size_t)b * Tk * KV + g) * D;
            float *dvb = dv + ((size_t)b * Tk * KV + g) * D;
            for (int h = g * group; h < (g + 1) * group; h++) {
                for (int i = 0; i < Tq; i++) {
                    float lse_i = lse[((size_t)b * H + h) * Tq + i];
                    if (lse_i == -INFINITY) continue;   // this row saw no key at all
                    float delta_i = delta[((size_t)b * H + h) * Tq + i];
                    size_t row = (((size_t)b * Tq + i) * H + h) * D;
                    const float *qi = q + row, *doi = dout + row;
                    float *dqi = dq + row;
                    for (int j = 0; j < Tk; j++) {
                        if (k_pos[j] > q_pos[i]) continue;
                        const float *kj = kb + (size_t)j * KV * D, *vj = vb + (size_t)j * KV * D;
                        // forward: p = exp(scale * q.k - lse), out = sum_j p_j v_j
                        float p = expf(scale * dot(qi, kj, D) - lse_i);
                        axpy(dvb + (size_t)j * KV * D, p, doi, D);    // dv += p * dout
                        float dp = dot(doi, vj, D);                   // dp = dout . v
                        float ds = p * (dp - delta_i) * scale;        // softmax backward
                        axpy(dqi, ds, kj, D);                         // dq += ds * k * scale
                        axpy(dkb + (size_t)j * KV * D, ds, qi, D);    // dk += ds * q * scale
                    }
                }
            }
        }
    }
}
