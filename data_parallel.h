// Data parallelism with gradient buckets, or naive, or ZeRO-1 (see data_parallel.c).
#pragma once
#include <stddef.h>
#include "backend/comm.h"
#include "model.h"

typedef struct {
    float *grads; // (num_params): the flat gradient buffer the buckets are ranges of
    size_t num_params;
    Group *group; // cp*dp: every replica of this rank's parameters
    int num_buckets;
    size_t *start, *size, *ready; // (num_buckets): a range of the flat gradient buffer
    // expert parallelism: a bucket of experts' gradients (expert[b]) averages over the replicas of
    // those experts (expert_group, cp*dp/ep ranks) and is divided by ep (see start_bucket)
    int *expert;
    Group *expert_group;
    int ep;
    Handle *handles;
    int *in_flight;
    int require_backward_grad_sync; // picotron's name: 0 while accumulating micro-batches
    size_t grads_pending;           // gradients of this step not ready yet
    int started_during_backward;    // buckets whose all-reduce began while backward still ran
    int naive; // picotron_tutorial's step 5: each layer's gradients all-reduced at once, blocking
    double in_flight_seconds, overlapped_seconds; // of the all-reduces so far; the part of it
                                                  // while this rank's backward still ran
    // ZeRO-1 (distributed.zero1): bucket b is cut into group->size pieces of piece[b] floats
    // (padded[b] = size * piece[b] >= size[b]); this rank owns piece group->rank, the range
    // [shard_start[b], shard_start[b] + shard_size[b]) of the flat buffers (shard_size may be 0)
    int zero1;
    size_t *piece, *padded, *shard_start, *shard_size; // (num_buckets)
    int *all_reduced; // (num_buckets) zero1 buckets all-reduced all the same (the tied embedding)
    float *pad;       // (padded[last]) device scratch, when the last bucket needs padding
    Handle *gathers;  // (num_buckets) the parameters' all-gathers
} DataParallel;

// Buckets over model's gradient buffer, averaged over group; registers data_parallel_grads_ready
// as the model's backward hook (picotron's register_backward_hook)
void data_parallel_init(DataParallel *dp, Model *model, Group *group);
void data_parallel_free(DataParallel *dp);
// The backward hook (the model's on_grads_ready, picotron's mark_param_as_ready): the gradients
// grads[offset, offset + count) are final for this step; a bucket whose gradients all are starts
// its all-reduce (ZeRO-1: reduce-scatter). ctx is the DataParallel.
void data_parallel_grads_ready(void *ctx, size_t offset, size_t count);
// the optimizer's side: waits for every bucket of the step, then readies the next step. With
// ZeRO-1 this rank then holds the averaged gradient of its shard only.
void data_parallel_wait(DataParallel *dp);
// ZeRO-1, after each rank updated its shard of params: every bucket's all-gather, so every replica
// holds all the parameters again (nothing without ZeRO-1)
void data_parallel_all_gather_params(DataParallel *dp, float *params);
