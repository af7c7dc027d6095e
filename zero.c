// ZeRO-1 (distributed.zero1; DeepSpeed's stage 1, nanotron's and Megatron's distributed optimizer),
// beyond picotron: each of the R cp*dp replicas keeps AdamW's moments for 1/R of the parameters
// only. A bucket is reduce-scattered instead of all-reduced (the same bytes sent): rank r ends the
// step with the averaged gradient of piece r of every bucket, updates just that piece
// (optimizer.c), and every bucket's parameters are then all-gathered. The shard is piece r of
// each bucket, not one range of the flat buffer: so each bucket's reduce-scatter still starts
// during the backward, as soon as that bucket is ready, and every rank owns a share of every
// bucket (Megatron shards its buckets the same way). Buckets are a multiple of R floats; only the
// last may not be, and it alone goes through a padded scratch buffer (NCCL's pieces must all be
// the same size).
// The tied embedding of a pipeline is summed between its first and last stage after the wait, on
// the whole averaged gradient: the buckets that hold it are all-reduced even under ZeRO-1.
//
// data_parallel.c runs the buckets as always; it calls start_bucket and bucket_arrived below
// through its BucketSync.
#include "zero.h"
#include "backend/backend.h"
#include "utils.h"

static Handle start_bucket(void *ctx, int b) {
    Zero *z = ctx;
    DataParallel *dp = z->dp;
    float *bucket = dp->grads + dp->start[b];
    if (z->all_reduced[b]) return all_reduce_start(bucket, dp->size[b], REDUCE_AVG, dp->group);
    if (z->padded[b] != dp->size[b]) { // the last bucket: through the padded scratch
        device_copy(z->pad, bucket, dp->size[b] * sizeof(float));
        bucket = z->pad;
    }
    return reduce_scatter_start(bucket, z->padded[b], REDUCE_AVG, dp->group);
}

// the padded bucket's piece of this rank, back into the flat buffer
static void bucket_arrived(void *ctx, int b) {
    Zero *z = ctx;
    DataParallel *dp = z->dp;
    if (!z->all_reduced[b] && z->padded[b] != dp->size[b])
        device_copy(dp->grads + z->shard_start[b], z->pad + dp->group->rank * z->piece[b],
                    z->shard_size[b] * sizeof(float));
}

void zero_init(Zero *z, DataParallel *dp, Model *model, Group *group) {
    *z = (Zero){.dp = dp};
    // buckets of a multiple of the group's size, so that only the last needs padding
    size_t R = (size_t)group->size, last = 0;
    size_t bucket = (size_t)model->cfg.bucket_size_mb * 1024 * 1024 / sizeof(float);
    BucketSync sync = {.bucket_floats = bucket >= R ? bucket / R * R : R,
                       .start = start_bucket,
                       .arrived = bucket_arrived,
                       .ctx = z};
    data_parallel_init(dp, model, group, &sync);
    const PipelineStage *stage = &model->stage;
    int tied = model->pgm->pp_size > 1 && model->cfg.tie_word_embeddings &&
               (stage->has_embedding || stage->has_head);
    size_t tied_lo = tied ? (size_t)(model->dw.embed_tokens - model->grads) : 0;
    size_t tied_hi = tied ? tied_lo + (size_t)model->V * model->C : 0;
    int n = dp->num_buckets;
    z->piece = xmalloc(n * sizeof(size_t));
    z->padded = xmalloc(n * sizeof(size_t));
    z->shard_start = xmalloc(n * sizeof(size_t));
    z->shard_size = xmalloc(n * sizeof(size_t));
    z->all_reduced = xmalloc(n * sizeof(int));
    z->gathers = xmalloc(n * sizeof(Handle));
    for (int b = 0; b < n; b++) {
        size_t lo = dp->start[b], hi = lo + dp->size[b];
        z->piece[b] = (dp->size[b] + R - 1) / R;
        z->padded[b] = z->piece[b] * R;
        size_t first = lo + group->rank * z->piece[b];
        size_t end = first + z->piece[b] < hi ? first + z->piece[b] : hi;
        z->shard_start[b] = first < hi ? first : hi;
        z->shard_size[b] = first < end ? end - first : 0;
        z->all_reduced[b] = tied && lo < tied_hi && tied_lo < hi;
        if (z->padded[b] != dp->size[b]) last = z->padded[b];
    }
    z->pad = last ? device_malloc(last * sizeof(float)) : NULL; // zeroed: the padding adds 0
}

void zero_all_gather_params(Zero *z, float *params) {
    DataParallel *dp = z->dp;
    // all started at once: they travel together, and the padded one's copy waits for its turn
    for (int b = 0; b < dp->num_buckets; b++) {
        float *bucket = params + dp->start[b];
        if (z->padded[b] != dp->size[b]) {
            device_copy(z->pad + dp->group->rank * z->piece[b], params + z->shard_start[b],
                        z->shard_size[b] * sizeof(float));
            bucket = z->pad;
        }
        z->gathers[b] = all_gather_start(bucket, z->padded[b], dp->group);
    }
    for (int b = 0; b < dp->num_buckets; b++) {
        comm_wait(&z->gathers[b]);
        if (z->padded[b] != dp->size[b])
            device_copy(params + dp->start[b], z->pad, dp->size[b] * sizeof(float));
    }
}

void zero_free(Zero *z) {
    free(z->piece);
    free(z->padded);
    free(z->shard_start);
    free(z->shard_size);
    free(z->all_reduced);
    free(z->gathers);
    if (z->pad) device_free(z->pad);
}
