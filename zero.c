// ZeRO (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
// Models"), beyond picotron, in three steps over the R cp*dp replicas (distributed.zero_stage):
// stage 1 shards AdamW's moments, stage 2 the gradients too, stage 3 the weights too (FSDP).
//
// Stage 1 (distributed.zero1; DeepSpeed's stage 1, nanotron's and Megatron's distributed
// optimizer): each of the R cp*dp replicas keeps AdamW's moments for 1/R of the parameters
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
#include <math.h>
#include <stdio.h>
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

static void stage1_init(Zero *z, DataParallel *dp, Model *model, Group *group) {
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
    z->num_ranges = n;
}

static void stage1_all_gather_params(Zero *z, float *params) {
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

// ---------------------------------------------------------------------------------------------
// Stages 2 and 3: FSDP's units. Unit u is the model's part u - 1 (the embedding, one decoder
// layer, the head), a contiguous range of the flat buffer cut into R pieces; this rank owns piece
// r of every unit, as stage 1 owns piece r of every bucket. No full gradient buffer lives on:
// a unit's whole gradient exists from the start of its backward until its reduce-scatter, each
// micro-batch (the mean lands in piece r and is added to the shard's gradient). Under stage 3 the
// weights exist whole only for a while too: a unit is all-gathered just before its forward and
// again before its backward, the next unit's gather started at once (the prefetch), and released
// when the model moves on. Every rank of the group runs the same schedule, so the collectives
// meet in the same order.

static size_t unit_lo(const Zero *z, int u) {
    return z->model->part_start[u];
}
static size_t unit_size(const Zero *z, int u) {
    return z->model->part_start[u + 1] - z->model->part_start[u];
}
// a unit's whole buffer: R pieces, the last padded (NCCL's pieces must all be the same size)
static size_t unit_padded(const Zero *z, int u) {
    return z->unit_piece[u] * z->group->size;
}

static float *alloc_buffer(Zero *z, size_t floats) {
    z->buffer_bytes += floats * sizeof(float);
    if (z->buffer_bytes > z->peak_buffer_bytes) z->peak_buffer_bytes = z->buffer_bytes;
    return device_malloc(floats * sizeof(float)); // zeroed: a gradient is added into it
}
static void free_buffer(Zero *z, float **buffer, int u) {
    z->buffer_bytes -= unit_padded(z, u) * sizeof(float);
    device_free(*buffer);
    *buffer = NULL;
}

// w's pointers for unit u's tensors into buffer (buffer[0] is the unit's first element)
static void point_unit(Zero *z, ModelWeights *w, int u, float *buffer) {
    Model *m = z->model;
    ModelWeights *t = &z->window;
    m->window_lo = unit_lo(z, u), m->window_hi = unit_lo(z, u) + unit_size(z, u);
    model_layout_params(m, t, buffer);
    m->window_hi = 0;
    int tied = m->cfg.tie_word_embeddings;
    if (u == 0) { // the embedding, which a tied head reads too
        w->embed_tokens = t->embed_tokens;
        if (tied && m->stage.has_head) w->lm_head = t->embed_tokens;
    } else if (u <= m->L) {
        w->layers[u - 1] = t->layers[u - 1];
    } else {
        w->norm = t->norm;
        if (!tied) w->lm_head = t->lm_head;
    }
}

// the units part p reads: its own, and the embedding for a tied head
static int part_units(int units[2], const Zero *z, int p) {
    int n = 0;
    if (unit_size(z, p + 1) > 0) units[n++] = p + 1;
    if (p == z->model->L && z->model->cfg.tie_word_embeddings && unit_size(z, 0) > 0)
        units[n++] = 0;
    return n;
}

static void gather_start(Zero *z, int u) {
    float *buffer = z->gathered[u] = alloc_buffer(z, unit_padded(z, u));
    device_copy(buffer + z->group->rank * z->unit_piece[u], z->param_shard + z->shard_at[u],
                z->shard_size[u] * sizeof(float));
    z->gather[u] = all_gather_start(buffer, unit_padded(z, u), z->group);
    z->gathering[u] = 1;
    z->gathers_started++;
}

static void gather_wait(Zero *z, int u) {
    if (!z->gathered[u]) gather_start(z, u);
    if (!z->gathering[u]) return;
    Handle *h = &z->gather[u];
    comm_wait(h);
    z->gathering[u] = 0;
    double wait_began = h->finished - h->waited;
    z->gather_in_flight += h->finished - h->started;
    z->gather_hidden += fmax(0.0, wait_began - h->started);
    point_unit(z, &z->model->w, u, z->gathered[u]);
}

static void release(Zero *z, int u) {
    if (z->gathering[u]) comm_wait(&z->gather[u]);
    z->gathering[u] = 0;
    if (z->gathered[u]) free_buffer(z, &z->gathered[u], u);
}

static void scatter_finish(Zero *z, int u) {
    Handle *h = &z->scatter[u];
    comm_wait(h);
    z->scattering[u] = 0;
    // data_parallel.c's figures: the reductions' time in flight, and the part not waited for
    z->dp->in_flight_seconds += h->finished - h->started;
    z->dp->overlapped_seconds += fmax(0.0, h->finished - h->waited - h->started);
    add_inplace(z->grad_shard + z->shard_at[u],
                z->grad_buffer[u] + z->group->rank * z->unit_piece[u], z->shard_size[u]);
    free_buffer(z, &z->grad_buffer[u], u);
}

// whether this stage runs part q's forward (or its backward, reading weights)
static int part_runs(const Model *m, int q, int backward) {
    if (q >= 0 && q < m->L) return 1;
    if (q == -1) return m->stage.has_embedding && !backward;
    return q == m->L && m->stage.has_head;
}

// the model's parameter hook: part p is about to be read, in the forward or the backward
static void unit_needed(void *ctx, int p, int backward) {
    Zero *z = ctx;
    Model *m = z->model;
    int units[2], n = part_units(units, z, p);
    // a new pass (a forward, or a backward, of another micro-batch) overlaps nothing with the last
    // pass's reduce-scatter: it ends now, before this pass's buffers are made
    int new_pass = backward != z->backward || (backward ? p >= z->part : p <= z->part);
    z->part = p, z->backward = backward;
    for (int u = 0; u < z->num_units; u++) {
        if (new_pass && z->scattering[u]) scatter_finish(z, u);
        if (z->gathering[u] || z->scattering[u]) // MPI moves them along inside its calls
            comm_test(z->gathering[u] ? &z->gather[u] : &z->scatter[u]);
    }
    if (z->stage == 3 && !(backward && p == -1)) { // the embedding's backward reads no weight
        // the next part of this pass, if this stage runs it: its gather travels while p computes
        int q = backward ? p - 1 : p + 1, next[2];
        int k = part_runs(m, q, backward) ? part_units(next, z, q) : 0;
        for (int u = 0; u < z->num_units; u++) { // first what neither p nor the next part reads
            int keep = 0;
            for (int i = 0; i < n; i++) keep |= units[i] == u;
            for (int i = 0; i < k; i++) keep |= next[i] == u;
            if (!keep) release(z, u);
        }
        for (int i = 0; i < n; i++) gather_wait(z, units[i]);
        for (int i = 0; i < k; i++)
            if (!z->gathered[next[i]]) gather_start(z, next[i]), z->prefetches++;
    }
    for (int i = 0; backward && i < n; i++) { // the gradient lands in a whole-unit buffer
        int u = units[i];
        if (z->scattering[u]) scatter_finish(z, u); // the last micro-batch's (a tied head's)
        if (z->grad_buffer[u]) continue;            // begun by a tied head, this micro-batch
        z->grad_buffer[u] = alloc_buffer(z, unit_padded(z, u));
        point_unit(z, &m->dw, u, z->grad_buffer[u]);
    }
}

// the model's backward hook: a unit's gradient is complete for this micro-batch
static void unit_grads_ready(void *ctx, size_t offset, size_t count) {
    Zero *z = ctx;
    for (int u = 0; u < z->num_units; u++) // one in flight at a time: the others' buffers go
        if (z->scattering[u]) scatter_finish(z, u);
    for (int u = 0; u < z->num_units; u++)
        if (count > 0 && unit_lo(z, u) == offset && unit_size(z, u) == count) {
            z->scatter[u] =
                reduce_scatter_start(z->grad_buffer[u], unit_padded(z, u), REDUCE_AVG, z->group);
            z->scattering[u] = 1;
            z->scatters_started++;
        }
}

// unit u of full (at its flat offset) from every rank's piece, this rank's read from mine
static void all_gather_unit(Zero *z, float *full, const float *mine, int u) {
    size_t piece = z->unit_piece[u], padded = unit_padded(z, u), n = unit_size(z, u);
    float *buffer = padded == n ? full + unit_lo(z, u) : alloc_buffer(z, padded);
    float *own = buffer + z->group->rank * piece;
    if (own != mine) device_copy(own, mine, z->shard_size[u] * sizeof(float));
    all_gather(buffer, padded, z->group);
    if (padded == n) return;
    device_copy(full + unit_lo(z, u), buffer, n * sizeof(float));
    free_buffer(z, &buffer, u);
}

static void units_init(Zero *z, DataParallel *dp, Model *model, Group *group) {
    data_parallel_init(dp, model, group, NULL); // the schedules read its flags; it sends nothing
    size_t R = (size_t)group->size, at = 0;
    int n = z->num_units = z->num_ranges = model->L + 2;
    z->unit_piece = xmalloc(n * sizeof(size_t));
    z->shard_start = xmalloc(n * sizeof(size_t));
    z->shard_size = xmalloc(n * sizeof(size_t));
    z->shard_at = xmalloc(n * sizeof(size_t));
    for (int u = 0; u < n; u++) {
        size_t lo = unit_lo(z, u), hi = lo + unit_size(z, u);
        z->unit_piece[u] = (unit_size(z, u) + R - 1) / R;
        size_t first = lo + group->rank * z->unit_piece[u], end = first + z->unit_piece[u];
        z->shard_start[u] = first < hi ? first : hi;
        z->shard_size[u] = first < hi ? (end < hi ? end : hi) - first : 0;
        z->shard_at[u] = at;
        at += z->shard_size[u];
    }
    z->grad_buffer = xmalloc(n * sizeof(float *)); // zeroed: none alive
    z->gathered = xmalloc(n * sizeof(float *));
    z->scatter = xmalloc(n * sizeof(Handle));
    z->gather = xmalloc(n * sizeof(Handle));
    z->scattering = xmalloc(n * sizeof(int));
    z->gathering = xmalloc(n * sizeof(int));
    z->window.layers = xmalloc((model->L ? model->L : 1) * sizeof(LayerWeights));
    // model_init made no full gradient buffer, and under stage 3 no full parameters: the shards
    z->shard_floats = at;
    model->grads = z->grad_shard = device_malloc(at * sizeof(float));
    model->on_grads_ready = unit_grads_ready, model->hook_ctx = z;
    model->on_params_needed = unit_needed, model->params_ctx = z;
    if (z->stage == 2) return;
    model->params = z->param_shard = device_malloc(at * sizeof(float));
    // each unit's first values made whole, one unit at a time, and this rank's piece kept
    for (int u = 0; u < n; u++) {
        float *unit = alloc_buffer(z, unit_padded(z, u));
        for (int i = 0; i < model->num_tensors; i++) {
            const ParamInfo *p = &model->table[i];
            if (p->offset >= unit_lo(z, u) && p->offset < unit_lo(z, u) + unit_size(z, u))
                model_init_tensor(model, unit + (p->offset - unit_lo(z, u)), p);
        }
        device_copy(z->param_shard + z->shard_at[u], unit + group->rank * z->unit_piece[u],
                    z->shard_size[u] * sizeof(float));
        free_buffer(z, &unit, u);
    }
    z->peak_buffer_bytes = 0; // the steps' peak, not the set-up's
}

// ---------------------------------------------------------------------------------------------

void zero_init(Zero *z, DataParallel *dp, Model *model, Group *group) {
    *z = (Zero){.stage = model->cfg.zero_stage, .dp = dp, .model = model, .group = group};
    if (z->stage == 1)
        stage1_init(z, dp, model, group);
    else
        units_init(z, dp, model, group);
}

void zero_optimizer_init(Optimizer *opt, const Zero *z, const Config *cfg) {
    optimizer_init_ranges(opt, cfg, z->num_ranges, z->shard_start, z->shard_size);
    opt->grads_compact = z->stage >= 2;
    opt->params_compact = z->stage == 3;
}

void zero_wait(Zero *z) {
    Model *m = z->model;
    for (int u = 0; u < z->num_units; u++) {
        if (z->scattering[u]) scatter_finish(z, u);
        if (z->grad_buffer[u])
            FAIL("every unit's gradient must be reported by the backward hook",
                 "unit %d's gradient was never reduce-scattered", u);
        release(z, u); // the next step's forward gathers again, after AdamW
    }
    ProcessGroupManager *pgm = m->pgm;
    if (pgm->pp_size > 1 && m->cfg.tie_word_embeddings &&
        (m->stage.has_embedding || m->stage.has_head)) // piece r of the same tensor, both stages
        all_reduce(z->grad_shard + z->shard_at[0], z->shard_size[0], REDUCE_SUM, &pgm->embed);
}

void zero_after_step(Zero *z) {
    if (z->stage == 1) stage1_all_gather_params(z, z->model->params);
    if (z->stage == 2)
        for (int u = 0; u < z->num_units; u++)
            if (unit_size(z, u) > 0)
                all_gather_unit(z, z->model->params, z->model->params + z->shard_start[u], u);
    if (z->stage >= 2) device_zero(z->grad_shard, z->shard_floats * sizeof(float));
}

void zero_unshard_params(Zero *z) {
    if (z->stage != 3) return;
    Model *m = z->model;
    m->params = device_malloc(m->num_params * sizeof(float));
    for (int u = 0; u < z->num_units; u++)
        if (unit_size(z, u) > 0) all_gather_unit(z, m->params, z->param_shard + z->shard_at[u], u);
}

void zero_reshard_params(Zero *z) {
    if (z->stage != 3 || z->model->params == z->param_shard) return; // nothing was read
    Model *m = z->model;
    for (int u = 0; u < z->num_units; u++)
        device_copy(z->param_shard + z->shard_at[u], m->params + z->shard_start[u],
                    z->shard_size[u] * sizeof(float));
    device_free(m->params);
    m->params = z->param_shard;
}

void zero_report(const Zero *z, int steps) {
    if (z->stage < 2 || steps == 0) return;
    printf("[rank %d] ZeRO-%d: per step %ld unit reduce-scatters", z->model->pgm->global_rank,
           z->stage, z->scatters_started / steps);
    if (z->stage == 3)
        printf(", %ld unit all-gathers (%ld of them prefetched), %.0f%% of their time in flight "
               "not waited for",
               z->gathers_started / steps, z->prefetches / steps,
               z->gather_in_flight > 0 ? 100.0 * z->gather_hidden / z->gather_in_flight : 0.0);
    printf("; gathered and gradient buffers peak %.3f MB\n", z->peak_buffer_bytes / 1e6);
}

void zero_free(Zero *z) {
    free(z->shard_start);
    free(z->shard_size);
    if (z->stage == 1) {
        free(z->piece);
        free(z->padded);
        free(z->all_reduced);
        free(z->gathers);
        if (z->pad) device_free(z->pad);
        return;
    }
    free(z->unit_piece);
    free(z->shard_at);
    free(z->grad_buffer);
    free(z->gathered);
    free(z->scatter);
    free(z->gather);
    free(z->scattering);
    free(z->gathering);
    free(z->window.layers);
    // the shards are the model's flat buffers now: model_free frees them
}
