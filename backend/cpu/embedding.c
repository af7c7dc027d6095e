// Token embedding from a vocab shard: rows [vocab_start, vocab_start + V) of the table live here;
// other tokens give zero rows that the vocab-parallel all-reduce fills in (Megatron-LM).
#include "backend/backend.h"
#include "backend/kernel_time.h"
#include <string.h>

// out (N, C), tokens (N), wte (V, C)
void embedding_forward(float *out, const int *tokens, const float *wte, int N, int C,
                       int vocab_start, int V) {
    KERNEL_TIME(KT_ELEMENTWISE, 0, 8.0 * N * C);
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        int row = tokens[n] - vocab_start;
        float *out_n = out + (size_t)n * C;
        if (row >= 0 && row < V)
            memcpy(out_n, wte + (size_t)row * C, (size_t)C * sizeof(float));
        else
            memset(out_n, 0, (size_t)C * sizeof(float));
    }
}

// Serial over tokens: a token that repeats adds into the same row, so a parallel loop over n
// would race. It is O(N*C), next to the O(N*C*V) of the output projection.
void embedding_backward(float *dwte, const float *dout, const int *tokens, int N, int C,
                        int vocab_start, int V) {
    KERNEL_TIME(KT_ELEMENTWISE, 0, 12.0 * N * C);
    for (int n = 0; n < N; n++) {
        int row = tokens[n] - vocab_start;
        if (row < 0 || row >= V) continue;
        // forward: out[n] = wte[row]
        float *dw = dwte + (size_t)row * C;
        const float *d = dout + (size_t)n * C;
        for (int c = 0; c < C; c++) dw[c] += d[c];
    }
}
