// Token embedding from a vocab shard on the GPU (rows [vocab_start, vocab_start + V) live here).
#include "backend/cuda/common.h"

// one block per token, threads over C
__global__ static void embedding_forward_kernel(float *out, const int *tokens, const float *wte,
                                                int C, int vocab_start, int V) {
    int n = blockIdx.x;
    int row = tokens[n] - vocab_start;
    float *out_n = out + (size_t)n * C;
    const float *w = wte + (size_t)row * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) out_n[c] = row >= 0 && row < V ? w[c] : 0.0f;
}

// One thread per column walks the tokens in order: a repeated token adds into the same row, and
// this order (the CPU's) makes the sum deterministic and bit-equal to the CPU twin, no atomics.
__global__ static void embedding_backward_kernel(float *dwte, const float *dout, const int *tokens,
                                                 int N, int C, int vocab_start, int V) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (int n = 0; n < N; n++) {
        int row = tokens[n] - vocab_start;
        // forward: out[n] = wte[row]
        if (row >= 0 && row < V) dwte[(size_t)row * C + c] += dout[(size_t)n * C + c];
    }
}

// out (N, C), tokens (N), wte (V, C)
void embedding_forward(float *out, const int *tokens, const float *wte, int N, int C,
                       int vocab_start, int V) {
    PROFILE(PROFILE_OTHER);
    if (N == 0 || C == 0) return;
    embedding_forward_kernel<<<N, 256>>>(out, tokens, wte, C, vocab_start, V);
    cudaCheckLaunch();
}

void embedding_backward(float *dwte, const float *dout, const int *tokens, int N, int C,
                        int vocab_start, int V) {
    PROFILE(PROFILE_OTHER);
    if (N == 0 || C == 0) return;
    embedding_backward_kernel<<<blocks_for(C, 128), 128>>>(dwte, dout, tokens, N, C, vocab_start,
                                                           V);
    cudaCheckLaunch();
}
