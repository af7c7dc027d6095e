// The Llama model of one rank: the parameter table over flat buffers, and the forward and
// backward of this rank's pipeline stage. It consumes the layout the parallel files decided (the
// ModelShard): which block of each tensor (tensor_parallel.c), which layers (pipeline_parallel.c),
// which positions (context_parallel.c).
// Device memory is only ever passed to backend kernels and collectives, never touched here.
#include "model.h"
#include <math.h>
#include <string.h>
#include "backend/backend.h"
#include "trace.h"
#include "utils.h"

// The tensors of this stage in one table, named and sized as Hugging Face's full model has them.
// The first stage holds the embedding, the last the final norm and the head (the embedding again
// when tied). A layer's tensors are contiguous: data parallelism's buckets rely on it.
void model_layout_params(Model *model, ModelWeights *w, float *base) {
    const Config *c = &model->cfg;
    // the full model's sizes, by their config names (not the letters of this rank's shares)
    int hidden = c->hidden_size, vocab = c->vocab_size, features = c->intermediate_size;
    int q_features = c->num_attention_heads * model->D,
        kv_features = c->num_key_value_heads * model->D;
    char n[96];
    model->num_tensors = 0;
    model->num_params = 0;
    if (config_is_mamba(c)) { // model_mamba.c: a Mamba's tensors instead
        mamba_layout_params(model, w, base);
        return;
    }
    if (model->stage.has_embedding || (model->stage.has_head && c->tie_word_embeddings))
        w->embed_tokens = model_add_param(model, base, "model.embed_tokens.weight", vocab, hidden,
                                          VOCAB_PARALLEL, NORMAL);
    for (int l = 0; l < model->L; l++) {
        AttentionWeights *a = &w->layers[l].self_attn;
        MlpWeights *m = &w->layers[l].mlp;
#define NAME(suffix)                                                                               \
    (snprintf(n, sizeof n, "model.layers.%d.%s", stage_global_layer(&model->stage, l), suffix), n)
        a->input_layernorm = model_add_param(model, base, NAME("input_layernorm.weight"), 1, hidden,
                                             REPLICATED, CONSTANT);
        a->q_proj = model_add_param(model, base, NAME("self_attn.q_proj.weight"), q_features,
                                    hidden, COLUMN_PARALLEL, UNIFORM);
        a->k_proj = model_add_param(model, base, NAME("self_attn.k_proj.weight"), kv_features,
                                    hidden, COLUMN_PARALLEL, UNIFORM);
        a->v_proj = model_add_param(model, base, NAME("self_attn.v_proj.weight"), kv_features,
                                    hidden, COLUMN_PARALLEL, UNIFORM);
        a->o_proj = model_add_param(model, base, NAME("self_attn.o_proj.weight"), hidden,
                                    q_features, ROW_PARALLEL, UNIFORM);
        m->post_attention_layernorm = model_add_param(
            model, base, NAME("post_attention_layernorm.weight"), 1, hidden, REPLICATED, CONSTANT);
        if (c->num_experts > 0) { // a mixture of experts instead of the one MLP
            moe_layout_params(model, m, base, stage_global_layer(&model->stage, l));
            continue;
        }
        m->gate_proj = model_add_param(model, base, NAME("mlp.gate_proj.weight"), features, hidden,
                                       COLUMN_PARALLEL, UNIFORM);
        m->up_proj = model_add_param(model, base, NAME("mlp.up_proj.weight"), features, hidden,
                                     COLUMN_PARALLEL, UNIFORM);
        m->down_proj = model_add_param(model, base, NAME("mlp.down_proj.weight"), hidden, features,
                                       ROW_PARALLEL, UNIFORM);
#undef NAME
    }
    if (!model->stage.has_head) return;
    w->norm = model_add_param(model, base, "model.norm.weight", 1, hidden, REPLICATED, CONSTANT);
    w->lm_head = c->tie_word_embeddings ? w->embed_tokens
                                        : model_add_param(model, base, "lm_head.weight", vocab,
                                                          hidden, VOCAB_PARALLEL, UNIFORM);
}

