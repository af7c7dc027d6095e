// Tensor parallelism (Megatron-LM, Shoeybi et al. 2019), as picotron's tensor_parallel.py, except
// the loss: picotron gathers the full logits (gather_output=True); here it is Megatron's
// vocab-parallel cross-entropy.
//
// A decoder layer is split over the tp ranks so that only two all-reduces run per layer and
// direction. The attention heads and the MLP's intermediate features are divided:
//   q, k, v, gate, up  column-parallel: this rank holds out/tp rows of W (OC, C).
//       forward:  out = inp @ W_r^T             input replicated: identity, no communication
//       backward: dinp = all_reduce(dout @ W_r) each rank saw only its features' share
//   o_proj, down_proj  row-parallel: this rank holds in/tp columns of W (C, I).
//       forward:  out = all_reduce(inp_r @ W_r^T)  partial sums over the split features
//       backward: dinp_r = dout @ W_r             dout is replicated: identity
// The vocabulary is split too: the embedding gives zeros for tokens outside this rank's range
// and an all-reduce fills them in; the head is column-parallel over the vocabulary and the loss
// is built from the shards with two small all-reduces (the max; then the sum of exp, rescaled to
// that max, and the target logit together), so no rank ever holds (tokens x vocab) logits.
// Every rank then holds the same output, which is why RMSNorm weights stay replicated and
// identical.
//
// Sequence parallelism, which splits the residual stream between those regions over the tp ranks,
// is an extension: sequence_parallel.c. It reaches this file only through TensorParallel's split.
//
// This file decides the split: the model names each tensor's role (column-parallel, row-parallel,
// vocab-parallel, replicated) and tensor_parallel_shard says which block of it this rank holds;
// tensor_parallel_sizes says how many heads, features and vocabulary rows that leaves per rank.
#include "tensor_parallel.h"
#include "backend/backend.h"
#include "utils.h"
#include "vocab_padding.h"

// Whole heads go to each rank (a head never straddles two), so attention needs no communication
// until o_proj; config_validate has checked that tp divides every split size.
Shard tensor_parallel_shard(TensorParallelSplit split, int rows, int cols, const Group *tp) {
    Shard s = {rows, cols, 0, 0};
    if (split == COLUMN_PARALLEL || split == VOCAB_PARALLEL) {
        if (rows % tp->size)
            FAIL("config_validate checks tp divides it", "%d rows over tp=%d", rows, tp->size);
        s.rows = rows / tp->size;
        s.row0 = tp->rank * s.rows;
    } else if (split == ROW_PARALLEL) {
        if (cols % tp->size)
            FAIL("config_validate checks tp divides it", "%d cols over tp=%d", cols, tp->size);
        s.cols = cols / tp->size;
        s.col0 = tp->rank * s.cols;
    }
    return s;
}

TensorParallelSizes tensor_parallel_sizes(const Config *c, const Group *tp) {
    // the heads split as q_proj's rows do, the features as gate_proj's, the vocabulary as the
    // embedding's (its rows padded, when model.make_vocab_size_divisible_by asks: vocab_padding.c);
    // a Mamba (model_mamba.c) has no heads, and its intermediate_size is its channels
    int mamba = config_is_mamba(c);
    Shard heads = tensor_parallel_shard(COLUMN_PARALLEL, mamba ? 0 : c->num_attention_heads, 1, tp);
    Shard kv_heads =
        tensor_parallel_shard(COLUMN_PARALLEL, mamba ? 0 : c->num_key_value_heads, 1, tp);
    Shard features = tensor_parallel_shard(COLUMN_PARALLEL, c->intermediate_size, 1, tp);
    Shard vocab = tensor_parallel_shard(VOCAB_PARALLEL, vocab_size_with_padding(c), 1, tp);
    return (TensorParallelSizes){.H = heads.rows,
                                 .KV = kv_heads.rows,
                                 .I = features.rows,
                                 .V = vocab.rows,
                                 .vocab_start = vocab.row0};
}

// picotron's copy_to_model_parallel_region in the forward: every rank holds the whole input
const float *tensor_parallel_region_input(TensorParallel *tp, const float *stream) {
    return tp->split ? tp->split->gather(tp->split, stream) : stream;
}

float *tensor_parallel_region_partial(TensorParallel *tp, float *out) {
    return tp->split ? tp->split->full : out;
}

// picotron's reduce_from_model_parallel_region: the partial sums of the ranks' features add up
void tensor_parallel_region_sum(TensorParallel *tp, float *out, float *partial, size_t n) {
    if (!tp->split) {
        all_reduce(out, n, REDUCE_SUM, tp->group);
        return;
    }
    Handle h = tp->split->reduce_scatter_start(tp->split, partial, n);
    comm_wait(&h);
    device_copy(out, tp->split->own_rows(tp->split, partial), n / tp->group->size * sizeof(float));
}

Handle tensor_parallel_grad_sum_start(TensorParallel *tp, float *dinp, size_t n) {
    if (tp->split) return tp->split->reduce_scatter_start(tp->split, dinp, n);
    return all_reduce_start(dinp, n, REDUCE_SUM, tp->group);
}

