// Sequence parallelism (Megatron-LM's, distributed.sequence_parallel): the residual stream split
// over the tp ranks between the tensor-parallel regions (see sequence_parallel.c).
#pragma once
#include "data_parallel.h"
#include "model.h"
#include "tensor_parallel.h"

typedef struct {
    StreamSplit split; // first: tensor_parallel.c holds a pointer to it
    int N, C;          // the stream's rows (all tokens) and width
    Group *tp;
    Model *model;
    DataParallel *dp;      // whose require_backward_grad_sync says when the norms are summed
    int every_micro_batch; // ZeRO-2 and 3 reduce-scatter each micro-batch's gradients: sum each
    // the backward hook installed before this one (data parallelism's, or ZeRO's): runs after
    void (*next)(void *ctx, size_t offset, size_t count);
    void *next_ctx;
} SequenceParallel;

// the rows of the residual stream a rank holds: N = mbs * seq / cp, over tp when it is on
int sequence_parallel_rows(const Config *cfg, const ProcessGroupManager *pgm);
// After data_parallel_init (or zero_init, expert_parallel_buckets_init): splits model's stream,
// and sums the norms' weight gradients over tp before dp's hook sees them
void sequence_parallel_init(SequenceParallel *sp, Model *model, DataParallel *dp);
// the split alone, for tests of the tensor-parallel layers: rows (N, C) over tp
void sequence_parallel_split(SequenceParallel *sp, TensorParallel *tp, int N, int C);
void sequence_parallel_free(SequenceParallel *sp);