// mid = x + o_proj(attention(rope(q, k), v)), q, k, v = projections of ln1 = rmsnorm(x)
static void attention_forward(Model *model, float *mid, const AttentionActivations *s,
                              const float *x, const AttentionWeights *w) {
    int B = model->B, T = model->T, N = B * T, C = model->C, H = model->H, KV = model->KV;
    int D = model->D, Ns = model->Ns;
    rmsnorm_forward(s->ln1, s->rstd1, x, w->input_layernorm, Ns, C, model->cfg.rms_norm_eps);
    ColumnParallelOut qkv[3] = {
        {s->q, w->q_proj, H * D}, {s->k, w->k_proj, KV * D}, {s->v, w->v_proj, KV * D}};
    column_parallel_linear_forward(&model->tp, qkv, 3, s->ln1, N, C);
    rope_forward(s->q, model->rope_cos, model->rope_sin, B, T, H, D);
    rope_forward(s->k, model->rope_cos, model->rope_sin, B, T, KV, D);
    ring_attention_forward(s->att, s->lse, s->q, s->k, &model->ring);
    row_parallel_linear_forward(&model->tp, mid, s->att, w->o_proj, N, H * D, C);
    add_inplace(mid, x, (size_t)Ns * C);
}

// out = mid + down_proj(silu(gate_proj(ln2)) * up_proj(ln2)), ln2 = rmsnorm(mid)
static void mlp_forward(Model *model, float *out, const MlpActivations *s, const float *mid,
                        const MlpWeights *w) {
    int N = model->B * model->T, C = model->C, I = model->I, Ns = model->Ns;
    rmsnorm_forward(s->ln2, s->rstd2, mid, w->post_attention_layernorm, Ns, C,
                    model->cfg.rms_norm_eps);
    ColumnParallelOut gate_up[2] = {{s->gate, w->gate_proj, I}, {s->up, w->up_proj, I}};
    column_parallel_linear_forward(&model->tp, gate_up, 2, s->ln2, N, C);
    swiglu_forward(s->act, s->gate, s->up, (size_t)N * I);
    row_parallel_linear_forward(&model->tp, out, s->act, w->down_proj, N, I, C);
    add_inplace(out, mid, (size_t)Ns * C);
}

// dresid holds d(out) on entry and d(mid) on return: the residual stream's gradient passes
// straight through the residual add, and the branch adds its share to it. Each linear's backward
// writes its input's gradient (d act, d ln2): nothing is zeroed to be added into.
static void mlp_backward(Model *model, float *dresid, const MlpWeights *dw, const MlpActivations *s,
                         const float *mid, const MlpWeights *w) {
    int N = model->B * model->T, C = model->C, I = model->I;
    const MlpActivations *d = &model->d.mlp;
    // forward: out = mid + down_proj(act)
    row_parallel_linear_backward(&model->tp, d->act, dw->down_proj, dresid, s->act, w->down_proj, N,
                                 I, C);
    // forward: act = silu(gate) * up (dgate and dup written whole)
    swiglu_backward(d->gate, d->up, d->act, s->gate, s->up, (size_t)N * I);
    // forward: gate = ln2 @ gate_proj^T, up = ln2 @ up_proj^T
    ColumnParallelGrad in[2] = {{dw->gate_proj, w->gate_proj, d->gate, I},
                                {dw->up_proj, w->up_proj, d->up, I}};
    const float *dln2 = column_parallel_linear_backward(&model->tp, d->ln2, in, 2, s->ln2, N, C);
    // forward: ln2 = rmsnorm(mid), on this rank's rows
    rmsnorm_backward(dresid, dw->post_attention_layernorm, dln2, mid, w->post_attention_layernorm,
                     s->rstd2, model->Ns, C);
}

