// The selective scan of Mamba-1 (Gu and Dao 2023, section 3; transformers' mamba_selective_scan,
// its recurrent loop), forward and reverse, one channel at a time: shared by backend/cpu/mamba.c
// and backend/cuda/mamba.cu so that both devices compute from the same source.
//
// Channel i of sequence b has S states, each its own first-order linear recurrence in time:
//   delta_t = softplus(dt_t + dt_bias)                   the step, chosen by the token
//   h_t[s]  = exp(delta_t * A[s]) * h_{t-1}[s] + delta_t * B_t[s] * u_t,   h_{-1} = 0
//   y_t     = sum_s C_t[s] * h_t[s] + D * u_t
// A = -exp(A_log) < 0 makes exp(delta * A) a decay in (0, 1): a large delta forgets the state and
// takes the token in, a small one keeps the state and lets the token pass. B_t (what to write)
// and C_t (what to read) come from the token too, and are shared by the channels.
//
// The reverse scan runs t from T-1 down to 0 carrying g[s] = dL/dh_t[s]. h_t feeds y_t (through
// C_t) and h_{t+1} (through the decay exp(delta_{t+1} A)), so
//   g_t[s] = dy_t * C_t[s] + exp(delta_{t+1} A[s]) * g_{t+1}[s]
// a recurrence of the same shape as the forward's, run backwards. From g_t, the step t line of
// the forward gives every other gradient (scan_channel_backward quotes it). The backward needs
// h_{t-1} at step t: it recomputes the channel's T states first (T*S floats of scratch), where
// saving them in the forward would cost S times the activations.
// Tensors are token-major: channel i of token (b, t) is element (b*T + t)*I + i; B_t, C_t are
// rows of Bm, Cm (B, T, S).
#pragma once
#include <math.h>
#include "backend/host_device.h"

// The CPU's exp is fast_exp.h's (1 ulp, and its loops vectorise); CUDA's expf is the device's own.
// SCAN_SIMD(sums) lets gcc run a loop over the states in vector lanes, each of the sums named
// kept in one partial sum per lane (an order fixed by the build: the bits do not change from run
// to run or with the threads): 2.4x faster scans at state_size 16. nvcc's host compiler, which
// has no OpenMP, must not see the pragma.
#ifdef __CUDACC__
#define scan_exp expf
#define SCAN_SIMD(...)
#else
#include "backend/cpu/fast_exp.h"
#define scan_exp          exp_approx
#define SCAN_PRAGMA(text) _Pragma(#text)
#define SCAN_SIMD(...)    SCAN_PRAGMA(omp simd reduction(+ : __VA_ARGS__))
#endif

static HOST_DEVICE inline float scan_sigmoid(float x) {
    return 1.0f / (1.0f + scan_exp(-x));
}

// torch's F.softplus (beta 1, threshold 20): above the threshold it is x itself, and its
// derivative 1; below, log(1 + e^x), whose derivative is sigmoid(x)
static HOST_DEVICE inline float softplus(float x) {
    return x > 20.0f ? x : log1pf(expf(x));
}
static HOST_DEVICE inline float softplus_grad(float x) {
    return x > 20.0f ? 1.0f : scan_sigmoid(x);
}

// One channel: y (T) at stride I (unless NULL), every state into hs (T, S) (unless NULL);
// u, dt (T) at stride I; A (S) = -exp(A_log[i]); Bm, Cm (T, S); h (S) scratch. A chunk of a
// longer sequence (context parallelism): h0 (S) the state before its first token (NULL: zero),
// h_last (S) receives the state after its last, decay (S) the product of its decays
// exp(sum_t delta_t A) (each NULL: not wanted)
static HOST_DEVICE void scan_channel(float *y, float *hs, const float *u, const float *dt,
                                     float dt_bias, const float *A, const float *Bm,
                                     const float *Cm, float D, int T, int I, int S, float *h,
                                     const float *h0, float *h_last, float *decay) {
    float deltas = 0.0f;
    for (int s = 0; s < S; s++) h[s] = h0 ? h0[s] : 0.0f;
    for (int t = 0; t < T; t++) {
        float delta = softplus(dt[(size_t)t * I] + dt_bias), x = u[(size_t)t * I];
        deltas += delta;
        const float *Bt = Bm + (size_t)t * S, *Ct = Cm + (size_t)t * S;
        float acc = D * x;
        SCAN_SIMD(acc)
        for (int s = 0; s < S; s++) {
            h[s] = scan_exp(delta * A[s]) * h[s] + delta * Bt[s] * x;
            acc += Ct[s] * h[s];
            if (hs) hs[(size_t)t * S + s] = h[s];
        }
        if (y) y[(size_t)t * I] = acc;
    }
    for (int s = 0; s < S && h_last; s++) h_last[s] = h[s];
    for (int s = 0; s < S && decay; s++) decay[s] = scan_exp(deltas * A[s]);
}

