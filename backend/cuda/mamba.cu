// Mamba-1's sequence kernels on the GPU, as backend/cpu/mamba.c computes them. Simple and correct
// first: the conv one thread per element (its weight and bias gradients one thread per channel),
// the scan one thread per channel of a sequence forward and one thread per group of SCAN_GROUP
// channels backward, running backend/mamba_scan.h's loops as the CPU does, so every result is the
// same bits from run to run. The scan's parallel form over the sequence (chunks, one thread block
// per channel group) is issue 30's next step.
#include "backend/cuda/common.h"
#include "backend/mamba_scan.h"

// the states a thread keeps in its registers or local memory (transformers' state_size: 16)
#define SCAN_MAX_STATE 64

static void check_state_size(int S) {
    if (S > SCAN_MAX_STATE)
        FAIL("raise SCAN_MAX_STATE in backend/cuda/mamba.cu", "mamba: state_size %d > %d", S,
             SCAN_MAX_STATE);
}

__global__ static void causal_conv1d_forward_kernel(float *out, float *pre, const float *x,
                                                    const float *weight, const float *bias, int T,
                                                    int I, int W, size_t n) {
    size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (e >= n) return;
    int i = e % I, t = (e / I) % T;
    const float *xc = x + (e - (size_t)t * I); // channel i of token (b, 0)
    float acc = bias ? bias[i] : 0.0f;
    for (int k = 0; k < W; k++) {
        int src = t - (W - 1) + k;
        if (src >= 0) acc += weight[(size_t)i * W + k] * xc[(size_t)src * I];
    }
    pre[e] = acc;
    out[e] = acc * scan_sigmoid(acc);
}

// d pre at element e: forward out = pre * sigmoid(pre)
__device__ static inline float dpre_at(const float *dout, const float *pre, size_t e) {
    float s = scan_sigmoid(pre[e]);
    return dout[e] * s * (1.0f + pre[e] * (1.0f - s));
}

// forward: pre[t] = bias + sum_k w[k] * x[t - (W-1) + k], so dx[j] = sum_k w[k] * dpre[j+(W-1)-k]
__global__ static void causal_conv1d_dx_kernel(float *dx, const float *dout, const float *pre,
                                               const float *weight, int T, int I, int W,
                                               size_t n) {
    size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (e >= n) return;
    int i = e % I, j = (e / I) % T;
    float acc = 0.0f;
    for (int k = 0; k < W; k++) {
        int t = j + (W - 1) - k; // the output that read x[j] through tap k
        if (t < T) acc += weight[(size_t)i * W + k] * dpre_at(dout, pre, e + (size_t)(t - j) * I);
    }
    dx[e] = acc;
}

// one thread per channel: its W taps and its bias over every (b, t), in the CPU's order
__global__ static void causal_conv1d_dweight_kernel(float *dweight, float *dbias,
                                                    const float *dout, const float *x,
                                                    const float *pre, int B, int T, int I, int W) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= I) return;
    for (int k = 0; k < W; k++) {
        float dw = 0.0f;
        for (int b = 0; b < B; b++) {
            size_t base = (size_t)b * T * I + i;
            for (int j = 0; j < T; j++) {
                int src = j - (W - 1) + k;
                if (src >= 0)
                    dw += dpre_at(dout, pre, base + (size_t)j * I) * x[base + (size_t)src * I];
            }
        }
        dweight[(size_t)i * W + k] += dw;
    }
    if (!dbias) return;
    float db = 0.0f;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) db += dpre_at(dout, pre, (size_t)b * T * I + i + (size_t)t * I);
    dbias[i] += db;
}

void causal_conv1d_forward(float *out, float *pre, const float *x, const float *weight,
                           const float *bias, int B, int T, int I, int W) {
    PROFILE(PROFILE_OTHER);
    size_t n = (size_t)B * T * I;
    if (n == 0) return;
    causal_conv1d_forward_kernel<<<blocks_for(n, 256), 256>>>(out, pre, x, weight, bias, T, I, W,
                                                               n);
    cudaCheckLaunch();
}

void causal_conv1d_backward(float *dx, float *dweight, float *dbias, const float *dout,
                            const float *x, const float *pre, const float *weight, int B, int T,
                            int I, int W) {
    PROFILE(PROFILE_OTHER);
    size_t n = (size_t)B * T * I;
    if (n == 0) return;
    causal_conv1d_dx_kernel<<<blocks_for(n, 256), 256>>>(dx, dout, pre, weight, T, I, W, n);
    cudaCheckLaunch();
    causal_conv1d_dweight_kernel<<<blocks_for(I, 128), 128>>>(dweight, dbias, dout, x, pre, B, T,
                                                              I, W);
    cudaCheckLaunch();
}

// one thread per channel (b, i)
__global__ static void selective_scan_forward_kernel(float *y, const float *u, const float *dt,
                                                     const float *dt_bias, const float *A_log,
                                                     const float *Bm, const float *Cm,
                                                     const float *D, int B, int T, int I, int S,
                                                     const float *h0, float *h_last,
                                                     float *decay) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= B * I) return;
    int b = c / I, i = c % I;
    float A[SCAN_MAX_STATE], h[SCAN_MAX_STATE];
    for (int s = 0; s < S; s++) A[s] = -expf(A_log[(size_t)i * S + s]);
    size_t o = (size_t)b * T * I + i, bs = (size_t)b * T * S; // token (b, 0)
    size_t st = (size_t)c * S; // channel (b, i)'s state
    scan_channel(y + o, NULL, u + o, dt + o, dt_bias[i], A, Bm + bs, Cm + bs, D[i], T, I, S, h,
                 h0 ? h0 + st : NULL, h_last ? h_last + st : NULL, decay ? decay + st : NULL);
}

