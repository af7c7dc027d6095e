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
    size_t *norms; // (num_norms) offsets of this stage's norm weights in the flat buffers
    int num_norms;
    Model *model;
    DataParallel *dp; // whose backward hook runs after the norms' sum
} SequenceParallel;

// the rows of the residual stream a rank holds: N = mbs * seq / cp, over tp when it is on
int sequence_parallel_rows(const Config *cfg, const ProcessGroupManager *pgm);
// After data_parallel_init (or zero_init, expert_parallel_buckets_init): splits model's stream,
// and sums the norms' weight gradients over tp before dp's hook sees them
void sequence_parallel_init(SequenceParallel *sp, Model *model, DataParallel *dp);
// the split alone, for tests of the tensor-parallel layers: rows (N, C) over tp
void sequence_parallel_split(SequenceParallel *sp, TensorParallel *tp, int N, int C);
void sequence_parallel_free(SequenceParallel *sp);
