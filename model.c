// The Llama model of one rank: the parameter table over flat buffers, and the forward and
// backward of this rank's pipeline stage. Tensor parallelism splits heads, intermediate
// features and the vocabulary (tensor_parallel.c); context parallelism splits the sequence
// (context_parallel.c); the pipeline decides which layers live here (pipeline_parallel.c).
// Device memory is only ever passed to backend kernels and collectives, never touched here.
#include "model.h"
#include <math.h>
#include <string.h>
#include "backend/backend.h"
#include "pipeline_parallel.h"
#include "tensor_parallel.h"
#include "utils.h"

enum { NOT_SPLIT, SPLIT_ROWS, SPLIT_COLS };

// Registers this rank's shard of a (rows, cols) tensor, shaped as Hugging Face stores it: split
// over tp by rows (column-parallel linears, the vocabulary), by columns (row-parallel linears) or
// not at all (norms). Returns its place in `base` (NULL: the sizing pass).
static float *add_param(Model *model, float *base, const char *name, int rows, int cols, int split,
                        int init_kind, float init_bound) {
    int tp = model->pgm->tp_size, r = model->pgm->tp_rank;
    if (model->num_tensors == MAX_PARAMS) FAIL("raise MAX_PARAMS in model.h", "too many tensors");
    ParamInfo *p = &model->table[model->num_tensors++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->global_rows = rows;
    p->global_cols = cols;
    p->rows = split == SPLIT_ROWS ? rows / tp : rows;
    p->cols = split == SPLIT_COLS ? cols / tp : cols;
    p->row0 = split == SPLIT_ROWS ? r * p->rows : 0;
    p->col0 = split == SPLIT_COLS ? r * p->cols : 0;
    p->offset = model->num_params;
    p->init_kind = init_kind;
    p->init_bound = init_bound;
    p->replicated_tp = split == NOT_SPLIT;
    model->num_params += (size_t)p->rows * p->cols;
    return base ? base + p->offset : NULL;
}

// The first stage holds the embedding, the last the final norm and the head (the embedding again
// when tied). Linear layers start uniform(+-1/sqrt(fan_in)) of the whole tensor, as picotron.
static void layout_params(Model *model, float *base) {
    const Config *c = &model->cfg;
    int C = c->hidden_size, D = model->D, I = c->intermediate_size, V = c->vocab_size;
    int HD = c->num_attention_heads * D, KVD = c->num_key_value_heads * D;
    float lin_c = 1.0f / sqrtf(C), lin_hd = 1.0f / sqrtf(HD), lin_i = 1.0f / sqrtf(I);
    char n[96];
    model->num_tensors = 0;
    model->num_params = 0;
    if (model->first_stage || (model->last_stage && c->tie_word_embeddings))
        model->embed =
            add_param(model, base, "model.embed_tokens.weight", V, C, SPLIT_ROWS, NORMAL, 1.0f);
    for (int l = 0; l < model->L; l++) {
        LayerWeights *w = &model->layers[l];
#define NAME(suffix) (snprintf(n, sizeof n, "model.layers.%d.%s", model->layer0 + l, suffix), n)
        w->input_layernorm =
            add_param(model, base, NAME("input_layernorm.weight"), 1, C, NOT_SPLIT, CONSTANT, 1);
        w->q_proj = add_param(model, base, NAME("self_attn.q_proj.weight"), HD, C, SPLIT_ROWS,
                              UNIFORM, lin_c);
        w->k_proj = add_param(model, base, NAME("self_attn.k_proj.weight"), KVD, C, SPLIT_ROWS,
                              UNIFORM, lin_c);
        w->v_proj = add_param(model, base, NAME("self_attn.v_proj.weight"), KVD, C, SPLIT_ROWS,
                              UNIFORM, lin_c);
        w->o_proj = add_param(model, base, NAME("self_attn.o_proj.weight"), C, HD, SPLIT_COLS,
                              UNIFORM, lin_hd);
        w->post_attention_layernorm = add_param(
            model, base, NAME("post_attention_layernorm.weight"), 1, C, NOT_SPLIT, CONSTANT, 1);
        w->gate_proj =
            add_param(model, base, NAME("mlp.gate_proj.weight"), I, C, SPLIT_ROWS, UNIFORM, lin_c);
        w->up_proj =
            add_param(model, base, NAME("mlp.up_proj.weight"), I, C, SPLIT_ROWS, UNIFORM, lin_c);
        w->down_proj =
            add_param(model, base, NAME("mlp.down_proj.weight"), C, I, SPLIT_COLS, UNIFORM, lin_i);
#undef NAME
    }
    if (!model->last_stage) return;
    model->norm = add_param(model, base, "model.norm.weight", 1, C, NOT_SPLIT, CONSTANT, 1);
    model->lm_head = c->tie_word_embeddings ? model->embed
                                            : add_param(model, base, "lm_head.weight", V, C,
                                                        SPLIT_ROWS, UNIFORM, lin_c);
}

// the same tensor in the gradient buffer
static float *grad_of(const Model *model, const float *param) {
    return param ? model->grads + (param - model->params) : NULL;
}

void model_init(Model *model, const Config *cfg, ProcessGroupManager *pgm, int num_slots) {
    memset(model, 0, sizeof *model);
    model->cfg = *cfg;
    model->pgm = pgm;
    int tp = pgm->tp_size;
    model->B = cfg->micro_batch_size;
    model->T = cfg->seq_length / pgm->cp_size;
    model->C = cfg->hidden_size;
    model->D = cfg->hidden_size / cfg->num_attention_heads;
    model->H = cfg->num_attention_heads / tp;
    model->KV = cfg->num_key_value_heads / tp;
    model->I = cfg->intermediate_size / tp;
    model->V = cfg->vocab_size / tp;
    model->vocab_start = pgm->tp_rank * model->V;
    distribute_layers(&model->layer0, &model->L, cfg->num_hidden_layers, pgm->pp_size,
                      pgm->pp_rank);
    model->first_stage = pgm->pp_is_first;
    model->last_stage = pgm->pp_is_last;
    model->layers = xmalloc((model->L ? model->L : 1) * sizeof(LayerWeights));

    // one sizing pass, then the flat buffers, then the pointers into them
    layout_params(model, NULL);
    size_t bytes = model->num_params * sizeof(float);
    model->params = device_malloc(bytes);
    model->grads = device_malloc(bytes);
    model->m = device_malloc(bytes);
    model->v = device_malloc(bytes);
    layout_params(model, model->params);
    for (int i = 0; i < model->num_tensors; i++) {
        const ParamInfo *p = &model->table[i];
        init_tensor(model->params + p->offset, (uint64_t)cfg->seed, hash_string(p->name),
                    p->init_kind, p->init_bound, p->rows, p->cols, p->row0, p->col0,
                    p->global_cols);
    }

    ring_attention_init(&model->ring, &pgm->cp, model->B, cfg->seq_length, model->H, model->KV,
                        model->D, cfg->cp_zigzag);
    model_rope_tables(model, model->ring.positions_host + pgm->cp_rank * model->T);
    model_alloc_buffers(model, num_slots);
}

const ParamInfo *model_find_param(const Model *model, const char *name) {
    for (int i = 0; i < model->num_tensors; i++)
        if (strcmp(model->table[i].name, name) == 0) return &model->table[i];
    return NULL;
}

// layer l's part of a slot
typedef struct {
    float *x, *ln1, *rstd1, *q, *k, *v, *att, *lse, *mid, *ln2, *rstd2, *gate, *up, *act, *out;
} LayerActivations;

static LayerActivations layer_slice(const Model *model, const Activations *a, int l) {
    size_t N = (size_t)model->B * model->T, C = model->C, HD = model->H * model->D;
    size_t KVD = model->KV * model->D, I = model->I;
    float *kv = a->kv + l * 2 * N * KVD;
    // one line per sublayer reads better than one per field
    // clang-format off
    return (LayerActivations){
        .x = a->resid + l * N * C, .ln1 = a->ln1 + l * N * C, .rstd1 = a->rstd1 + l * N,
        .q = a->q + l * N * HD, .k = kv, .v = kv + N * KVD, .att = a->att + l * N * HD,
        .lse = a->lse + l * N * model->H, .mid = a->resid_mid + l * N * C,
        .ln2 = a->ln2 + l * N * C, .rstd2 = a->rstd2 + l * N, .gate = a->gate + l * N * I,
        .up = a->up + l * N * I, .act = a->act + l * N * I, .out = a->resid + (l + 1) * N * C};
    // clang-format on
}

static void layer_forward(Model *model, const LayerWeights *w, LayerActivations *s) {
    int B = model->B, T = model->T, N = B * T, C = model->C, H = model->H, KV = model->KV;
    int D = model->D, I = model->I;
    Group *tp = &model->pgm->tp;
    rmsnorm_forward(s->ln1, s->rstd1, s->x, w->input_layernorm, N, C, model->cfg.rms_norm_eps);
    column_parallel_linear_forward(s->q, s->ln1, w->q_proj, N, C, H * D);
    column_parallel_linear_forward(s->k, s->ln1, w->k_proj, N, C, KV * D);
    column_parallel_linear_forward(s->v, s->ln1, w->v_proj, N, C, KV * D);
    rope_forward(s->q, model->rope_cos, model->rope_sin, B, T, H, D);
    rope_forward(s->k, model->rope_cos, model->rope_sin, B, T, KV, D);
    ring_attention_forward(s->att, s->lse, s->q, s->k, &model->ring);
    row_parallel_linear_forward(s->mid, s->att, w->o_proj, N, H * D, C, tp);
    add_inplace(s->mid, s->x, (size_t)N * C);
    rmsnorm_forward(s->ln2, s->rstd2, s->mid, w->post_attention_layernorm, N, C,
                    model->cfg.rms_norm_eps);
    column_parallel_linear_forward(s->gate, s->ln2, w->gate_proj, N, C, I);
    column_parallel_linear_forward(s->up, s->ln2, w->up_proj, N, C, I);
    swiglu_forward(s->act, s->gate, s->up, (size_t)N * I);
    row_parallel_linear_forward(s->out, s->act, w->down_proj, N, I, C, tp);
    add_inplace(s->out, s->mid, (size_t)N * C);
}

// model->dresid holds d(out) on entry and d(x) on return: the residual stream's gradient passes
// straight through each residual add, and each branch adds its share to it.
static void layer_backward(Model *model, const LayerWeights *w, const LayerWeights *dw,
                           const LayerActivations *s) {
    int B = model->B, T = model->T, N = B * T, C = model->C, H = model->H, KV = model->KV;
    int D = model->D, I = model->I, async = model->cfg.tp_async;
    Group *tp = &model->pgm->tp;
    size_t NC = (size_t)N * C, NKVD = (size_t)N * KV * D;
    // forward: out = mid + down_proj(act)
    device_zero(model->dact, (size_t)N * I * sizeof(float));
    row_parallel_linear_backward(model->dact, dw->down_proj, model->dresid, s->act, w->down_proj, N,
                                 I, C);
    // forward: act = silu(gate) * up
    device_zero(model->dgate, (size_t)N * I * sizeof(float));
    device_zero(model->dup, (size_t)N * I * sizeof(float));
    swiglu_backward(model->dgate, model->dup, model->dact, s->gate, s->up, (size_t)N * I);
    // forward: gate = ln2 @ gate_proj^T, up = ln2 @ up_proj^T
    ColumnParallelGrad mlp_in[2] = {{dw->gate_proj, w->gate_proj, model->dgate, I},
                                    {dw->up_proj, w->up_proj, model->dup, I}};
    device_zero(model->dln, NC * sizeof(float));
    column_parallel_linear_backward(model->dln, mlp_in, 2, s->ln2, N, C, tp, async);
    // forward: ln2 = rmsnorm(mid)
    rmsnorm_backward(model->dresid, dw->post_attention_layernorm, model->dln, s->mid,
                     w->post_attention_layernorm, s->rstd2, N, C);
    // forward: mid = x + o_proj(att)
    device_zero(model->datt, (size_t)N * H * D * sizeof(float));
    row_parallel_linear_backward(model->datt, dw->o_proj, model->dresid, s->att, w->o_proj, N,
                                 H * D, C);
    // forward: att = ring_attention(q, k, v)
    device_zero(model->dq, (size_t)N * H * D * sizeof(float));
    device_zero(model->dkv, 2 * NKVD * sizeof(float));
    ring_attention_backward(model->dq, model->dkv, model->datt, s->q, s->k, s->att, s->lse,
                            &model->ring);
    // forward: q, k = rope(q), rope(k)
    rope_backward(model->dq, model->rope_cos, model->rope_sin, B, T, H, D);
    rope_backward(model->dkv, model->rope_cos, model->rope_sin, B, T, KV, D);
    // forward: q, k, v = ln1 @ q_proj^T, ln1 @ k_proj^T, ln1 @ v_proj^T
    ColumnParallelGrad attn_in[3] = {{dw->q_proj, w->q_proj, model->dq, H * D},
                                     {dw->k_proj, w->k_proj, model->dkv, KV * D},
                                     {dw->v_proj, w->v_proj, model->dkv + NKVD, KV * D}};
    device_zero(model->dln, NC * sizeof(float));
    column_parallel_linear_backward(model->dln, attn_in, 3, s->ln1, N, C, tp, async);
    // forward: ln1 = rmsnorm(x)
    rmsnorm_backward(model->dresid, dw->input_layernorm, model->dln, s->x, w->input_layernorm,
                     s->rstd1, N, C);
}

static LayerWeights layer_grads(const Model *model, const LayerWeights *w) {
    return (LayerWeights){
        grad_of(model, w->input_layernorm), grad_of(model, w->q_proj),
        grad_of(model, w->k_proj),          grad_of(model, w->v_proj),
        grad_of(model, w->o_proj),          grad_of(model, w->post_attention_layernorm),
        grad_of(model, w->gate_proj),       grad_of(model, w->up_proj),
        grad_of(model, w->down_proj)};
}

float model_forward(Model *model, int slot, float loss_scale) {
    Activations *a = &model->slots[slot];
    int N = model->B * model->T, C = model->C, V = model->V;
    Group *tp = &model->pgm->tp;
    if (++model->slots_in_use > model->peak_slots_in_use)
        model->peak_slots_in_use = model->slots_in_use;
    if (model->first_stage)
        vocab_parallel_embedding_forward(a->resid, a->tokens, model->embed, N, C,
                                         model->vocab_start, V, tp);
    for (int l = 0; l < model->L; l++) {
        LayerActivations s = layer_slice(model, a, l);
        layer_forward(model, &model->layers[l], &s);
    }
    if (!model->last_stage) return 0.0f;
    rmsnorm_forward(a->lnf, a->rstdf, model_stage_output(model, slot), model->norm, N, C,
                    model->cfg.rms_norm_eps);
    column_parallel_linear_forward(model->logits, a->lnf, model->lm_head, N, C, V);
    // the loss's gradient is known now, so a slot keeps dlogits instead of the logits
    device_zero(a->dlogits, (size_t)N * V * sizeof(float));
    a->loss = vocab_parallel_cross_entropy(a->dlogits, model->logits, a->targets, loss_scale, N, V,
                                           model->vocab_start, &model->loss_buffers, tp);
    return a->loss;
}

// tells data parallelism that the gradients of params [first, end) are final for this step
static void grads_ready(Model *model, const float *first, const float *end) {
    if (model->on_grads_ready)
        model->on_grads_ready(model->hook_ctx, first - model->params, end - first);
}

void model_backward(Model *model, int slot) {
    Activations *a = &model->slots[slot];
    int N = model->B * model->T, C = model->C, V = model->V;
    Group *tp = &model->pgm->tp;
    size_t NC = (size_t)N * C;
    int tied = model->cfg.tie_word_embeddings;
    if (model->last_stage) {
        device_zero(model->dresid, NC * sizeof(float));
        // forward: logits = lnf @ lm_head^T (column-parallel over the vocabulary)
        ColumnParallelGrad head = {grad_of(model, model->lm_head), model->lm_head, a->dlogits, V};
        device_zero(model->dln, NC * sizeof(float));
        column_parallel_linear_backward(model->dln, &head, 1, a->lnf, N, C, tp,
                                        model->cfg.tp_async);
        // forward: lnf = rmsnorm(resid[L])
        rmsnorm_backward(model->dresid, grad_of(model, model->norm), model->dln,
                         model_stage_output(model, slot), model->norm, a->rstdf, N, C);
        // the final norm and an untied head are the last tensors of layout_params
        grads_ready(model, model->norm, model->params + model->num_params);
        if (tied && !model->first_stage)
            grads_ready(model, model->embed, model->embed + (size_t)V * C);
    }
    for (int l = model->L - 1; l >= 0; l--) {
        const LayerWeights *w = &model->layers[l];
        LayerWeights dw = layer_grads(model, w);
        LayerActivations s = layer_slice(model, a, l);
        layer_backward(model, w, &dw, &s);
        grads_ready(model, w->input_layernorm, w->down_proj + (size_t)C * model->I);
    }
    if (model->first_stage) {
        // forward: resid[0] = embedding(tokens)
        vocab_parallel_embedding_backward(grad_of(model, model->embed), model->dresid, a->tokens, N,
                                          C, model->vocab_start, V);
        grads_ready(model, model->embed, model->embed + (size_t)V * C);
    }
    model->slots_in_use--;
}
