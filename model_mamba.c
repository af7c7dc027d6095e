// The Mamba in the trainer (model.model_type "mamba"): transformers' MambaForCausalLM, whose layer
// is h = h + mixer(rmsnorm(h)) (MambaBlock) with mamba.c's mixer in place of attention and MLP.
// The embedding, the final norm (backbone.norm_f, eps layer_norm_epsilon), the head and the loss
// are the Llama's (model.c), so the pipeline, data parallelism, ZeRO-1, checkpoints and the DoReMi
// loss hook see one more kind of layer and nothing else.
//
// Tensors, named as transformers saves a Mamba, so that a checkpoint is a MambaForCausalLM folder
// and init_from reads one with no renaming: backbone.embeddings.weight, per layer
// backbone.layers.N.norm.weight and backbone.layers.N.mixer.{in_proj.weight, conv1d.weight
// (saved (I, 1, W) as torch's Conv1d), conv1d.bias, x_proj.weight, dt_proj.weight, dt_proj.bias,
// A_log, D, out_proj.weight}, backbone.norm_f.weight, and lm_head.weight when untied.
//
// Init, as transformers' MambaPreTrainedModel._init_weights, each element a pure function of
// (seed, name, index) as the Llama's so every layout starts from the same bits: A_log = log(1..S)
// in every channel (S4D-real), D = 1, dt_proj.weight uniform(+-R^-0.5 * time_step_scale) (or
// that constant), dt_proj.bias the inverse softplus of a dt drawn log-uniform in [time_step_min,
// time_step_max] (floored at time_step_floor), so that softplus(dt_proj.bias) starts in that
// range; conv1d.weight uniform(+-1/sqrt(W)) (kaiming_uniform with a = sqrt(5)), its bias 0. The
// linears and the embedding start as the Llama's (uniform(+-1/sqrt(fan_in)), N(0, 1)), where
// transformers would draw N(0, initializer_range).
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "backend/backend.h"
#include "backend/init_value.h"
#include "mamba_context_parallel.h"
#include "model.h"
#include "utils.h"

// in_proj (2I, C) is two linears stacked, x's rows then z's: under tp each rank holds its share
// of each, two blocks of the one tensor, so two table rows of one name (checkpoints read, write
// and checksum a tensor block by block); on one rank they are the one block
static float *add_in_proj(Model *model, float *base, const char *name, int I, int C) {
    const Group *tp = &model->pgm->tp;
    if (tp->size == 1)
        return model_add_param(model, base, name, 2 * I, C, COLUMN_PARALLEL, UNIFORM);
    float *first = NULL;
    for (int half = 0; half < 2; half++) {
        size_t before = model->num_params;
        float *p = model_add_param(model, base, name, 2 * I, C, COLUMN_PARALLEL, UNIFORM);
        ParamInfo *info = &model->table[model->num_tensors - 1];
        info->rows = I / tp->size, info->row0 = half * I + tp->rank * info->rows;
        model->num_params = before + (size_t)info->rows * C;
        if (half == 0) first = p;
    }
    return first;
}

