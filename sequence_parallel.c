// Sequence parallelism (Megatron-LM, Korthikanti et al. 2022, "Reducing Activation Recomputation
// in Large Transformer Models"), beyond picotron. Between the tensor-parallel regions every tp
// rank would hold the same (N, C) residual stream and run the same norms on it. Split over the
// tokens instead, each rank keeps N/tp consecutive rows of it, rank r rows [r*N/tp, (r+1)*N/tp);
// a region's input is all-gathered first (Megatron's g), and the forward's all-reduce becomes a
// reduce-scatter, each rank summing only its rows (g-bar); the backward swaps the two. The bytes
// moved are the same (an all-reduce is a reduce-scatter then an all-gather); the residual stream,
// the norms' outputs and the pipeline's messages shrink by tp.
//
// tensor_parallel.c meets it only through TensorParallel's split (the StreamSplit filled here).
// The norms now see only their rank's rows, so each rank's norm weight gradient is a part of the
// whole: as Megatron does, the parts are summed over tp once a step, in the step's last backward,
// before data parallelism's hook takes the gradients.
#include "sequence_parallel.h"
#include "backend/backend.h"
#include "utils.h"

static SequenceParallel *of(const StreamSplit *s) {
    return (SequenceParallel *)s; // split is its first member
}

static size_t block_floats(const SequenceParallel *sp) {
    return (size_t)sp->N * sp->C / sp->tp->size;
}

// every rank's block (N/tp, C) gathered into full (N, C) in rank order
static const float *gather(StreamSplit *s, const float *rows) {
    SequenceParallel *sp = of(s);
    device_copy(s->full + block_floats(sp) * sp->tp->rank, rows, block_floats(sp) * sizeof(float));
    all_gather(s->full, (size_t)sp->N * sp->C, sp->tp);
    return s->full;
}

static Handle reduce_scatter_rows(StreamSplit *s, float *x, size_t n) {
    return reduce_scatter_start(x, n, REDUCE_SUM, of(s)->tp);
}

static const float *own_rows(const StreamSplit *s, const float *x) {
    return x + block_floats(of(s)) * of(s)->tp->rank;
}

int sequence_parallel_rows(const Config *cfg, const ProcessGroupManager *pgm) {
    int N = cfg->micro_batch_size * (cfg->seq_length / pgm->cp_size);
    return cfg->sequence_parallel ? N / pgm->tp_size : N;
}

void sequence_parallel_split(SequenceParallel *sp, TensorParallel *tp, int N, int C) {
    *sp = (SequenceParallel){.split = {.full = device_malloc((size_t)N * C * sizeof(float)),
                                       .gather = gather,
                                       .reduce_scatter_start = reduce_scatter_rows,
                                       .own_rows = own_rows},
                             .N = N,
                             .C = C,
                             .tp = tp->group};
    tp->split = &sp->split;
}

// the norm weights of part p (model.h's part_start), in the gradient buffer dw points into now
static int part_norms(float *norms[2], const Model *model, int p) {
    const ModelWeights *dw = &model->dw;
    if (p == model->L) return norms[0] = dw->norm, 1;
    if (config_is_mamba(&model->cfg)) return norms[0] = dw->layers[p].norm, 1; // one norm
    norms[0] = dw->layers[p].self_attn.input_layernorm;
    norms[1] = dw->layers[p].mlp.post_attention_layernorm;
    return 2;
}

// the model's backward hook: the norms' parts summed over tp, then the next hook
static void norm_grads_ready(void *ctx, size_t offset, size_t count) {
    SequenceParallel *sp = ctx;
    const Model *model = sp->model;
    const size_t *at = model->part_start;
    for (int p = 0; p <= model->L && (sp->dp->require_backward_grad_sync || sp->every_micro_batch);
         p++) {
        if (at[p + 1] != offset || at[p + 2] != offset + count || count == 0) continue;
        float *norms[2];
        for (int i = 0, n = part_norms(norms, model, p); i < n; i++)
            all_reduce(norms[i], sp->C, REDUCE_SUM, sp->tp);
    }
    sp->next(sp->next_ctx, offset, count);
}

void sequence_parallel_init(SequenceParallel *sp, Model *model, DataParallel *dp) {
    sequence_parallel_split(sp, &model->tp, model->B * model->T, model->C);
    sp->model = model, sp->dp = dp;
    sp->every_micro_batch = model->cfg.zero_stage >= 2;
    sp->next = model->on_grads_ready, sp->next_ctx = model->hook_ctx;
    model->on_grads_ready = norm_grads_ready;
    model->hook_ctx = sp;
    model->extension_bytes += (size_t)sp->N * sp->C * sizeof(float);
}

void sequence_parallel_free(SequenceParallel *sp) {
    device_free(sp->split.full);
}
