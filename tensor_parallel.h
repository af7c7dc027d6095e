// Megatron-style 1-D tensor parallelism (see tensor_parallel.c). Sizes are this rank's: OC and I
// are its share of the output and intermediate features, V its share of the vocabulary.
#pragma once
#include "backend/comm.h"
#include "config.h"

// How a tensor stored as Hugging Face stores it, W (rows, cols) = (out features, in features), is
// split over the tp ranks. Column-parallel splits the columns of W^T, that is the rows of W.
typedef enum {
    REPLICATED,      // norms: every rank holds the whole tensor
    COLUMN_PARALLEL, // q, k, v, gate, up: rows (output features) split
    ROW_PARALLEL,    // o_proj, down_proj: columns (input features) split
    VOCAB_PARALLEL,  // the embedding and the head: vocabulary rows split
} TensorParallelSplit;

// The block of a (rows, cols) tensor that this tp rank holds: [row0, row0+rows) x [col0, col0+cols)
typedef struct {
    int rows, cols, row0, col0;
} Shard;
Shard tensor_parallel_shard(TensorParallelSplit split, int rows, int cols, const Group *tp);

// The sizes this tp rank holds: H attention heads, KV kv heads, I intermediate features, and V
// vocabulary rows, the first of which is vocab_start
typedef struct {
    int H, KV, I, V, vocab_start;
} TensorParallelSizes;
TensorParallelSizes tensor_parallel_sizes(const Config *cfg, const Group *tp);

// One column-parallel linear among several that read the same input (q, k, v; gate, up): where
// its output (N, OC) goes and this rank's weight rows (OC, C).
typedef struct {
    float *out;
    const float *weight;
    int OC;
} ColumnParallelOut;

// The backward of one column-parallel linear among several that read the same input (q, k, v;
// gate, up): this rank's weight rows (OC, C), where their gradient accumulates, and the gradient
// of the linear's output (N, OC). (picotron's ColumnParallelLinear is the module; this is the
// work its backward needs.)
typedef struct {
    float *dweight;
    const float *weight, *dout;
    int OC;
} ColumnParallelGrad;

// This rank's tensor parallelism: its tp group, nanotron's async all-reduce
// (tensor_parallel.async), and how the residual stream between the tp regions is held. picotron's
// way: every tp rank holds all N rows of it (split NULL). An extension may hold it otherwise: a
// StreamSplit says how a region gathers its input and how a sum leaves it (sequence_parallel.c
// fills one; this file only calls it).
typedef struct StreamSplit StreamSplit;
struct StreamSplit {
    float *full; // (N, C): a region's gathered input, or a linear's partial sums
    const float *(*gather)(StreamSplit *s, const float *rows); // full, from this rank's rows
    Handle (*reduce_scatter_start)(StreamSplit *s, float *x, size_t n); // x (N, C), in place
    const float *(*own_rows)(const StreamSplit *s, const float *x);     // this rank's rows of x
};
typedef struct {
    Group *group;
    int async;
    StreamSplit *split;
} TensorParallel;

// the seam, for the layers that are not linears (model_moe.c's experts): the region's input
// (N, C) from the stream; where a partial sum (N, C) goes; its sum over tp into the stream, out;
// an input gradient's sum over tp started; this rank's stream rows of such a sum
const float *tensor_parallel_region_input(TensorParallel *tp, const float *stream);
float *tensor_parallel_region_partial(TensorParallel *tp, float *out);
void tensor_parallel_region_sum(TensorParallel *tp, float *out, float *partial, size_t n);
Handle tensor_parallel_grad_sum_start(TensorParallel *tp, float *dinp, size_t n);
const float *tensor_parallel_own_rows(const TensorParallel *tp, const float *full);

// In what follows, inp and out of the stream (ln1, ln2, lnf, the residual stream and its
// gradient) are this rank's rows of it: all N of them in picotron's layout.
// out_i (N, OC_i) = inp (N, C) @ weight_i (OC_i, C)^T
void column_parallel_linear_forward(TensorParallel *tp, const ColumnParallelOut *linears, int count,
                                    const float *inp, int N, int C);
// dinp (N, C) = all_reduce(sum of dout_i @ weight_i), written; dweight_i += dout_i^T @ inp.
// Returns this rank's stream rows of dinp (dinp itself in picotron's layout). count >= 1.
const float *column_parallel_linear_backward(TensorParallel *tp, float *dinp,
                                             const ColumnParallelGrad *linears, int count,
                                             const float *inp, int N, int C);
// out (N, C) = all_reduce(inp (N, I) @ weight (C, I)^T)
void row_parallel_linear_forward(TensorParallel *tp, float *out, const float *inp,
                                 const float *weight, int N, int I, int C);
// dinp (N, I) = dout (N, C) @ weight (C, I), written; dweight (C, I) += dout^T @ inp
void row_parallel_linear_backward(TensorParallel *tp, float *dinp, float *dweight,
                                  const float *dout, const float *inp, const float *weight, int N,
                                  int I, int C);
// out (N, C) = all_reduce(rows of wte (V, C) for the tokens (N) in this rank's vocabulary range)
void vocab_parallel_embedding_forward(TensorParallel *tp, float *out, const int *tokens,
                                      const float *wte, int N, int C, int vocab_start, int V);
// dwte (V, C) += dout (N, C) rows of the tokens in this rank's range
void vocab_parallel_embedding_backward(TensorParallel *tp, float *dwte, const float *dout,
                                       const int *tokens, int N, int C, int vocab_start, int V);

// Small buffers of the vocab-parallel loss: maxes, losses (N; before the loss, this shard's
// maxima); stats (2N): sumexp then the target's logit; loss_sum (1). padded_columns: how many of
// the shard's last columns are the vocabulary's padding, no token's (vocab_padding.c; 0: none).
typedef struct {
    float *maxes, *stats, *losses, *loss_sum;
    int padded_columns;
} VocabParallelLossBuffers;

// Mean cross-entropy over this rank's N tokens from the vocab shard `logits` (N, V); writes
// dlogits (N, V) = loss_scale * d(sum of losses)/dlogits, all of it (no zeroing needed first).
// The padded columns of logits are overwritten first, so that they get no probability.
// Returns the mean loss.
float vocab_parallel_cross_entropy(float *dlogits, float *logits, const int *targets,
                                   float loss_scale, int N, int V, int vocab_start,
                                   VocabParallelLossBuffers *buf, Group *tp);
