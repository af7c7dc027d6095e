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
// ZeRO-1 (distributed.zero1; DeepSpeed's stage 1, nanotron's and Megatron's distributed optimizer):
// each of the R cp*dp replicas keeps AdamW's moments for 1/R of the parameters only. A bucket is
// reduce-scattered instead of all-reduced (the same bytes sent): rank r ends the step with the
// averaged gradient of piece r of every bucket, updates just that piece (optimizer.c), and every
// bucket's parameters are then all-gathered. The shard is piece r of each bucket, not one range
// of the flat buffer: so each bucket's reduce-scatter still starts during the backward, as soon as
// that bucket is ready, and every rank owns a share of every bucket (Megatron shards its buckets
// the same way). Buckets are a multiple of R floats; only the last may not be, and it alone goes
// through a padded scratch buffer (NCCL's pieces must all be the same size).
// The tied embedding of a pipeline is summed between its first and last stage after the wait, on
// the whole averaged gradient: the buckets that hold it are all-reduced even under ZeRO-1.
// Expert parallelism (expert_parallel.c): a rank holds E/ep experts, whose gradients already sum
// the tokens of its ep group's ranks. Their replicas are the cp*dp/ep ranks with the same experts,
// so the experts' tensors get buckets of their own, averaged over those ranks and divided by ep:
// the mean over all cp*dp replicas' tokens, as for every other weight.
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

// A bucket whose gradients are final: averaged over the replicas (ZeRO-1: each rank's piece only)
static void start_bucket(DataParallel *dp, int b) {
    float *bucket = dp->grads + dp->start[b];
    if (dp->expert[b]) { // (never with zero1: config_validate refuses it)
        scale_inplace(bucket, 1.0f / dp->ep, dp->size[b]);
        dp->handles[b] = all_reduce_start(bucket, dp->size[b], REDUCE_AVG, dp->expert_group);
        return;
    }
    if (!dp->zero1 || dp->all_reduced[b]) {
        dp->handles[b] = all_reduce_start(bucket, dp->size[b], REDUCE_AVG, dp->group);
        return;
    }
    if (dp->padded[b] != dp->size[b]) { // the last bucket: through the padded scratch
        device_copy(dp->pad, bucket, dp->size[b] * sizeof(float));
        bucket = dp->pad;
    }
    dp->handles[b] = reduce_scatter_start(bucket, dp->padded[b], REDUCE_AVG, dp->group);
}