// dresid holds d(mid) on entry and d(x) on return, as mlp_backward
static void attention_backward(Model *model, float *dresid, const AttentionWeights *dw,
                               const AttentionActivations *s, const float *x,
                               const AttentionWeights *w) {
    int B = model->B, T = model->T, N = B * T, C = model->C, H = model->H, KV = model->KV;
    int D = model->D;
    size_t NKVD = (size_t)N * KV * D;
    const AttentionActivations *d = &model->d.self_attn;
    // forward: mid = x + o_proj(att)
    row_parallel_linear_backward(&model->tp, d->att, dw->o_proj, dresid, s->att, w->o_proj, N,
                                 H * D, C);
    // forward: att = ring_attention(q, k, v)
    device_zero(d->q, (size_t)N * H * D * sizeof(float));
    device_zero(d->k, 2 * NKVD * sizeof(float)); // dk then dv
    ring_attention_backward(d->q, d->k, d->att, s->q, s->k, s->att, s->lse, &model->ring);
    // forward: q, k = rope(q), rope(k)
    rope_backward(d->q, model->rope_cos, model->rope_sin, B, T, H, D);
    rope_backward(d->k, model->rope_cos, model->rope_sin, B, T, KV, D);
    // forward: q, k, v = ln1 @ q_proj^T, ln1 @ k_proj^T, ln1 @ v_proj^T
    ColumnParallelGrad in[3] = {{dw->q_proj, w->q_proj, d->q, H * D},
                                {dw->k_proj, w->k_proj, d->k, KV * D},
                                {dw->v_proj, w->v_proj, d->v, KV * D}};
    const float *dln1 = column_parallel_linear_backward(&model->tp, d->ln1, in, 3, s->ln1, N, C);
    // forward: ln1 = rmsnorm(x), on this rank's rows
    rmsnorm_backward(dresid, dw->input_layernorm, dln1, x, w->input_layernorm, s->rstd1, model->Ns,
                     C);
}

// Decoder layer l of slot a, from its input resid[l] to out. What it saves goes to a->layers[l]:
// the slot's own tensors, or under recomputation the one layer's worth all slots share.
static void layer_forward(Model *model, float *out, const Activations *a, int l) {
    const LayerWeights *w = &model->w.layers[l];
    LayerActivations *s = &a->layers[l];
    const float *x = model_layer_input(model, a, l);
    if (config_is_mamba(&model->cfg)) { // model_mamba.c: a Mamba block instead
        mamba_layer_forward(model, out, a, l);
        return;
    }
    attention_forward(model, s->mid, &s->self_attn, x, &w->self_attn);
    if (model->cfg.num_experts > 0)
        moe_mlp_forward(model, out, &s->mlp, s->mid, &w->mlp);
    else
        mlp_forward(model, out, &s->mlp, s->mid, &w->mlp);
}

// tells data parallelism that the gradients of part p (model.h's part_start) are final
static void grads_ready(Model *model, int p) {
    size_t first = model->part_start[p + 1], end = model->part_start[p + 2];
    if (model->on_grads_ready) model->on_grads_ready(model->hook_ctx, first, end - first);
}

// before part p's weights are read: ZeRO-3 gathers them, ZeRO-2 and 3 give the backward a
// whole-unit gradient buffer (zero.c)
static void params_needed(Model *model, int p, int backward) {
    if (model->on_params_needed) model->on_params_needed(model->params_ctx, p, backward);
}

float model_chunk_forward(Model *model, int slot, int chunk, float loss_scale) {
    Activations *a = &model->slots[slot];
    int N = model->B * model->T, C = model->C, V = model->V, Ns = model->Ns;
    int per_chunk = model->L / model->stage.num_chunks;
    size_t NsC = (size_t)Ns * C;
    // a micro-batch holds its slot from its chunk 0's forward to its chunk 0's backward
    if (chunk == 0 && ++model->slots_in_use > model->peak_slots_in_use)
        model->peak_slots_in_use = model->slots_in_use;
    if (model->stage.has_embedding && chunk == 0) {
        params_needed(model, -1, 0);
        vocab_parallel_embedding_forward(&model->tp, a->resid, a->tokens, model->w.embed_tokens, N,
                                         C, model->vocab_start, V);
    }
    for (int l = chunk * per_chunk; l < (chunk + 1) * per_chunk; l++) {
        double start = trace_begin();
        params_needed(model, l, 0);
        layer_forward(model, model_layer_input(model, a, l) + NsC, a, l);
        trace_end(EV_LAYER_FORWARD, -1, stage_global_layer(&model->stage, l), start);
    }
    if (!model->stage.has_head || chunk < model->stage.num_chunks - 1) return 0.0f;
    params_needed(model, model->L, 0);
    rmsnorm_forward(a->lnf, a->rstdf, model_chunk_output(model, slot, chunk), model->w.norm, Ns, C,
                    model->cfg.rms_norm_eps);
    ColumnParallelOut head = {model->logits, model->w.lm_head, V};
    column_parallel_linear_forward(&model->tp, &head, 1, a->lnf, N, C);
    // the loss's gradient is known now, so a slot keeps dlogits (written whole) instead of logits
    a->loss =
        vocab_parallel_cross_entropy(a->dlogits, model->logits, a->targets, loss_scale, N, V,
                                     model->vocab_start, &model->loss_buffers, model->tp.group);
    if (model->on_loss) model->on_loss(model, a);
    return a->loss;
}

