// Mamba-1's two sequence kernels (Gu and Dao 2023, "Mamba: Linear-Time Sequence Modeling with
// Selective State Spaces"; the reference loops of transformers' MambaMixer slow path): the causal
// depthwise conv1d with its SiLU, and the selective scan. Every channel i of d_inner runs its own
// recurrence over time, so the loops are threaded over channels; the projections around them are
// matmul_* (mamba.c). Tensors are token-major, (B, T, I): channel i of token (b, t) is element
// (b*T + t)*I + i.
#include <math.h>
#include <string.h>
#include "backend/backend.h"
#include "backend/cpu/fast_exp.h"
#include "utils.h"

static inline float sigmoid(float x) {
    return 1.0f / (1.0f + exp_approx(-x));
}

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
                out[o] = acc * sigmoid(acc); // silu
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
                    float s = sigmoid(pre[o]);
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

// torch's F.softplus (beta 1, threshold 20): above the threshold it is x itself, and so is its
// derivative 1 there; below, log(1 + e^x), whose derivative is sigmoid(x)
static inline float softplus(float x) {
    return x > 20.0f ? x : log1pf(expf(x));
}
static inline float softplus_grad(float x) {
    return x > 20.0f ? 1.0f : sigmoid(x);
}

// The selective scan of one channel (b, i), each of its S states its own first-order recurrence:
//   delta_t = softplus(dt_t + dt_bias)          the step size, chosen by the token (selective)
//   h_t[s]  = exp(delta_t * A[s]) * h_{t-1}[s] + delta_t * B_t[s] * u_t,  h_{-1} = 0
//   y_t     = sum_s C_t[s] * h_t[s] + D * u_t
// with A = -exp(A_log) < 0, so exp(delta * A) is a decay in (0, 1): a large delta forgets the
// state and takes the token in, a small one keeps the state and lets the token pass. Writes y_t
// and, unless hs is NULL, every state: hs (T, S), h_t at row t.
static void scan_channel(float *y, float *hs, const float *u, const float *dt, float dt_bias,
                         const float *A, const float *Bm, const float *Cm, float D, int T, int I,
                         int S, float *h) {
    for (int s = 0; s < S; s++) h[s] = 0.0f;
    for (int t = 0; t < T; t++) {
        float delta = softplus(dt[(size_t)t * I] + dt_bias), x = u[(size_t)t * I];
        const float *Bt = Bm + (size_t)t * S, *Ct = Cm + (size_t)t * S;
        float acc = D * x;
        for (int s = 0; s < S; s++) {
            h[s] = exp_approx(delta * A[s]) * h[s] + delta * Bt[s] * x;
            acc += Ct[s] * h[s];
        }
        if (hs) memcpy(hs + (size_t)t * S, h, (size_t)S * sizeof(float));
        if (y) y[(size_t)t * I] = acc;
    }
}

void selective_scan_forward(float *y, const float *u, const float *dt, const float *dt_bias,
                            const float *A_log, const float *Bm, const float *Cm, const float *D,
                            int B, int T, int I, int S) {
#pragma omp parallel
    {
        float *A = xmalloc((size_t)S * sizeof(float)), *h = xmalloc((size_t)S * sizeof(float));
#pragma omp for collapse(2)
        for (int b = 0; b < B; b++) {
            for (int i = 0; i < I; i++) {
                for (int s = 0; s < S; s++) A[s] = -expf(A_log[(size_t)i * S + s]);
                size_t o = (size_t)b * T * I + i; // channel i of token (b, 0)
                scan_channel(y + o, NULL, u + o, dt + o, dt_bias[i], A, Bm + (size_t)b * T * S,
                             Cm + (size_t)b * T * S, D[i], T, I, S, h);
            }
        }
        free(A);
        free(h);
    }
}

