// Mamba-1's two sequence kernels (Gu and Dao 2023, "Mamba: Linear-Time Sequence Modeling with
// Selective State Spaces"; the reference loops of transformers' MambaMixer slow path): the causal
// depthwise conv1d with its SiLU, and the selective scan, whose recurrence (forward and reverse)
// is backend/mamba_scan.h's, shared with the CUDA kernels. Every channel i of d_inner runs on its
// own over time, so the loops are threaded over channels; the projections around them are
// matmul_* (mamba.c). Tensors are token-major, (B, T, I): channel i of token (b, t) is element
// (b*T + t)*I + i.
#include <math.h>
#include <string.h>
#include "backend/backend.h"
#include "backend/mamba_scan.h"
#include "utils.h"

void causal_conv1d_forward(float *out, float *pre, const float *x, const float *weight,
                           const float *bias, int B, int T, int I, int W) {
    // pre[t] = bias + sum_k weight[k] * x[t - (W-1) + k]: torch's conv1d with W-1 zeros of padding
    // on the left, cut to the first T outputs, so token t sees tokens t-W+1 .. t and none after
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < I; i++) {
            const float *xc = x + (size_t)b * T * I + i, *w = weight + (size_t)i * W;
            for (int t = 0; t < T; t++) {
                float acc = bias ? bias[i] : 0.0f;
                for (int k = 0; k < W; k++) {
                    int src = t - (W - 1) + k;
                    if (src >= 0) acc += w[k] * xc[(size_t)src * I];
                }
                size_t o = ((size_t)b * T + t) * I + i;
                pre[o] = acc;
                out[o] = acc * scan_sigmoid(acc); // silu
            }
        }
    }
}

void causal_conv1d_backward(float *dx, float *dweight, float *dbias, const float *dout,
                            const float *x, const float *pre, const float *weight, int B, int T,
                            int I, int W) {
    // one channel's weight and bias gather over every (b, t): the thread of channel i owns them
#pragma omp parallel
    {
        float *dpre = xmalloc((size_t)T * sizeof(float)); // one channel's column, (T)
        float *dw = xmalloc((size_t)W * sizeof(float));
#pragma omp for
        for (int i = 0; i < I; i++) {
            const float *w = weight + (size_t)i * W;
            float db = 0.0f;
            memset(dw, 0, (size_t)W * sizeof(float));
            for (int b = 0; b < B; b++) {
                size_t base = (size_t)b * T * I + i;
                // forward: out = pre * sigmoid(pre)
                for (int t = 0; t < T; t++) {
                    size_t o = base + (size_t)t * I;
                    float s = scan_sigmoid(pre[o]);
                    dpre[t] = dout[o] * s * (1.0f + pre[o] * (1.0f - s));
                    db += dpre[t];
                }
                // forward: pre[t] = bias + sum_k w[k] * x[t - (W-1) + k]
                for (int j = 0; j < T; j++) {
                    float acc = 0.0f;
                    for (int k = 0; k < W; k++) {
                        int t = j + (W - 1) - k; // the output that read x[j] through tap k
                        if (t < T) acc += w[k] * dpre[t];
                        int src = j - (W - 1) + k; // the x that tap k of output j read
                        if (src >= 0) dw[k] += dpre[j] * x[base + (size_t)src * I];
                    }
                    dx[base + (size_t)j * I] = acc;
                }
            }
            for (int k = 0; k < W; k++) dweight[(size_t)i * W + k] += dw[k];
            if (dbias) dbias[i] += db;
        }
        free(dpre);
        free(dw);
    }
}

void selective_scan_chunk_forward(float *y, const float *u, const float *dt, const float *dt_bias,
                                  const float *A_log, const float *Bm, const float *Cm,
                                  const float *D, int B, int T, int I, int S, const float *h0,
                                  float *h_last, float *decay) {
#pragma omp parallel
    {
        float *A = xmalloc((size_t)S * sizeof(float)), *h = xmalloc((size_t)S * sizeof(float));
#pragma omp for collapse(2)
        for (int b = 0; b < B; b++) {
            for (int i = 0; i < I; i++) {
                for (int s = 0; s < S; s++) A[s] = -expf(A_log[(size_t)i * S + s]);
                size_t o = (size_t)b * T * I + i, bs = (size_t)b * T * S; // token (b, 0)
                size_t c = ((size_t)b * I + i) * S;                       // its state
                scan_channel(y + o, NULL, u + o, dt + o, dt_bias[i], A, Bm + bs, Cm + bs, D[i], T,
                             I, S, h, h0 ? h0 + c : NULL, h_last ? h_last + c : NULL,
                             decay ? decay + c : NULL);
            }
        }
        free(A), free(h);
    }
}

void selective_scan_forward(float *y, const float *u, const float *dt, const float *dt_bias,
                            const float *A_log, const float *Bm, const float *Cm, const float *D,
                            int B, int T, int I, int S) {
    selective_scan_chunk_forward(y, u, dt, dt_bias, A_log, Bm, Cm, D, B, T, I, S, NULL, NULL, NULL);
}

void selective_scan_chunk_backward(float *du, float *ddt, float *dBm, float *dCm, float *ddt_bias,
                                   float *dA_log, float *dD, const float *dy, const float *u,
                                   const float *dt, const float *dt_bias, const float *A_log,
                                   const float *Bm, const float *Cm, const float *D, int B, int T,
                                   int I, int S, const float *h0, const float *g_last, float *dh0) {
    int G = (I + SCAN_GROUP - 1) / SCAN_GROUP;
    size_t NS = (size_t)B * T * S;
    float *dBp = xmalloc((size_t)G * NS * sizeof(float)); // (G, B, T, S), zeroed
    float *dCp = xmalloc((size_t)G * NS * sizeof(float));
#pragma omp parallel
    {
        float *A = xmalloc((size_t)S * sizeof(float)), *dA = xmalloc((size_t)S * sizeof(float));
        float *g = xmalloc((size_t)S * sizeof(float));
        float *hs = xmalloc((size_t)T * S * sizeof(float));
#pragma omp for
        for (int grp = 0; grp < G; grp++)
            scan_group_backward(du, ddt, dBp + grp * NS, dCp + grp * NS, ddt_bias, dA_log, dD, dy,
                                u, dt, dt_bias, A_log, Bm, Cm, D, grp, B, T, I, S, A, dA, g, hs, h0,
                                g_last, dh0);
        free(A), free(dA), free(g), free(hs);
    }
#pragma omp parallel for
    for (size_t n = 0; n < NS; n++) {
        float b = 0.0f, c = 0.0f;
        for (int grp = 0; grp < G; grp++) b += dBp[grp * NS + n], c += dCp[grp * NS + n];
        dBm[n] = b, dCm[n] = c;
    }
    free(dBp), free(dCp);
}

void selective_scan_backward(float *du, float *ddt, float *dBm, float *dCm, float *ddt_bias,
                             float *dA_log, float *dD, const float *dy, const float *u,
                             const float *dt, const float *dt_bias, const float *A_log,
                             const float *Bm, const float *Cm, const float *D, int B, int T, int I,
                             int S) {
    selective_scan_chunk_backward(du, ddt, dBm, dCm, ddt_bias, dA_log, dD, dy, u, dt, dt_bias,
                                  A_log, Bm, Cm, D, B, T, I, S, NULL, NULL, NULL);
}