void model_chunk_backward(Model *model, float *input_grad, const float *output_grad, int slot,
                          int chunk) {
    Activations *a = &model->slots[slot];
    const ModelWeights *w = &model->w, *dw = &model->dw;
    int N = model->B * model->T, C = model->C, V = model->V;
    int per_chunk = model->L / model->stage.num_chunks;
    size_t NsC = (size_t)model->Ns * C;
    // the residual stream's gradient, carried from the chunk output down to its input
    float *dresid = input_grad ? input_grad : model->dresid;
    if (model->stage.has_head && chunk == model->stage.num_chunks - 1) {
        params_needed(model, model->L, 1);
        device_zero(dresid, NsC * sizeof(float));
        // forward: logits = lnf @ lm_head^T (column-parallel over the vocabulary)
        ColumnParallelGrad head = {dw->lm_head, w->lm_head, a->dlogits, V};
        float *dlnf = model->d.self_attn.ln1; // (N, C), free until the last layer's backward
        const float *own =
            column_parallel_linear_backward(&model->tp, dlnf, &head, 1, a->lnf, N, C);
        // forward: lnf = rmsnorm(resid[L]), on this rank's rows
        rmsnorm_backward(dresid, dw->norm, own, model_chunk_output(model, slot, chunk), w->norm,
                         a->rstdf, model->Ns, C);
        grads_ready(model, model->L);
        if (model->cfg.tie_word_embeddings && !model->stage.has_embedding) grads_ready(model, -1);
    } else {
        device_copy(dresid, output_grad, NsC * sizeof(float));
    }
    for (int l = (chunk + 1) * per_chunk - 1; l >= chunk * per_chunk; l--) {
        const LayerWeights *wl = &w->layers[l], *dwl = &dw->layers[l];
        const LayerActivations *s = &a->layers[l];
        double start = trace_begin();
        params_needed(model, l, 1);
        // full recomputation (model_memory.c): the forward kept only resid[l], so run the layer
        // again to refill what its backward reads; its output, already in resid[l+1], is dropped
        if (model->cfg.recompute) layer_forward(model, model->recompute_output, a, l);
        if (config_is_mamba(&model->cfg)) { // model_mamba.c: a Mamba block instead
            mamba_layer_backward(model, dresid, a, l);
        } else {
            if (model->cfg.num_experts > 0)
                moe_mlp_backward(model, dresid, &dwl->mlp, &s->mlp, s->mid, &wl->mlp, l);
            else
                mlp_backward(model, dresid, &dwl->mlp, &s->mlp, s->mid, &wl->mlp);
            attention_backward(model, dresid, &dwl->self_attn, &s->self_attn,
                               model_layer_input(model, a, l), &wl->self_attn);
        }
        trace_end(EV_LAYER_BACKWARD, -1, stage_global_layer(&model->stage, l), start);
        grads_ready(model, l);
    }
    if (model->stage.has_embedding && chunk == 0) {
        params_needed(model, -1, 1);
        // forward: resid[0] = embedding(tokens)
        vocab_parallel_embedding_backward(&model->tp, dw->embed_tokens, dresid, a->tokens, N, C,
                                          model->vocab_start, V);
        grads_ready(model, -1);
    }
    if (chunk == 0) model->slots_in_use--;
}
