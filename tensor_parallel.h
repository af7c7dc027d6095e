// Megatron-style 1-D tensor parallelism (see tensor_parallel.c).
#pragma once
#include "backend/comm.h"

// One column-parallel linear of a group that reads the same input (q, k, v; gate, up):
// this rank's weight rows (OC, C), their gradient, and the gradient of the layer's output.
typedef struct {
    float *dweight;
    const float *weight, *dout;
    int OC;
} ColumnParallelLinear;

void column_parallel_linear_forward(float *out, const float *inp, const float *weight, int N, int C,
                                    int OC);
void column_parallel_linear_backward(float *dinp, const ColumnParallelLinear *linears, int count,
                                     const float *inp, int N, int C, Group *tp, int async);
void row_parallel_linear_forward(float *out, const float *inp, const float *weight, int N, int I,
                                 int C, Group *tp);
void row_parallel_linear_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                                  const float *weight, int N, int I, int C);
void vocab_parallel_embedding_forward(float *out, const int *tokens, const float *wte, int N, int C,
                                      int vocab_start, int V, Group *tp);
void vocab_parallel_embedding_backward(float *dwte, const float *dout, const int *tokens, int N,
                                       int C, int vocab_start, int V);

// Small buffers of the vocab-parallel loss: (N) each, stats holds sumexp then target_logit (2N)
typedef struct {
    float *maxes, *stats, *losses, *loss_sum;
} VocabParallelLossBuffers;

// Mean cross-entropy over this rank's N tokens from the vocab shard `logits` (N, V); writes
// dlogits (N, V) += loss_scale * d(sum of losses)/dlogits. Returns the mean loss.
float vocab_parallel_cross_entropy(float *dlogits, const float *logits, const int *targets,
                                   float loss_scale, int N, int V, int vocab_start,
                                   VocabParallelLossBuffers *buf, Group *tp);