// The reverse scan of one channel, from its states hs (T, S): du, ddt (T) at stride I are
// written; dBp, dCp (T, S) += this channel's part of dB and dC; dA (S) += d loss / d A;
// *dD, *ddt_bias +=; g (S) scratch. A chunk: h0 (S) its first state's predecessor (NULL: zero),
// g_last (S) the gradient that later chunks send back to its last state (NULL: none), dh0 (S)
// receives the gradient of h0 (NULL: not wanted)
static HOST_DEVICE void scan_channel_backward(float *du, float *ddt, float *dBp, float *dCp,
                                              float *dA, float *dD, float *ddt_bias,
                                              const float *dy, const float *hs, const float *u,
                                              const float *dt, float dt_bias, const float *A,
                                              const float *Bm, const float *Cm, float D, int T,
                                              int I, int S, float *g, const float *h0,
                                              const float *g_last, float *dh0) {
    for (int s = 0; s < S; s++) g[s] = g_last ? g_last[s] : 0.0f; // what comes back from later
    for (int t = T - 1; t >= 0; t--) {
        size_t o = (size_t)t * I;
        float pre = dt[o] + dt_bias, delta = softplus(pre), x = u[o], dyt = dy[o];
        const float *h = hs + (size_t)t * S, *hprev = t > 0 ? h - S : h0;
        const float *Bt = Bm + (size_t)t * S, *Ct = Cm + (size_t)t * S;
        float *dBt = dBp + (size_t)t * S, *dCt = dCp + (size_t)t * S;
        // forward: y_t = sum_s C_t[s] * h_t[s] + D * u_t
        float dx = dyt * D, ddelta = 0.0f;
        *dD += dyt * x;
        SCAN_SIMD(ddelta, dx)
        for (int s = 0; s < S; s++) {
            g[s] += dyt * Ct[s]; // now all of dL/dh_t[s]: through y_t and through h_{t+1}
            dCt[s] += dyt * h[s];
            // forward: h_t[s] = exp(delta_t * A[s]) * h_{t-1}[s] + delta_t * B_t[s] * u_t
            float decay = scan_exp(delta * A[s]), hp = hprev ? hprev[s] : 0.0f;
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
    for (int s = 0; s < S && dh0; s++) dh0[s] = g[s];
}

// The backward takes the channels SCAN_GROUP at a time: dB and dC, which every channel adds to,
// gather first into each group's own partial sums (in channel order), then over the groups in
// group order, so the bits do not depend on the threads or on which ran which group.
#define SCAN_GROUP 16

// Group grp's channels over the B sequences: du, ddt (B, T, I) written at its channels; dBp, dCp
// (B, T, S) += the group's part; ddt_bias, dA_log, dD += at its channels. Scratch: A, dA, g (S),
// hs (T, S). A chunk: h0, g_last, dh0 (B, I, S) as scan_channel_backward's, each NULL for none.
static HOST_DEVICE void
scan_group_backward(float *du, float *ddt, float *dBp, float *dCp, float *ddt_bias, float *dA_log,
                    float *dD, const float *dy, const float *u, const float *dt,
                    const float *dt_bias, const float *A_log, const float *Bm, const float *Cm,
                    const float *D, int grp, int B, int T, int I, int S, float *A, float *dA,
                    float *g, float *hs, const float *h0, const float *g_last, float *dh0) {
    int i1 = (grp + 1) * SCAN_GROUP < I ? (grp + 1) * SCAN_GROUP : I;
    for (int i = grp * SCAN_GROUP; i < i1; i++) {
        for (int s = 0; s < S; s++) A[s] = -expf(A_log[(size_t)i * S + s]), dA[s] = 0.0f;
        for (int b = 0; b < B; b++) {
            size_t o = (size_t)b * T * I + i, bs = (size_t)b * T * S; // token (b, 0)
            size_t c = ((size_t)b * I + i) * S;                       // channel (b, i)'s state
            const float *h0c = h0 ? h0 + c : NULL;
            scan_channel(NULL, hs, u + o, dt + o, dt_bias[i], A, Bm + bs, Cm + bs, D[i], T, I, S, g,
                         h0c, NULL, NULL);
            scan_channel_backward(du + o, ddt + o, dBp + bs, dCp + bs, dA, &dD[i], &ddt_bias[i],
                                  dy + o, hs, u + o, dt + o, dt_bias[i], A, Bm + bs, Cm + bs, D[i],
                                  T, I, S, g, h0c, g_last ? g_last + c : NULL,
                                  dh0 ? dh0 + c : NULL);
        }
        // forward: A = -exp(A_log), so dA/dA_log = -exp(A_log) = A
        for (int s = 0; s < S; s++) dA_log[(size_t)i * S + s] += dA[s] * A[s];
    }
}