void mamba_layout_params(Model *model, ModelWeights *w, float *base) {
    const Config *c = &model->cfg;
    int C = c->hidden_size, V = c->vocab_size, I = c->expand * C, S = c->state_size;
    int R = config_time_step_rank(c), W = c->conv_kernel;
    float dt_std = 1.0f / sqrtf((float)R) * c->time_step_scale;
    int dt_kind = strcmp(c->time_step_init_scheme, "constant") == 0 ? CONSTANT : UNIFORM;
    // the mixer's tensors in mamba_tensor_names' order: shape, split over tp, init kind and
    // bound (-1: model_add_param's)
    const struct {
        int rows, cols;
        TensorParallelSplit split;
        int kind;
        float bound;
    } shapes[MAMBA_TENSORS] = {
        {2 * I, C, COLUMN_PARALLEL, UNIFORM, -1}, {I, W, COLUMN_PARALLEL, UNIFORM, -1},
        {1, I, ROW_PARALLEL, CONSTANT, 0.0f},     {R + 2 * S, I, ROW_PARALLEL, UNIFORM, -1},
        {I, R, COLUMN_PARALLEL, dt_kind, dt_std}, {1, I, ROW_PARALLEL, MAMBA_DT_BIAS, -1},
        {I, S, COLUMN_PARALLEL, MAMBA_A_LOG, -1}, {1, I, ROW_PARALLEL, CONSTANT, 1.0f},
        {C, I, ROW_PARALLEL, UNIFORM, -1}};
    char n[128];
    if (model->stage.has_embedding || (model->stage.has_head && c->tie_word_embeddings))
        w->embed_tokens = model_add_param(model, base, "backbone.embeddings.weight", V, C,
                                          VOCAB_PARALLEL, NORMAL);
    for (int l = 0; l < model->L; l++) {
        LayerWeights *lw = &w->layers[l];
        int layer = stage_global_layer(&model->stage, l);
        snprintf(n, sizeof n, "backbone.layers.%d.norm.weight", layer);
        lw->norm = model_add_param(model, base, n, 1, C, REPLICATED, CONSTANT);
        float *t[MAMBA_TENSORS];
        for (int i = 0; i < MAMBA_TENSORS; i++) {
            t[i] = NULL;
            if (i == 2 && !c->use_conv_bias) continue; // conv1d.bias
            snprintf(n, sizeof n, "backbone.layers.%d.mixer.%s", layer, mamba_tensor_names[i]);
            if (i == 0) { // in_proj
                t[i] = add_in_proj(model, base, n, I, C);
                continue;
            }
            t[i] = model_add_param(model, base, n, shapes[i].rows, shapes[i].cols, shapes[i].split,
                                   shapes[i].kind);
            ParamInfo *p = &model->table[model->num_tensors - 1];
            if (shapes[i].bound >= 0) p->init_bound = shapes[i].bound;
            p->conv_shape = i == 1;
        }
        lw->mixer = mamba_weights_point(t);
    }
    if (!model->stage.has_head) return;
    w->norm = model_add_param(model, base, "backbone.norm_f.weight", 1, C, REPLICATED, CONSTANT);
    w->lm_head = c->tie_word_embeddings ? w->embed_tokens
                                        : model_add_param(model, base, "lm_head.weight", V, C,
                                                          VOCAB_PARALLEL, UNIFORM);
}

// element (r, c) of p's block, at global column col0 + c (A_log and dt_proj.bias depend on the
// channel or the state alone, so the block's rows do not enter)
void mamba_init_tensor(Model *model, const ParamInfo *p) {
    const Config *c = &model->cfg;
    uint64_t key = mix64(mix64((uint64_t)c->seed) ^ hash_string(p->name)); // init_tensor's stream
    size_t n = (size_t)p->rows * p->cols;
    float *host = xmalloc(n * sizeof(float));
    double lo = log(c->time_step_min), hi = log(c->time_step_max);
    for (int r = 0; r < p->rows; r++)
        for (int k = 0; k < p->cols; k++) {
            int col = p->col0 + k;
            double value;
            if (p->init_kind == MAMBA_A_LOG) { // A = -(1..S): log(s + 1) for state s
                value = log((double)(col + 1));
            } else { // dt log-uniform, floored; softplus^-1(dt) = dt + log(1 - exp(-dt))
                double dt = exp(uniform01(key, 2 * (uint64_t)col) * (hi - lo) + lo);
                dt = fmax(dt, c->time_step_floor);
                value = dt + log(-expm1(-dt));
            }
            host[(size_t)r * p->cols + k] = (float)value;
        }
    host_to_device(model->params + p->offset, host, n * sizeof(float));
    free(host);
}

void mamba_layer_forward(Model *model, float *out, const Activations *a, int l) {
    const LayerWeights *w = &model->w.layers[l];
    LayerActivations *s = &a->layers[l];
    const float *x = model_layer_input(model, a, l);
    size_t NC = (size_t)model->Ns * model->C;
    // ln = rmsnorm(x), eps layer_norm_epsilon (model->cfg.rms_norm_eps holds it)
    rmsnorm_forward(s->self_attn.ln1, s->self_attn.rstd1, x, w->norm, model->Ns, model->C,
                    model->cfg.rms_norm_eps);
    // out = x + mixer(ln), the mixer reading all N tokens of ln (gathered under sequence
    // parallelism) and its out_proj leaving this rank's rows of its output
    const float *ln = tensor_parallel_region_input(&model->tp, s->self_attn.ln1);
    mamba_forward(out, &s->mixer, ln, &w->mixer, &model->mamba);
    add_inplace(out, x, NC);
}

