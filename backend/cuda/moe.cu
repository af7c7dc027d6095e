// Mixture of experts on the GPU: Mixtral's router, Switch Transformer's load-balancing loss and
// the shuffles around the experts, as backend/cpu/moe.c computes them. Simple and correct first:
// one thread per token for the router (E is small), one block for the counting sort, and no
// atomics, so every result is the same bits from run to run.
#include "backend/cuda/common.h"
#include "backend/moe_route.h"

// one thread per token, the CPU's loop body
__global__ static void moe_router_forward_kernel(float *probs, int *topk_ids, float *topk_w,
                                                 const float *logits, int N, int E, int K) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    moe_route_token(probs + (size_t)n * E, topk_ids + (size_t)n * K, topk_w + (size_t)n * K,
                    logits + (size_t)n * E, E, K);
}

// One block. Thread t owns experts t, t + blockDim, ...: it counts their pairs, then, after
// thread 0's prefix sum, walks the pairs in token order to place them. Every thread reads every
// pair (a broadcast: all threads read the same id at once), O(E / blockDim * N * K) steps; a
// multi-block scan is the next step if this shows in a profile.
__global__ static void moe_dispatch_kernel(int *counts, int *offsets, int *pos, const int *topk_ids,
                                           int NK, int E, int capacity) {
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int c = 0;
        for (int i = 0; i < NK; i++) c += topk_ids[i] == e;
        counts[e] = c;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        offsets[0] = 0;
        for (int e = 0; e < E; e++) {
            int kept = capacity > 0 && counts[e] > capacity ? capacity : counts[e];
            offsets[e + 1] = offsets[e] + kept;
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int r = 0, first = offsets[e];
        for (int i = 0; i < NK; i++) {
            if (topk_ids[i] != e) continue;
            pos[i] = capacity > 0 && r >= capacity ? -1 : first + r;
            r++;
        }
    }
}

// one block: a block-wide sum of each expert's column of probs
__global__ static void moe_load_kernel(float *load, const float *probs, const int *counts, int N,
                                       int E) {
    for (int e = 0; e < E; e++) {
        float P = 0.0f;
        for (int n = threadIdx.x; n < N; n += blockDim.x) P += probs[(size_t)n * E + e];
        P = block_reduce<false>(P);
        if (threadIdx.x == 0) load[e] = (float)counts[e], load[E + e] = P;
    }
}

// one thread per element of a kept pair's row
__global__ static void moe_gather_forward_kernel(float *x_sorted, const float *x, const int *pos,
                                                 int NK, int C, int K) {
    size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (idx >= (size_t)NK * C) return;
    int i = (int)(idx / C), c = (int)(idx % C), p = pos[i];
    if (p >= 0) x_sorted[(size_t)p * C + c] = x[(size_t)(i / K) * C + c];
}

// one thread per element of dx: the token's K rows, added in the CPU's order
__global__ static void moe_gather_backward_kernel(float *dx, const float *dx_sorted, const int *pos,
                                                  int N, int C, int K) {
    size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * C) return;
    size_t n = idx / C, c = idx % C;
    float d = dx[idx];
    for (int j = 0; j < K; j++) {
        int p = pos[n * K + j];
        if (p >= 0) d += dx_sorted[(size_t)p * C + c];
    }
    dx[idx] = d;
}

__global__ static void moe_combine_forward_kernel(float *y, const float *out_sorted,
                                                  const float *topk_w, const int *pos, int N, int C,
                                                  int K) {
    size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * C) return;
    size_t n = idx / C, c = idx % C;
    float acc = 0.0f;
    for (int j = 0; j < K; j++) {
        int p = pos[n * K + j];
        if (p >= 0) acc += topk_w[n * K + j] * out_sorted[(size_t)p * C + c];
    }
    y[idx] = acc;
}

// one block per token: its K rows of dout_sorted, and a block-wide dot product for each weight
__global__ static void moe_combine_backward_kernel(float *dout_sorted, float *dtopk_w,
                                                   const float *dy, const float *out_sorted,
                                                   const float *topk_w, const int *pos, int C,
                                                   int K) {
    size_t n = blockIdx.x;
    const float *d = dy + n * C;
    for (int j = 0; j < K; j++) {
        int p = pos[n * K + j];
        if (p < 0) continue; // the same for the whole block: block_reduce's barriers stay paired
        float w = topk_w[n * K + j], dot = 0.0f;
        float *ds = dout_sorted + (size_t)p * C;
        const float *o = out_sorted + (size_t)p * C;
        for (int c = threadIdx.x; c < C; c += blockDim.x) ds[c] += w * d[c], dot += d[c] * o[c];
        dot = block_reduce<false>(dot);
        if (threadIdx.x == 0) dtopk_w[n * K + j] += dot;
    }
}

