// The whole model's parameter table, every layer of it and no tensor split: what a checkpoint
// holds and the optimizer's state names. model.c's own layout, run once for a grid of one rank.
#include <stdlib.h>
#include "model.h"
#include "utils.h"

// the full model: one stage of every layer, on a grid of one
ParamInfo *model_full_table(const Config *cfg, int *n) {
    ProcessGroupManager one = {.tp = {.rank = 0, .size = 1}};
    Model *whole = xmalloc(sizeof(Model)); // zeroed
    whole->cfg = *cfg, whole->pgm = &one, whole->L = cfg->num_hidden_layers;
    whole->D = cfg->hidden_size / cfg->num_attention_heads;
    whole->stage =
        (PipelineStage){.num_layers = whole->L, .has_embedding = 1, .has_head = 1, .num_chunks = 1};
    whole->w.layers = xmalloc(whole->L * sizeof(LayerWeights));
    model_layout_params(whole, &whole->w, NULL);
    ParamInfo *table = whole->table;
    *n = whole->num_tensors;
    for (int l = 0; l < whole->L; l++) free(whole->w.layers[l].mlp.moe.experts);
    free(whole->w.layers);
    free(whole);
    return table;
}
