// ZeRO-1 (distributed.zero1): the optimizer's state sharded over the data-parallel replicas
// (see zero.c). Beyond picotron; stages 2 and 3 would live here too.
#pragma once
#include "data_parallel.h"
#include "model.h"

typedef struct {
    DataParallel *dp;
    // bucket b is cut into R = group size pieces of piece[b] floats (padded[b] = R * piece[b] >=
    // its size); this rank owns piece r, the range [shard_start[b], shard_start[b] +
    // shard_size[b]) of the flat buffers (shard_size may be 0)
    size_t *piece, *padded, *shard_start, *shard_size; // (num_buckets)
    int *
        all_reduced; // (num_buckets) buckets all-reduced all the same (a pipeline's tied embedding)
    float *pad;      // (padded[last]) device scratch, when the last bucket needs padding
    Handle *gathers; // (num_buckets) the parameters' all-gathers
} Zero;

// data_parallel_init(dp, model, group) with ZeRO-1's buckets: each reduce-scattered, so that this
// rank ends the step with the averaged gradient of its shard only; the optimizer then updates
// that shard (optimizer_init_ranges over shard_start, shard_size)
void zero_init(Zero *z, DataParallel *dp, Model *model, Group *group);
// after each rank updated its shard of params: every bucket's all-gather, so every replica holds
// all the parameters again
void zero_all_gather_params(Zero *z, float *params);
void zero_free(Zero *z);
