// Token embedding from a vocab shard on the GPU (rows [vocab_start, vocab_start + V) live here).
//
// The backward adds each token's row of dout into its row of dwte. Tokens repeat, so the rows
// that share a token must be summed, and summed in one fixed order for the result to be the same
// bits from run to run. The tokens are sorted first: keys (row, position) go through a bitonic
// sort (Batcher 1968), which needs no atomics and whose result is unique because no two keys are
// equal. Each run of equal rows in the sorted keys is then one segment, summed by its own blocks
// (one per 128 columns) in position order onto dwte's row, exactly the CPU twin's order: the
// result is bit-equal to backend/cpu/embedding.c and independent of scheduling. The price of
// that order: a token that fills most of a batch (padding) is one long segment, walked row after
// row by its C / 128 blocks. The sort itself moves N keys of 8 bytes, little next to dout's
// (N, C) floats.
#include "backend/cuda/common.h"
#include <stdint.h>

// one block per token, threads over C
__global__ static void embedding_forward_kernel(float *out, const int *tokens, const float *wte,
                                                int C, int vocab_start, int V) {
    int n = blockIdx.x;
    int row = tokens[n] - vocab_start;
    float *out_n = out + (size_t)n * C;
    const float *w = wte + (size_t)row * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) out_n[c] = row >= 0 && row < V ? w[c] : 0.0f;
}

// A key is (row << 32 | position). Tokens of other shards and the padding up to a power of two
// get the row NOT_HERE, so they sort after every row of this shard.
#define NOT_HERE     0xffffffffu
#define SORT_TILE    4096 // keys a block sorts in shared memory: 32 KiB
#define SORT_THREADS 1024
#define SUM_SLOTS    16  // sorted keys per block of the sum: the segments that start there
#define SUM_COLS     128 // columns per block of the sum

__device__ static inline uint64_t token_key(const int *tokens, int i, int N, int vocab_start,
                                            int V) {
    if (i >= N) return UINT64_MAX;
    int row = tokens[i] - vocab_start;
    unsigned int r = row >= 0 && row < V ? (unsigned int)row : NOT_HERE;
    return (uint64_t)r << 32 | (unsigned int)i;
}

__device__ static inline unsigned int key_row(uint64_t key) {
    return (unsigned int)(key >> 32);
}

// The bitonic network on M = 2^m keys: for k = 2, 4, .., M and then j = k/2, .., 1, key i meets
// key i + j (bit j of i clear) and the pair is put in ascending order where bit k of i is clear,
// descending where it is set. Steps with j < tile stay inside one tile of keys, so one launch of
// this kernel runs them all for the stages k_first..k_last in shared memory; tokens != NULL
// builds the keys first (the first launch).
__global__ static void bitonic_tile_kernel(uint64_t *keys, const int *tokens, int N,
                                           int vocab_start, int V, int tile, int k_first,
                                           int k_last) {
    __shared__ uint64_t s[SORT_TILE];
    int base = blockIdx.x * tile;
    for (int t = threadIdx.x; t < tile; t += blockDim.x)
        s[t] = tokens ? token_key(tokens, base + t, N, vocab_start, V) : keys[base + t];
    __syncthreads();
    for (int k = k_first; k <= k_last; k <<= 1)
        for (int j = (k < tile ? k : tile) / 2; j > 0; j >>= 1) {
            for (int p = threadIdx.x; p < tile / 2; p += blockDim.x) {
                int i = 2 * j * (p / j) + p % j;
                bool ascending = ((base + i) & k) == 0;
                uint64_t a = s[i], b = s[i + j];
                if ((a > b) == ascending) s[i] = b, s[i + j] = a;
            }
            __syncthreads();
        }
    for (int t = threadIdx.x; t < tile; t += blockDim.x) keys[base + t] = s[t];
}

// one step j >= tile of stage k, over the whole array: a thread per pair
__global__ static void bitonic_step_kernel(uint64_t *keys, int pairs, int k, int j) {
    int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= pairs) return;
    int i = 2 * j * (p / j) + p % j;
    bool ascending = (i & k) == 0;
    uint64_t a = keys[i], b = keys[i + j];
    if ((a > b) == ascending) keys[i] = b, keys[i + j] = a;
}

// grid (sorted keys / SUM_SLOTS, C / SUM_COLS): block (x, y) sums the segments that start among
// keys [x * SUM_SLOTS, (x + 1) * SUM_SLOTS), over columns [y * SUM_COLS, (y + 1) * SUM_COLS); a
// segment that runs past its block's keys is still that block's alone.
__global__ static void embedding_backward_sum_kernel(float *dwte, const float *dout,
                                                     const uint64_t *keys, int N, int C) {
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int first = blockIdx.x * SUM_SLOTS, last = first + SUM_SLOTS < N ? first + SUM_SLOTS : N;
    for (int i = first; i < last; i++) {
        unsigned int row = key_row(keys[i]);
        if (row == NOT_HERE) return; // and so are all keys after it
        if (i > 0 && key_row(keys[i - 1]) == row) continue;
        float *dw = dwte + (size_t)row * C + c;
        float acc = *dw;
        // forward: out[n] = wte[row]
        for (int s = i; s < N && key_row(keys[s]) == row; s++)
            acc += dout[(size_t)(unsigned int)keys[s] * C + c];
        *dw = acc;
    }
}

// out (N, C), tokens (N), wte (V, C)
void embedding_forward(float *out, const int *tokens, const float *wte, int N, int C,
                       int vocab_start, int V) {
    PROFILE(PROFILE_OTHER);
    if (N == 0 || C == 0) return;
    bf16_copies_stale(out, (size_t)N * C * sizeof(float));
    embedding_forward_kernel<<<N, 256>>>(out, tokens, wte, C, vocab_start, V);
    cudaCheckLaunch();
}

static DeviceScratch keys_buf;

void embedding_backward(float *dwte, const float *dout, const int *tokens, int N, int C,
                        int vocab_start, int V) {
    PROFILE(PROFILE_OTHER);
    if (N == 0 || C == 0) return;
    bf16_copies_stale(dwte, (size_t)V * C * sizeof(float));
    int M = 1;
    while (M < N) M <<= 1;
    int tile = M < SORT_TILE ? M : SORT_TILE;
    uint64_t *keys = (uint64_t *)device_scratch(&keys_buf, (size_t)M * sizeof(uint64_t));
    // stages k <= tile inside each tile; then each larger stage: its steps j >= tile over the
    // whole array, the rest inside the tiles
    bitonic_tile_kernel<<<M / tile, SORT_THREADS>>>(keys, tokens, N, vocab_start, V, tile, 2, tile);
    cudaCheckLaunch();
    for (int k = 2 * tile; k <= M; k <<= 1) {
        for (int j = k / 2; j >= tile; j >>= 1) {
            bitonic_step_kernel<<<blocks_for(M / 2, 256), 256>>>(keys, M / 2, k, j);
            cudaCheckLaunch();
        }
        bitonic_tile_kernel<<<M / tile, SORT_THREADS>>>(keys, nullptr, N, vocab_start, V, tile, k,
                                                        k);
        cudaCheckLaunch();
    }
    dim3 grid(blocks_for(N, SUM_SLOTS), blocks_for(C, SUM_COLS));
    embedding_backward_sum_kernel<<<grid, SUM_COLS>>>(dwte, dout, keys, N, C);
    cudaCheckLaunch();
}