const float *tensor_parallel_own_rows(const TensorParallel *tp, const float *full) {
    return tp->split ? tp->split->own_rows(tp->split, full) : full;
}

// The linears that read one input (q, k and v read ln1; gate and up read ln2) run together.
void column_parallel_linear_forward(TensorParallel *tp, const ColumnParallelOut *linears, int count,
                                    const float *inp, int N, int C) {
    inp = tensor_parallel_region_input(tp, inp);
    for (int i = 0; i < count; i++)
        matmul_forward(linears[i].out, inp, linears[i].weight, N, C, linears[i].OC);
}

// The linears that read one input (q, k and v read ln1) sum their input gradients locally and
// all-reduce once: all-reducing after each would count the earlier ones tp times. The first
// product writes dinp, so nobody zeroes it first.
// async (nanotron's): the all-reduce travels while the weight gradients are computed.
const float *column_parallel_linear_backward(TensorParallel *tp, float *dinp,
                                             const ColumnParallelGrad *linears, int count,
                                             const float *inp, int N, int C) {
    inp = tensor_parallel_region_input(tp, inp);
    matmul_backward_write(dinp, NULL, linears[0].dout, inp, linears[0].weight, N, C, linears[0].OC);
    for (int i = 1; i < count; i++)
        matmul_backward(dinp, NULL, linears[i].dout, inp, linears[i].weight, N, C, linears[i].OC);
    Handle h = tensor_parallel_grad_sum_start(tp, dinp, (size_t)N * C);
    if (!tp->async) comm_wait(&h);
    for (int i = 0; i < count; i++)
        matmul_backward(NULL, linears[i].dweight, linears[i].dout, inp, linears[i].weight, N, C,
                        linears[i].OC);
    if (tp->async) comm_wait(&h);
    return tensor_parallel_own_rows(tp, dinp);
}

void row_parallel_linear_forward(TensorParallel *tp, float *out, const float *inp,
                                 const float *weight, int N, int I, int C) {
    float *partial = tensor_parallel_region_partial(tp, out);
    matmul_forward(partial, inp, weight, N, I, C);
    tensor_parallel_region_sum(tp, out, partial, (size_t)N * C);
}

// dout is replicated: identity
void row_parallel_linear_backward(TensorParallel *tp, float *dinp, float *dweight,
                                  const float *dout, const float *inp, const float *weight, int N,
                                  int I, int C) {
    dout = tensor_parallel_region_input(tp, dout);
    matmul_backward_write(dinp, dweight, dout, inp, weight, N, I, C);
}

void vocab_parallel_embedding_forward(TensorParallel *tp, float *out, const int *tokens,
                                      const float *wte, int N, int C, int vocab_start, int V) {
    float *partial = tensor_parallel_region_partial(tp, out);
    embedding_forward(partial, tokens, wte, N, C, vocab_start, V);
    tensor_parallel_region_sum(tp, out, partial, (size_t)N * C);
}

// dout is replicated, and each rank keeps the rows of the tokens it owns: no communication
void vocab_parallel_embedding_backward(TensorParallel *tp, float *dwte, const float *dout,
                                       const int *tokens, int N, int C, int vocab_start, int V) {
    dout = tensor_parallel_region_input(tp, dout);
    embedding_backward(dwte, dout, tokens, N, C, vocab_start, V);
}

float vocab_parallel_cross_entropy(float *dlogits, float *logits, const int *targets,
                                   float loss_scale, int N, int V, int vocab_start,
                                   VocabParallelLossBuffers *buf, Group *tp) {
    // a padded vocabulary's extra columns out of the softmax (vocab_padding.c)
    vocab_padding_mask_logits(logits, N, V, buf->padded_columns);
    // one read of the shard: its max, its sum of exp(logit - its max), the target's logit (held
    // by exactly one shard, 0 elsewhere)
    float *sumexp = buf->stats, *target_logit = buf->stats + N, *shard_maxes = buf->losses;
    cross_entropy_stats(buf->maxes, sumexp, target_logit, logits, targets, N, V, vocab_start);
    // the global max keeps exp() finite on every shard; each shard's sum moves onto its scale,
    // then the sums and the target's logit add up in one all-reduce (the losses buffer holds this
    // shard's maxima until the loss overwrites it)
    device_copy(shard_maxes, buf->maxes, (size_t)N * sizeof(float));
    all_reduce(buf->maxes, N, REDUCE_MAX, tp);
    cross_entropy_rescale(sumexp, shard_maxes, buf->maxes, N);
    all_reduce(buf->stats, 2 * (size_t)N, REDUCE_SUM, tp);
    cross_entropy_loss(buf->losses, buf->maxes, sumexp, target_logit, N);
    cross_entropy_backward(dlogits, logits, buf->maxes, sumexp, targets, loss_scale, N, V,
                           vocab_start);
    float loss_sum = 0.0f;
    device_zero(buf->loss_sum, sizeof(float));
    sum_reduce(buf->loss_sum, buf->losses, N);
    device_to_host(&loss_sum, buf->loss_sum, sizeof(float));
    return loss_sum / N;
}