// picotron's mark_param_as_ready, for a range of the flat gradient buffer
void data_parallel_grads_ready(void *ctx, size_t offset, size_t count) {
    DataParallel *dp = ctx;
    // one replica: nothing to average
    if (!dp->require_backward_grad_sync || dp->group->size == 1) return;
    if (dp->naive) { // (never with zero1: config_validate refuses it)
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

// ZeRO-1's pieces of each bucket, this rank's range of them, and which buckets hold the tied
// embedding of a pipeline (summed between stages after the wait: those are all-reduced)
static void zero1_init(DataParallel *dp, const Model *model) {
    size_t R = (size_t)dp->group->size, last = 0;
    const PipelineStage *stage = &model->stage;
    int tied = model->pgm->pp_size > 1 && model->cfg.tie_word_embeddings &&
               (stage->has_embedding || stage->has_head);
    size_t tied_lo = tied ? (size_t)(model->dw.embed_tokens - model->grads) : 0;
    size_t tied_hi = tied ? tied_lo + (size_t)model->V * model->C : 0;
    dp->piece = xmalloc(dp->num_buckets * sizeof(size_t));
    dp->padded = xmalloc(dp->num_buckets * sizeof(size_t));
    dp->shard_start = xmalloc(dp->num_buckets * sizeof(size_t));
    dp->shard_size = xmalloc(dp->num_buckets * sizeof(size_t));
    dp->all_reduced = xmalloc(dp->num_buckets * sizeof(int));
    dp->gathers = xmalloc(dp->num_buckets * sizeof(Handle));
    for (int b = 0; b < dp->num_buckets; b++) {
        size_t lo = dp->start[b], hi = lo + dp->size[b];
        dp->piece[b] = (dp->size[b] + R - 1) / R;
        dp->padded[b] = dp->piece[b] * R;
        size_t first = lo + dp->group->rank * dp->piece[b];
        size_t end = first + dp->piece[b] < hi ? first + dp->piece[b] : hi;
        dp->shard_start[b] = first < hi ? first : hi;
        dp->shard_size[b] = first < end ? end - first : 0;
        dp->all_reduced[b] = tied && lo < tied_hi && tied_lo < hi;
        if (dp->padded[b] != dp->size[b]) last = dp->padded[b];
    }
    dp->pad = last ? device_malloc(last * sizeof(float)) : NULL; // zeroed: the padding adds 0
}

// Buckets of at most `bucket` floats over the flat buffer in order; under expert parallelism a
// bucket holds experts' tensors only or none. Counts them, and fills dp's arrays once allocated.
static int lay_out_buckets(DataParallel *dp, const Model *model, size_t bucket) {
    const ParamInfo *t = model->table;
    int n = model->num_tensors, split = model->pgm->ep_size > 1, b = 0;
    size_t run = 0; // where the current run of tensors of one kind began
    for (int i = 1; i <= n; i++) {
        if (i < n && !(split && t[i].expert != t[i - 1].expert)) continue;
        size_t end = i < n ? t[i].offset : model->num_params;
        for (size_t lo = run; lo < end; lo += bucket, b++)
            if (dp->start) {
                dp->start[b] = lo;
                dp->size[b] = end - lo < bucket ? end - lo : bucket;
                dp->expert[b] = split && t[i - 1].expert;
            }
        run = end;
    }
    return b;
}

void data_parallel_init(DataParallel *dp, Model *model, Group *group) {
    size_t n = model->num_params;
    size_t bucket = (size_t)model->cfg.bucket_size_mb * 1024 * 1024 / sizeof(float);
    // ZeRO-1: buckets of a multiple of the group's size, so that only the last needs padding
    size_t R = (size_t)group->size;
    if (model->cfg.zero1) bucket = bucket >= R ? bucket / R * R : R;
    *dp = (DataParallel){.grads = model->grads,
                         .num_params = n,
                         .group = group,
                         .require_backward_grad_sync = 1,
                         .grads_pending = n,
                         .naive = model->cfg.dp_naive,
                         .zero1 = model->cfg.zero1,
                         .expert_group = &model->pgm->expert_dp,
                         .ep = model->pgm->ep_size};
    dp->num_buckets = lay_out_buckets(dp, model, bucket);
    dp->start = xmalloc(dp->num_buckets * sizeof(size_t));
    dp->size = xmalloc(dp->num_buckets * sizeof(size_t));
    dp->expert = xmalloc(dp->num_buckets * sizeof(int));
    dp->ready = xmalloc(dp->num_buckets * sizeof(size_t));
    dp->handles = xmalloc(dp->num_buckets * sizeof(Handle));
    dp->in_flight = xmalloc(dp->num_buckets * sizeof(int));
    lay_out_buckets(dp, model, bucket);
    if (dp->zero1) zero1_init(dp, model);
    model->on_grads_ready = data_parallel_grads_ready; // picotron's register_backward_hook
    model->hook_ctx = dp;
}

void data_parallel_wait(DataParallel *dp) {
    double backward_end = trace_compute_end();
    for (int b = 0; b < dp->num_buckets; b++) {
        if (dp->in_flight[b]) {
            comm_wait(&dp->handles[b]);
            account(dp, &dp->handles[b], backward_end);
            if (dp->zero1 && !dp->all_reduced[b] && dp->padded[b] != dp->size[b])
                device_copy(dp->grads + dp->shard_start[b],
                            dp->pad + dp->group->rank * dp->piece[b],
                            dp->shard_size[b] * sizeof(float));
        } else if (dp->group->size > 1 && !dp->naive)
            FAIL("every parameter's gradient must be reported by the backward hook",
                 "bucket %d of %d never became ready", b, dp->num_buckets);
        dp->in_flight[b] = 0;
        dp->ready[b] = 0;
    }
    dp->grads_pending = dp->num_params;
}

void data_parallel_all_gather_params(DataParallel *dp, float *params) {
    if (!dp->zero1 || dp->group->size == 1) return;
    // all started at once: they travel together, and the padded one's copy waits for its turn
    for (int b = 0; b < dp->num_buckets; b++) {
        float *bucket = params + dp->start[b];
        if (dp->padded[b] != dp->size[b]) {
            device_copy(dp->pad + dp->group->rank * dp->piece[b], params + dp->shard_start[b],
                        dp->shard_size[b] * sizeof(float));
            bucket = dp->pad;
        }
        dp->gathers[b] = all_gather_start(bucket, dp->padded[b], dp->group);
    }
    for (int b = 0; b < dp->num_buckets; b++) {
        comm_wait(&dp->gathers[b]);
        if (dp->padded[b] != dp->size[b])
            device_copy(params + dp->start[b], dp->pad, dp->size[b] * sizeof(float));
    }
}

void data_parallel_free(DataParallel *dp) {
    if (dp->zero1) {
        free(dp->piece);
        free(dp->padded);
        free(dp->shard_start);
        free(dp->shard_size);
        free(dp->all_reduced);
        free(dp->gathers);
        if (dp->pad) device_free(dp->pad);
    }
    free(dp->start);
    free(dp->size);
    free(dp->expert);
    free(dp->ready);
    free(dp->handles);
    free(dp->in_flight);
}