void mamba_layer_backward(Model *model, float *dresid, const Activations *a, int l) {
    const LayerWeights *w = &model->w.layers[l], *dw = &model->dw.layers[l];
    const LayerActivations *s = &a->layers[l];
    TensorParallel *tp = &model->tp;
    int N = model->B * model->T, C = model->C;
    float *dln = model->d.self_attn.ln1; // (N, C)
    // forward: out = x + mixer(ln): dresid passes through the residual, the mixer adds into dln.
    // Under sequence parallelism the mixer reads all N rows of d out and of ln, each gathered
    // into the one region buffer: d out is kept apart first
    const float *dy = tensor_parallel_region_input(tp, dresid);
    if (tp->split) {
        device_copy(model->mamba_dy, dy, (size_t)N * C * sizeof(float));
        dy = model->mamba_dy;
    }
    const float *ln = tensor_parallel_region_input(tp, s->self_attn.ln1);
    device_zero(dln, (size_t)N * C * sizeof(float));
    mamba_backward(dln, &dw->mixer, &model->mamba_grads, dy, &s->mixer, ln, &w->mixer,
                   &model->mamba);
    // forward: xi, z = in_proj(ln), column-parallel: this rank's channels' part of d ln sums
    // (all-reduced, or reduce-scattered to this rank's rows)
    if (model->mamba.tp) {
        Handle h = tensor_parallel_grad_sum_start(tp, dln, (size_t)N * C);
        comm_wait(&h);
    }
    // forward: ln = rmsnorm(x), on this rank's rows
    rmsnorm_backward(dresid, dw->norm, tensor_parallel_own_rows(tp, dln),
                     model_layer_input(model, a, l), w->norm, s->self_attn.rstd1, model->Ns, C);
}

void mamba_alloc_buffers(Model *model) {
    Config *c = &model->cfg;
    int I = c->expand * c->hidden_size / model->pgm->tp.size;
    model->mamba = mamba_sizes(model->B, model->T, model->C, I, c->state_size,
                               config_time_step_rank(c), c->conv_kernel);
    if (model->pgm->tp.size > 1) model->mamba.tp = &model->tp; // the channels split over tp
    if (c->sequence_parallel) { // d out gathered, kept apart from ln's gather
        model->mamba_dy = device_malloc((size_t)model->B * model->T * model->C * sizeof(float));
        model->extension_bytes += (size_t)model->B * model->T * model->C * sizeof(float);
    }
    if (model->pgm->cp.size > 1) { // the sequence split over cp (mamba_context_parallel.c)
        model->mamba_cp = xmalloc(sizeof(MambaContextParallel));
        mamba_cp_alloc(model->mamba_cp, &model->pgm->cp, &model->mamba);
        model->extension_bytes += mamba_cp_bytes(&model->mamba);
    }
    mamba_grads_alloc(&model->mamba_grads, &model->mamba);
    model->extension_bytes += mamba_grads_bytes(&model->mamba);
    // the Llama's final norm (model.c) is norm_f here: MambaRMSNorm's eps is layer_norm_epsilon
    c->rms_norm_eps = c->layer_norm_epsilon;
}

void mamba_free_buffers(Model *model) {
    mamba_grads_free(&model->mamba_grads);
    if (model->mamba_cp) mamba_cp_free(model->mamba_cp);
    if (model->mamba_dy) device_free(model->mamba_dy);
    free(model->mamba_cp);
}