// The reverse scan of one channel (b, i), from its states hs (T, S) (recomputed by scan_channel:
// T*S floats a channel, where saving them would cost S times the activations). g[s] carries
// dL/dh_t[s] from t+1 down to t: h_{t+1} = exp(delta_{t+1} A) h_t + ... hands back
// exp(delta_{t+1} A) times its own. dB_t and dC_t (S) are shared by every channel: this channel
// adds its part to dBp and dCp (T, S), its group's. dA (S) sums d loss / d A over t.
static void scan_channel_backward(float *du, float *ddt, float *dBp, float *dCp, float *dA,
                                  float *dD, float *ddt_bias, const float *dy, const float *hs,
                                  const float *u, const float *dt, float dt_bias, const float *A,
                                  const float *Bm, const float *Cm, float D, int T, int I, int S,
                                  float *g) {
    for (int s = 0; s < S; s++) g[s] = 0.0f;
    for (int t = T - 1; t >= 0; t--) {
        size_t o = (size_t)t * I;
        float pre = dt[o] + dt_bias, delta = softplus(pre), x = u[o], dyt = dy[o];
        const float *h = hs + (size_t)t * S, *hprev = t > 0 ? h - S : NULL;
        const float *Bt = Bm + (size_t)t * S, *Ct = Cm + (size_t)t * S;
        float *dBt = dBp + (size_t)t * S, *dCt = dCp + (size_t)t * S;
        // forward: y_t = sum_s C_t[s] * h_t[s] + D * u_t
        float dx = dyt * D, ddelta = 0.0f;
        *dD += dyt * x;
        for (int s = 0; s < S; s++) {
            g[s] += dyt * Ct[s]; // now all of dL/dh_t[s]: through y_t and through h_{t+1}
            dCt[s] += dyt * h[s];
            // forward: h_t[s] = exp(delta_t * A[s]) * h_{t-1}[s] + delta_t * B_t[s] * u_t
            float decay = exp_approx(delta * A[s]), hp = hprev ? hprev[s] : 0.0f;
            ddelta += g[s] * (decay * A[s] * hp + Bt[s] * x);
            dA[s] += g[s] * decay * delta * hp;
            dBt[s] += g[s] * delta * x;
            dx += g[s] * delta * Bt[s];
            g[s] *= decay; // what h_t hands back to h_{t-1}
        }
        du[o] = dx;
        // forward: delta_t = softplus(dt_t + dt_bias)
        ddt[o] = ddelta * softplus_grad(pre);
        *ddt_bias += ddt[o];
    }
}

// Channels are taken SCAN_GROUP at a time: a group's partial dB and dC are summed over the groups
// in group order afterwards, so the result does not depend on the number of threads or on which
// thread ran which group (a checkpoint resumed on other cores gives the same bits).
#define SCAN_GROUP 16

void selective_scan_backward(float *du, float *ddt, float *dBm, float *dCm, float *ddt_bias,
                             float *dA_log, float *dD, const float *dy, const float *u,
                             const float *dt, const float *dt_bias, const float *A_log,
                             const float *Bm, const float *Cm, const float *D, int B, int T, int I,
                             int S) {
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
        for (int grp = 0; grp < G; grp++) {
            int i1 = (grp + 1) * SCAN_GROUP < I ? (grp + 1) * SCAN_GROUP : I;
            for (int i = grp * SCAN_GROUP; i < i1; i++) {
                for (int s = 0; s < S; s++) A[s] = -expf(A_log[(size_t)i * S + s]), dA[s] = 0.0f;
                for (int b = 0; b < B; b++) {
                    size_t o = (size_t)b * T * I + i, bs = (size_t)b * T * S;
                    scan_channel(NULL, hs, u + o, dt + o, dt_bias[i], A, Bm + bs, Cm + bs, D[i], T,
                                 I, S, g);
                    scan_channel_backward(du + o, ddt + o, dBp + grp * NS + bs, dCp + grp * NS + bs,
                                          dA, &dD[i], &ddt_bias[i], dy + o, hs, u + o, dt + o,
                                          dt_bias[i], A, Bm + bs, Cm + bs, D[i], T, I, S, g);
                }
                // forward: A = -exp(A_log), so dA/dA_log = -exp(A_log) = A
                for (int s = 0; s < S; s++) dA_log[(size_t)i * S + s] += dA[s] * A[s];
            }
        }
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
