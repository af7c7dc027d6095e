// A rank's model made and freed: its sizes from the shard, the parameter table (model.c's
// layout), the flat buffers and their first values, the parts ZeRO shards (part_start), and the
// activations (model_memory.c). The decoder layers' code stays in model.c.
#include <stdio.h>
#include <string.h>
#include "backend/backend.h"
#include "model.h"
#include "utils.h"

// part_start (model.h) from the table: each layer begins with its first norm, the head with the
// final norm
static void model_find_parts(Model *model) {
    int L = model->L, mamba = config_is_mamba(&model->cfg);
    size_t *s = model->part_start = xmalloc((L + 3) * sizeof(size_t));
    char name[96];
    for (int l = 0; l < L; l++) {
        snprintf(name, sizeof name,
                 mamba ? "backbone.layers.%d.norm.weight"
                       : "model.layers.%d.input_layernorm.weight",
                 stage_global_layer(&model->stage, l));
        s[l + 1] = model_find_param(model, name)->offset;
    }
    const char *norm = mamba ? "backbone.norm_f.weight" : "model.norm.weight";
    s[L + 1] = model->stage.has_head ? model_find_param(model, norm)->offset : model->num_params;
    s[L + 2] = model->num_params;
}

void model_init_tensor(const Model *model, float *dst, const ParamInfo *p) {
    init_tensor(dst, (uint64_t)model->cfg.seed, hash_string(p->name), p->init_kind, p->init_bound,
                param_rows_in_file(p), p->cols, p->row0, p->col0, p->global_cols);
}

void model_init(Model *model, const Config *cfg, ProcessGroupManager *pgm, const ModelShard *shard,
                int num_slots) {
    memset(model, 0, sizeof *model);
    model->cfg = *cfg, model->pgm = pgm, model->stage = shard->stage;
    model->B = cfg->micro_batch_size;
    model->T = cfg->seq_length / pgm->cp_size;
    model->C = cfg->hidden_size;
    model->D = cfg->hidden_size / cfg->num_attention_heads;
    model->H = shard->tp.H, model->KV = shard->tp.KV, model->I = shard->tp.I;
    model->V = shard->tp.V, model->vocab_start = shard->tp.vocab_start;
    model->L = shard->stage.num_layers;
    model->Ns = shard->stream_rows;
    model->tp = (TensorParallel){.group = &pgm->tp, .async = cfg->tp_async};
    int layers = model->L ? model->L : 1;
    model->w.layers = xmalloc(layers * sizeof(LayerWeights));
    model->dw.layers = xmalloc(layers * sizeof(LayerWeights));

    // one sizing pass, then the flat buffers, then the pointers into them. ZeRO-2 and 3 never
    // hold the whole gradient, ZeRO-3 nor the whole weights: zero.c makes their shards
    model_layout_params(model, &model->w, NULL);
    model_find_parts(model);
    int zero = pgm->cp_dp.size > 1 ? cfg->zero_stage : 0;
    model->params = zero < 3 ? device_malloc(model->num_params * sizeof(float)) : NULL;
    model->grads = zero < 2 ? device_malloc(model->num_params * sizeof(float)) : NULL;
    model_layout_params(model, &model->dw, model->grads);
    model_layout_params(model, &model->w, model->params);
    for (int i = 0; i < model->num_tensors && model->params; i++) {
        const ParamInfo *p = &model->table[i];
        if (p->init_kind > CONSTANT)
            mamba_init_tensor(model, p); // a Mamba's own kinds
        else
            model_init_tensor(model, model->params + p->offset, p);
    }
    model_rope_tables(model, shard->positions);
    if (cfg->num_experts > 0) moe_alloc_buffers(model); // first: the layers' sizes need it
    if (config_is_mamba(cfg)) mamba_alloc_buffers(model);
    model_alloc_buffers(model, num_slots);
}

void model_free(Model *model) {
    if (model->cfg.num_experts > 0) moe_free_buffers(model);
    if (config_is_mamba(&model->cfg)) mamba_free_buffers(model);
    model_free_buffers(model);
    free(model->part_start);
    free(model->table);
    model->table = NULL;
}
