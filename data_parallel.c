// Data parallelism, as picotron's data_parallel.py (DataParallelBucket).
//
// Every cp*dp replica holds the same parameters and sees different tokens, so averaging the
// gradients over the replicas gives the gradient of the mean loss over all their tokens.
// The flat gradient buffer is cut into buckets (25 MB by default). Backward tells us as each
// layer's gradients become final (the model's on_grads_ready calls data_parallel_grads_ready); a
// bucket whose gradients are all final starts its non-blocking all-reduce at once, so communication
// travels while earlier layers are still in backward. The optimizer waits for all buckets. While
// micro-batches are accumulated, require_backward_grad_sync is 0 and nothing is sent: gradients add
// up locally and one all-reduce per bucket serves the whole step.
// A bucket counts the floats reported ready, so their order does not matter: an interleaved
// pipeline reports each chunk's layers during that chunk's last backward (its last chunk first),
// and a bucket may span two chunks.
// The naive mode (distributed.dp_naive, picotron_tutorial's step 5) all-reduces each layer's
// gradients the moment they are final, and waits: every byte's time shows in the step. The
// bucketed mode's all-reduces travel while the backward goes on; data_parallel_wait measures how
// much of their time in flight overlapped the backward (trace.c prints it).
//
// Beyond picotron, ZeRO-1 (zero.c) and expert parallelism's buckets (expert_parallel.c) average
// some buckets their own way: they hand data_parallel_init a BucketSync, and this file calls it.
#include "data_parallel.h"
#include <math.h>
#include "backend/backend.h"
#include "trace.h"
#include "utils.h"

// An all-reduce has ended: its time in flight, and how much of it overlapped this rank's backward
// (which ended at backward_end), the time this rank waited for it not counted
static void account(DataParallel *dp, const Handle *h, double backward_end) {
    double end = fmin(h->finished, backward_end), waiting = h->finished - h->waited;
    dp->in_flight_seconds += h->finished - h->started;
    dp->overlapped_seconds += fmax(0.0, end - h->started - fmax(0.0, end - waiting));
}

// A bucket whose gradients are final: averaged over the replicas
static void start_bucket(DataParallel *dp, int b) {
    if (dp->sync.start)
        dp->handles[b] = dp->sync.start(dp->sync.ctx, b);
    else
        dp->handles[b] =
            all_reduce_start(dp->grads + dp->start[b], dp->size[b], REDUCE_AVG, dp->group);
}

// picotron's mark_param_as_ready, for a range of the flat gradient buffer
void data_parallel_grads_ready(void *ctx, size_t offset, size_t count) {
    DataParallel *dp = ctx;
    // one replica: nothing to average
    if (!dp->require_backward_grad_sync || dp->group->size == 1) return;
    if (dp->naive) { // (never with a BucketSync: config_validate refuses it)
        Handle h = all_reduce_start(dp->grads + offset, count, REDUCE_AVG, dp->group);
        comm_wait(&h);
        account(dp, &h, h.finished); // the backward waited for it: nothing overlapped
        dp->grads_pending -= count;
        return;
    }
    // give MPI a turn: on the CPU an all-reduce in flight advances only inside MPI calls
    for (int b = 0; b < dp->num_buckets; b++)
        if (dp->in_flight[b]) comm_test(&dp->handles[b]);
    dp->grads_pending -= count;
    for (int b = 0; b < dp->num_buckets; b++) {
        size_t lo = dp->start[b], hi = lo + dp->size[b];
        size_t first = offset > lo ? offset : lo, end = offset + count < hi ? offset + count : hi;
        if (first >= end) continue;
        dp->ready[b] += end - first;
        if (dp->ready[b] > dp->size[b])
            FAIL("the backward must report each gradient once per step",
                 "bucket %d: %zu of its %zu floats reported ready", b, dp->ready[b], dp->size[b]);
        if (dp->ready[b] == dp->size[b]) {
            start_bucket(dp, b);
            dp->in_flight[b] = 1;
            if (dp->grads_pending > 0) dp->started_during_backward++;
        }
    }
}

// Buckets of at most `bucket` floats over the flat buffer in order, a new one wherever the
// BucketSync says a tensor begins one. Counts them, and fills dp's arrays once allocated.
static int lay_out_buckets(DataParallel *dp, const Model *model, size_t bucket) {
    const ParamInfo *t = model->table;
    const BucketSync *s = &dp->sync;
    int n = model->num_tensors, b = 0;
    size_t run = 0; // where the current run of tensors began
    for (int i = 1; i <= n; i++) {
        if (i < n && !(s->begins_bucket && s->begins_bucket(s->ctx, &t[i - 1], &t[i]))) continue;
        size_t end = i < n ? t[i].offset : model->num_params;
        for (size_t lo = run; lo < end; lo += bucket, b++)
            if (dp->start) {
                dp->start[b] = lo;
                dp->size[b] = end - lo < bucket ? end - lo : bucket;
            }
        run = end;
    }
    return b;
}

void data_parallel_init(DataParallel *dp, Model *model, Group *group, const BucketSync *sync) {
    size_t n = model->num_params;
    *dp = (DataParallel){.grads = model->grads,
                         .num_params = n,
                         .group = group,
                         .require_backward_grad_sync = 1,
                         .grads_pending = n,
                         .naive = model->cfg.dp_naive};
    if (sync) dp->sync = *sync;
    size_t bucket = sync && sync->bucket_floats
                        ? sync->bucket_floats
                        : (size_t)model->cfg.bucket_size_mb * 1024 * 1024 / sizeof(float);
    dp->num_buckets = lay_out_buckets(dp, model, bucket);
    dp->start = xmalloc(dp->num_buckets * sizeof(size_t));
    dp->size = xmalloc(dp->num_buckets * sizeof(size_t));
    dp->ready = xmalloc(dp->num_buckets * sizeof(size_t));
    dp->handles = xmalloc(dp->num_buckets * sizeof(Handle));
    dp->in_flight = xmalloc(dp->num_buckets * sizeof(int));
    lay_out_buckets(dp, model, bucket);
    model->on_grads_ready = data_parallel_grads_ready; // picotron's register_backward_hook
    model->hook_ctx = dp;
}

void data_parallel_wait(DataParallel *dp) {
    double backward_end = trace_compute_end();
    for (int b = 0; b < dp->num_buckets; b++) {
        if (dp->in_flight[b]) {
            comm_wait(&dp->handles[b]);
            account(dp, &dp->handles[b], backward_end);
            if (dp->sync.arrived) dp->sync.arrived(dp->sync.ctx, b);
        } else if (dp->group->size > 1 && !dp->naive)
            FAIL("every parameter's gradient must be reported by the backward hook",
                 "bucket %d of %d never became ready", b, dp->num_buckets);
        dp->in_flight[b] = 0;
        dp->ready[b] = 0;
    }
    dp->grads_pending = dp->num_params;
}

float average_loss_across_dp_cp_ranks(float loss, float *scratch, Group *cp_dp) {
    host_to_device(scratch, &loss, sizeof(float));
    all_reduce(scratch, 1, REDUCE_AVG, cp_dp);
    device_to_host(&loss, scratch, sizeof(float));
    return loss;
}

void data_parallel_free(DataParallel *dp) {
    free(dp->start);
    free(dp->size);
    free(dp->ready);
    free(dp->handles);
    free(dp->in_flight);
}