// one thread per token, the CPU's loop body
__global__ static void moe_router_backward_kernel(float *dlogits, const float *dtopk_w,
                                                  const float *probs, const int *topk_ids,
                                                  const float *topk_w, const float *counts,
                                                  float aux_coef, int N, int E, int K) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    moe_route_token_backward(dlogits + (size_t)n * E, dtopk_w + (size_t)n * K,
                             probs + (size_t)n * E, topk_ids + (size_t)n * K,
                             topk_w + (size_t)n * K, counts, aux_coef, E, K);
}

void moe_router_forward(float *probs, int *topk_ids, float *topk_w, const float *logits, int N,
                        int E, int K) {
    PROFILE(PROFILE_OTHER);
    if (N == 0) return;
    bf16_copies_stale(probs, (size_t)N * E * sizeof(float));
    bf16_copies_stale(topk_ids, (size_t)N * K * sizeof(int));
    bf16_copies_stale(topk_w, (size_t)N * K * sizeof(float));
    moe_router_forward_kernel<<<blocks_for(N, 128), 128>>>(probs, topk_ids, topk_w, logits, N, E,
                                                           K);
    cudaCheckLaunch();
}

void moe_dispatch(int *counts, int *offsets, int *pos, const int *topk_ids, int N, int E, int K,
                  int capacity) {
    PROFILE(PROFILE_OTHER);
    bf16_copies_stale(counts, E * sizeof(int));
    bf16_copies_stale(offsets, (E + 1) * sizeof(int));
    bf16_copies_stale(pos, (size_t)N * K * sizeof(int));
    moe_dispatch_kernel<<<1, 256>>>(counts, offsets, pos, topk_ids, N * K, E, capacity);
    cudaCheckLaunch();
}

void moe_load(float *load, const float *probs, const int *counts, int N, int E) {
    PROFILE(PROFILE_OTHER);
    bf16_copies_stale(load, 2 * E * sizeof(float));
    moe_load_kernel<<<1, ROW_THREADS>>>(load, probs, counts, N, E);
    cudaCheckLaunch();
}

void moe_gather_forward(float *x_sorted, const float *x, const int *pos, int N, int C, int K) {
    PROFILE(PROFILE_OTHER);
    size_t n = (size_t)N * K * C;
    if (n == 0) return;
    bf16_copies_stale(x_sorted, n * sizeof(float)); // the kept rows, at most N * K
    moe_gather_forward_kernel<<<blocks_for(n, 256), 256>>>(x_sorted, x, pos, N * K, C, K);
    cudaCheckLaunch();
}

void moe_gather_backward(float *dx, const float *dx_sorted, const int *pos, int N, int C, int K) {
    PROFILE(PROFILE_OTHER);
    size_t n = (size_t)N * C;
    if (n == 0) return;
    bf16_copies_stale(dx, n * sizeof(float));
    moe_gather_backward_kernel<<<blocks_for(n, 256), 256>>>(dx, dx_sorted, pos, N, C, K);
    cudaCheckLaunch();
}

void moe_combine_forward(float *y, const float *out_sorted, const float *topk_w, const int *pos,
                         int N, int C, int K) {
    PROFILE(PROFILE_OTHER);
    size_t n = (size_t)N * C;
    if (n == 0) return;
    bf16_copies_stale(y, n * sizeof(float));
    moe_combine_forward_kernel<<<blocks_for(n, 256), 256>>>(y, out_sorted, topk_w, pos, N, C, K);
    cudaCheckLaunch();
}

void moe_combine_backward(float *dout_sorted, float *dtopk_w, const float *dy,
                          const float *out_sorted, const float *topk_w, const int *pos, int N,
                          int C, int K) {
    PROFILE(PROFILE_OTHER);
    if (N == 0) return;
    bf16_copies_stale(dout_sorted, (size_t)N * K * C * sizeof(float));
    bf16_copies_stale(dtopk_w, (size_t)N * K * sizeof(float));
    moe_combine_backward_kernel<<<N, ROW_THREADS>>>(dout_sorted, dtopk_w, dy, out_sorted, topk_w,
                                                    pos, C, K);
    cudaCheckLaunch();
}

void moe_router_backward(float *dlogits, const float *dtopk_w, const float *probs,
                         const int *topk_ids, const float *topk_w, const float *counts,
                         float aux_scale, int tokens, int N, int E, int K) {
    PROFILE(PROFILE_OTHER);
    if (N == 0) return;
    bf16_copies_stale(dlogits, (size_t)N * E * sizeof(float));
    // forward: aux = E * sum_e (counts[e] / tokens) * (1/tokens) sum_n p[n, e]
    //   =>  d aux / d p[n, e] = E * counts[e] / tokens^2
    float aux_coef = tokens > 0 ? aux_scale * (float)E / ((float)tokens * (float)tokens) : 0.0f;
    moe_router_backward_kernel<<<blocks_for(N, 128), 128>>>(dlogits, dtopk_w, probs, topk_ids,
                                                            topk_w, counts, aux_coef, N, E, K);
    cudaCheckLaunch();
}
