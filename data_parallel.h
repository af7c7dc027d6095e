// Data parallelism with gradient buckets, or naive (see data_parallel.c).
#pragma once
#include <stddef.h>
#include "backend/comm.h"
#include "model.h"

// How a bucket's gradients are averaged, for the extensions that do it their own way (zero.c
// reduce-scatters; expert_parallel.c averages the experts over their own replicas). Without one,
// picotron's way: every bucket all-reduced to its average over the group.
typedef struct {
    size_t bucket_floats; // a bucket's most floats; 0: distributed.bucket_size_mb's
    // 1 if tensor t must start a new bucket after tensor prev (NULL: buckets cut by size alone)
    int (*begins_bucket)(void *ctx, const ParamInfo *prev, const ParamInfo *t);
    Handle (*start)(void *ctx, int b); // bucket b's gradients are final: start its communication
    void (*arrived)(void *ctx, int b); // after its wait (NULL: nothing to do)
    void *ctx;
} BucketSync;

typedef struct DataParallel {
    float *grads; // (num_params): the flat gradient buffer the buckets are ranges of
    size_t num_params;
    Group *group; // cp*dp: every replica of this rank's parameters
    int num_buckets;
    size_t *start, *size, *ready; // (num_buckets): a range of the flat gradient buffer
    Handle *handles;
    int *in_flight;
    int require_backward_grad_sync; // picotron's name: 0 while accumulating micro-batches
    size_t grads_pending;           // gradients of this step not ready yet
    int started_during_backward;    // buckets whose all-reduce began while backward still ran
    int naive; // picotron_tutorial's step 5: each layer's gradients all-reduced at once, blocking
    double in_flight_seconds, overlapped_seconds; // of the all-reduces so far; the part of it
                                                  // while this rank's backward still ran
    BucketSync sync;                              // an extension's way (its start NULL: picotron's)
} DataParallel;

// Buckets over model's gradient buffer, averaged over group (as sync says, when not NULL);
// registers data_parallel_grads_ready as the model's backward hook (picotron's
// register_backward_hook)
void data_parallel_init(DataParallel *dp, Model *model, Group *group, const BucketSync *sync);
void data_parallel_free(DataParallel *dp);
// The backward hook (the model's on_grads_ready, picotron's mark_param_as_ready): the gradients
// grads[offset, offset + count) are final for this step; a bucket whose gradients all are starts
// its all-reduce. ctx is the DataParallel.
void data_parallel_grads_ready(void *ctx, size_t offset, size_t count);
// the optimizer's side: waits for every bucket of the step, then readies the next step
void data_parallel_wait(DataParallel *dp);
// picotron's average_loss_across_dp_cp_ranks: the step's loss (this replica's mean over its
// micro-batches) averaged over the cp*dp replicas, through scratch (1 device float)
float average_loss_across_dp_cp_ranks(float loss, float *scratch, Group *cp_dp);