// one thread per channel group; hs (G, T, S) its states' scratch
__global__ static void selective_scan_backward_kernel(
    float *du, float *ddt, float *dBp, float *dCp, float *ddt_bias, float *dA_log, float *dD,
    float *hs, const float *dy, const float *u, const float *dt, const float *dt_bias,
    const float *A_log, const float *Bm, const float *Cm, const float *D, int G, int B, int T,
    int I, int S, const float *h0, const float *g_last, float *dh0) {
    int grp = blockIdx.x * blockDim.x + threadIdx.x;
    if (grp >= G) return;
    float A[SCAN_MAX_STATE], dA[SCAN_MAX_STATE], g[SCAN_MAX_STATE];
    size_t NS = (size_t)B * T * S;
    scan_group_backward(du, ddt, dBp + grp * NS, dCp + grp * NS, ddt_bias, dA_log, dD, dy, u, dt,
                        dt_bias, A_log, Bm, Cm, D, grp, B, T, I, S, A, dA, g,
                        hs + (size_t)grp * T * S, h0, g_last, dh0);
}

// dBm, dCm (NS) = the groups' partial sums, in group order
__global__ static void scan_sum_groups_kernel(float *dBm, float *dCm, const float *dBp,
                                              const float *dCp, int G, size_t NS) {
    size_t n = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (n >= NS) return;
    float b = 0.0f, c = 0.0f;
    for (int grp = 0; grp < G; grp++) b += dBp[grp * NS + n], c += dCp[grp * NS + n];
    dBm[n] = b, dCm[n] = c;
}

void selective_scan_chunk_forward(float *y, const float *u, const float *dt, const float *dt_bias,
                                  const float *A_log, const float *Bm, const float *Cm,
                                  const float *D, int B, int T, int I, int S, const float *h0,
                                  float *h_last, float *decay) {
    PROFILE(PROFILE_OTHER);
    check_state_size(S);
    if (B * I == 0 || T == 0) return;
    selective_scan_forward_kernel<<<blocks_for((size_t)B * I, 128), 128>>>(y, u, dt, dt_bias,
                                                                           A_log, Bm, Cm, D, B, T,
                                                                           I, S, h0, h_last, decay);
    cudaCheckLaunch();
}

void selective_scan_forward(float *y, const float *u, const float *dt, const float *dt_bias,
                            const float *A_log, const float *Bm, const float *Cm, const float *D,
                            int B, int T, int I, int S) {
    selective_scan_chunk_forward(y, u, dt, dt_bias, A_log, Bm, Cm, D, B, T, I, S, NULL, NULL, NULL);
}

static DeviceScratch scan_buf;

void selective_scan_chunk_backward(float *du, float *ddt, float *dBm, float *dCm, float *ddt_bias,
                                   float *dA_log, float *dD, const float *dy, const float *u,
                                   const float *dt, const float *dt_bias, const float *A_log,
                                   const float *Bm, const float *Cm, const float *D, int B, int T,
                                   int I, int S, const float *h0, const float *g_last,
                                   float *dh0) {
    PROFILE(PROFILE_OTHER);
    check_state_size(S);
    if (B * I == 0 || T == 0) return;
    int G = (I + SCAN_GROUP - 1) / SCAN_GROUP;
    size_t NS = (size_t)B * T * S, parts = 2 * (size_t)G * NS, states = (size_t)G * T * S;
    float *dBp = (float *)device_scratch(&scan_buf, (parts + states) * sizeof(float));
    float *dCp = dBp + G * NS, *hs = dCp + G * NS;
    cudaCheck(cudaMemsetAsync(dBp, 0, parts * sizeof(float), 0));
    selective_scan_backward_kernel<<<blocks_for(G, 32), 32>>>(du, ddt, dBp, dCp, ddt_bias, dA_log,
                                                              dD, hs, dy, u, dt, dt_bias, A_log,
                                                              Bm, Cm, D, G, B, T, I, S, h0, g_last,
                                                              dh0);
    cudaCheckLaunch();
    scan_sum_groups_kernel<<<blocks_for(NS, 256), 256>>>(dBm, dCm, dBp, dCp, G, NS);
    cudaCheckLaunch();
}

void selective_scan_backward(float *du, float *ddt, float *dBm, float *dCm, float *ddt_bias,
                             float *dA_log, float *dD, const float *dy, const float *u,
                             const float *dt, const float *dt_bias, const float *A_log,
                             const float *Bm, const float *Cm, const float *D, int B, int T, int I,
                             int S) {
    selective_scan_chunk_backward(du, ddt, dBm, dCm, ddt_bias, dA_log, dD, dy, u, dt, dt_bias,
                                  A_log, Bm, Cm, D, B, T, I, S, NULL, NULL, NULL);
}
