// Data parallelism with gradient buckets, or naive (see data_parallel.c).
#pragma once
#include <stddef.h>
#include "backend/comm.h"

typedef struct {
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
} DataParallel;

void data_parallel_init(DataParallel *dp, float *grads, size_t num_params, Group *group,
                        int bucket_size_mb, int naive);
void data_parallel_free(DataParallel *dp);
// The backward hook (the model's on_grads_ready, picotron's mark_param_as_ready): the gradients
// grads[offset, offset + count) are final for this step; a bucket whose gradients all are starts
// its all-reduce. ctx is the DataParallel.
void data_parallel_grads_ready(void *ctx, size_t offset, size_t count);
// the optimizer's side: waits for every bucket of the step, then readies the next step
void data_parallel_wait(DataParallel *dp);
