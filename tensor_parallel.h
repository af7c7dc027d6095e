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

// Sequence parallelism (Megatron-LM's): outside the tp regions the residual stream (N, C) is split
// into tp blocks of N/tp consecutive token rows, rank r holding rows [r*N/tp, (r+1)*N/tp). Its
// buffers are NULL when it is off; every function below then takes the plain tensor-parallel path.
typedef struct {
    float *full;       // (N, C): a norm's output gathered, or a linear's partial sums
    float *norm_grads; // (2, C): norms' weight gradients from this rank's rows, before their sum
    int N, C;
    Group *tp;
} SequenceParallel;
// all N rows (N, C) of the rows this rank holds, block (N/tp, C): block itself when off, else
// every rank's block gathered into sp->full in rank order (Megatron's g in the forward)
const float *gather_from_sequence_parallel_region(SequenceParallel *sp, const float *block);
// block (N/tp, C) = this rank's rows of the sum over tp of sp->full (N, C) (g-bar)
void reduce_scatter_to_sequence_parallel_region(float *block, SequenceParallel *sp);
// this rank's rows of an (N, C) gradient that column_parallel_linear_backward reduced: all of it
// when off
const float *sequence_parallel_own_rows(const SequenceParallel *sp, const float *full);
// Where norm i's weight gradient goes: dweight when off; else, each rank having seen only its own
// rows, the zeroed norm_grads[i], whose sum over tp sequence_parallel_sum_norm_grads adds to
// dweight0 (and dweight1, if not NULL)
float *sequence_parallel_norm_grad(SequenceParallel *sp, float *dweight, int i);
void sequence_parallel_sum_norm_grads(SequenceParallel *sp, float *dweight0, float *dweight1);

// out_i (N, OC_i) = inp (N, C) @ weight_i (OC_i, C)^T
void column_parallel_linear_forward(const ColumnParallelOut *linears, int count, const float *inp,
                                    int N, int C);
// dinp (N, C) = all_reduce(sum of dout_i @ weight_i), written; dweight_i += dout_i^T @ inp.
// Under sequence parallelism the sum is reduce-scattered instead: only
// sequence_parallel_own_rows(dinp) is then defined. count >= 1.
void column_parallel_linear_backward(float *dinp, const ColumnParallelGrad *linears, int count,
                                     const float *inp, int N, int C, Group *tp, int async,
                                     const SequenceParallel *sp);
// out (N, C) = all_reduce(inp (N, I) @ weight (C, I)^T); under sequence parallelism the partial
// sums go to sp->full and out (N/tp, C) receives this rank's rows of their sum
void row_parallel_linear_forward(float *out, const float *inp, const float *weight, int N, int I,
                                 int C, Group *tp, SequenceParallel *sp);
// dinp (N, I) = dout (N, C) @ weight (C, I), written; dweight (C, I) += dout^T @ inp
void row_parallel_linear_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                                  const float *weight, int N, int I, int C);
// out (N, C) = all_reduce(rows of wte (V, C) for the tokens (N) in this rank's vocabulary range);
// reduce-scattered under sequence parallelism, as row_parallel_linear_forward's
void vocab_parallel_embedding_forward(float *out, const int *tokens, const float *wte, int N, int C,
                                      int vocab_start, int V, Group *tp, SequenceParallel *sp);
// dwte (V, C) += dout (N, C) rows of the tokens in this rank's range
void vocab_parallel_embedding_backward(float *dwte, const float *dout, const int *tokens, int N,
                                       int C, int vocab_start, int V);

// Small buffers of the vocab-parallel loss: maxes, losses (N; before the loss, this shard's
// maxima); stats (2N): sumexp then the target's logit; loss_sum (1)
typedef struct {
    float *maxes, *stats, *losses, *loss_sum;
} VocabParallelLossBuffers;

// Mean cross-entropy over this rank's N tokens from the vocab shard `logits` (N, V); writes
// dlogits (N, V) = loss_scale * d(sum of losses)/dlogits, all of it (no zeroing needed first).
// Returns the mean loss.
float vocab_parallel_cross_entropy(float *dlogits, const float *logits, const int *targets,
                                   float loss_scale, int N, int V, int vocab_start,
                                   VocabParallelLossBuffers *buf, Group *tp);
