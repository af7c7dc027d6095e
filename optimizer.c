// AdamW as torch.optim.AdamW (picotron's optimizer), fp32 moments, on the flat buffers.
#include "optimizer.h"
#include <math.h>
#include <string.h>
#include "backend/backend.h"
#include "utils.h"

float learning_rate_at(const Config *cfg, int step) {
    float lr = cfg->learning_rate;
    if (cfg->warmup_steps > 0 && step <= cfg->warmup_steps) return lr * step / cfg->warmup_steps;
    if (strcmp(cfg->lr_decay, "cosine") != 0) return lr;
    float decay_steps = cfg->total_train_steps - cfg->warmup_steps;
    float progress = decay_steps > 0 ? (step - cfg->warmup_steps) / decay_steps : 1.0f;
    return cfg->min_lr + 0.5f * (lr - cfg->min_lr) * (1.0f + cosf((float)M_PI * progress));
}

float clip_grad_norm(Model *model) {
    ProcessGroupManager *pgm = model->pgm;
    float *sum = model->scalar;
    device_zero(sum, sizeof(float));
    for (int i = 0; i < model->num_tensors; i++) {
        const ParamInfo *p = &model->table[i];
        if (model_param_counts_once(model, p))
            sum_squares(sum, model->grads + p->offset, (size_t)p->rows * p->cols);
    }
    // every cp*dp replica holds the same averaged gradients: sum over all, divide them out
    all_reduce(sum, 1, REDUCE_SUM, &pgm->world);
    float total = 0.0f;
    device_to_host(&total, sum, sizeof(float));
    float norm = sqrtf(total / (pgm->cp_size * pgm->dp_size));
    float max_norm = model->cfg.grad_clip;
    if (max_norm > 0 && norm > max_norm)
        scale_inplace(model->grads, max_norm / (norm + 1e-6f), model->num_params);
    return norm;
}

void first_nonfinite_gradient(char *name, size_t size, Model *model) {
    ParamInfo *full = xmalloc(MAX_PARAMS * sizeof(ParamInfo));
    int n = model_full_table(full, &model->cfg), first = n;
    for (int i = 0; i < model->num_tensors && first == n; i++) {
        const ParamInfo *p = &model->table[i];
        float squares = 0.0f;
        device_zero(model->scalar, sizeof(float));
        sum_squares(model->scalar, model->grads + p->offset, (size_t)p->rows * p->cols);
        device_to_host(&squares, model->scalar, sizeof(float));
        int j = isfinite(squares) ? -1 : param_table_find(full, n, p->name);
        if (j >= 0) first = j;
    }
    all_reduce_host(&first, 1, MPI_INT, MPI_MIN, &model->pgm->world);
    snprintf(name, size, "%s", first < n ? full[first].name : "none (the loss alone)");
    free(full);
}

void optimizer_init(Optimizer *opt, const Config *cfg, size_t num_params) {
    *opt = (Optimizer){.m = device_malloc(num_params * sizeof(float)),
                       .v = device_malloc(num_params * sizeof(float)),
                       .num_params = num_params,
                       .beta1 = cfg->adam_beta1,
                       .beta2 = cfg->adam_beta2,
                       .eps = cfg->adam_eps,
                       .weight_decay = cfg->weight_decay};
}

void optimizer_free(Optimizer *opt) {
    device_free(opt->m);
    device_free(opt->v);
}

void optimizer_step(Optimizer *opt, float *params, const float *grads, float lr) {
    opt->step++;
    adamw_update(params, grads, opt->m, opt->v, opt->num_params, lr, opt->beta1, opt->beta2,
                 opt->eps, opt->weight_decay, opt->step);
}