// ./generate's recurrent state (B = 1): what the prompt's window forward left in slot 0, rows
// [0, P), scanned once more into each layer's SSM state after token P-1, (L, I, S)
float *mamba_decode_begin(Model *model, int P) {
    const MambaSizes *s = &model->mamba;
    size_t state = (size_t)s->I * s->S;
    float *states = device_malloc(model->L * state * sizeof(float));
    for (int l = 0; l < model->L; l++) {
        const MambaActivations *a = &model->slots[0].layers[l].mixer;
        const MambaWeights *w = &model->w.layers[l].mixer;
        selective_scan_chunk_forward(model->mamba_grads.dy, a->u, a->dt, w->dt_proj_bias, w->A_log,
                                     a->Bm, a->Cm, w->D, 1, P, s->I, s->S, NULL, states + l * state,
                                     NULL);
    }
    return states;
}

// Position pos alone, its token given, as model_forward computes row pos of slot 0: each layer's
// conv reads the rows of xi before it (its window), its scan steps the layer's state by one
// token. Writes row pos of the slot's tensors and of model->logits.
void mamba_decode_step(Model *model, int pos, int token, float *states) {
    Activations *a = &model->slots[0];
    const MambaSizes *s = &model->mamba;
    int C = model->C, V = model->V, I = s->I, S = s->S, R = s->R, W = s->W;
    size_t p = pos, NC = (size_t)model->T * C, state = (size_t)I * S;
    float eps = model->cfg.rms_norm_eps, *u_win = model->mamba_grads.du;
    float *pre_win = model->mamba_grads.dxi;
    host_to_device(a->tokens + p, &token, sizeof token);
    embedding_forward(a->resid + p * C, a->tokens + p, model->w.embed_tokens, 1, C, 0, V);
    for (int l = 0; l < model->L; l++) {
        const LayerWeights *w = &model->w.layers[l];
        const MambaWeights *m = &w->mixer;
        MambaActivations *x = &a->layers[l].mixer;
        float *in = a->resid + l * NC + p * C, *out = a->resid + (l + 1) * NC + p * C;
        float *ln = a->layers[l].self_attn.ln1 + p * C;
        rmsnorm_forward(ln, a->layers[l].self_attn.rstd1 + p, in, w->norm, 1, C, eps);
        // in_proj, then the conv over the window of the last W rows of xi (fewer at the start)
        matmul_forward(x->xi + p * I, ln, m->in_proj, 1, C, I);
        matmul_forward(x->z + p * I, ln, m->in_proj + (size_t)I * C, 1, C, I);
        int first = pos - (W - 1) > 0 ? pos - (W - 1) : 0, rows = pos - first + 1;
        causal_conv1d_forward(u_win, pre_win, x->xi + (size_t)first * I, m->conv1d_weight,
                              m->conv1d_bias, 1, rows, I, W);
        device_copy(x->u + p * I, u_win + (size_t)(rows - 1) * I, I * sizeof(float));
        device_copy(x->pre + p * I, pre_win + (size_t)(rows - 1) * I, I * sizeof(float));
        // x_proj, dt_proj, then the scan of one token from the layer's state, which it steps
        matmul_forward(x->dt_low + p * R, x->u + p * I, m->x_proj, 1, I, R);
        matmul_forward(x->Bm + p * S, x->u + p * I, m->x_proj + (size_t)R * I, 1, I, S);
        matmul_forward(x->Cm + p * S, x->u + p * I, m->x_proj + (size_t)(R + S) * I, 1, I, S);
        matmul_forward(x->dt + p * I, x->dt_low + p * R, m->dt_proj_weight, 1, R, I);
        float *h = states + l * state;
        selective_scan_chunk_forward(x->y + p * I, x->u + p * I, x->dt + p * I, m->dt_proj_bias,
                                     m->A_log, x->Bm + p * S, x->Cm + p * S, m->D, 1, 1, I, S, h, h,
                                     NULL);
        // the gate, out_proj and the residual
        swiglu_forward(x->gated + p * I, x->z + p * I, x->y + p * I, I);
        matmul_forward(out, x->gated + p * I, m->out_proj, 1, I, C);
        add_inplace(out, in, C);
    }
    float *lnf = a->lnf + p * C;
    rmsnorm_forward(lnf, a->rstdf + p, a->resid + model->L * NC + p * C, model->w.norm, 1, C, eps);
    matmul_forward(model->logits + p * V, lnf, model->w.lm_head, 1, C, V);
}
