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

// where element x of the flat buffer, in range r whose moments begin at moments, sits in a
// buffer that holds the whole flat buffer or (compact) only the ranges
static size_t place(const Optimizer *opt, int compact, int r, size_t moments, size_t x) {
    return compact ? moments + (x - opt->start[r]) : x;
}

// out[0] += the squares of p's gradient that lie in opt's ranges (all of it without ZeRO)
static void sum_squares_in_ranges(float *out, const Model *model, const ParamInfo *p,
                                  const Optimizer *opt) {
    size_t lo = p->offset, hi = lo + (size_t)p->rows * p->cols, moments = 0;
    for (int r = 0; r < opt->num_ranges; moments += opt->size[r], r++) {
        size_t first = lo > opt->start[r] ? lo : opt->start[r];
        size_t end = hi < opt->start[r] + opt->size[r] ? hi : opt->start[r] + opt->size[r];
        if (first < end)
            sum_squares(out, model->grads + place(opt, opt->grads_compact, r, moments, first),
                        end - first);
    }
}

float clip_grad_norm(Model *model, const Optimizer *opt) {
    ProcessGroupManager *pgm = model->pgm;
    float *sum = model->scalar; // the experts' squares in sum[1], the others' in sum[0]
    device_zero(sum, 2 * sizeof(float));
    for (int i = 0; i < model->num_tensors; i++) {
        const ParamInfo *p = &model->table[i];
        if (model_param_counts_once(model, p))
            sum_squares_in_ranges(sum + p->expert, model, p, opt);
    }
    // Without ZeRO-1 every cp*dp replica holds the same averaged gradients: sum over all, divide
    // them out (an expert has cp*dp/ep replicas). With it the replicas' shards are disjoint: each
    // element is counted once.
    all_reduce(sum, 2, REDUCE_SUM, &pgm->world);
    float total[2];
    device_to_host(total, sum, sizeof total);
    float replicas = opt->sharded ? 1.0f : (float)pgm->cp_size * pgm->dp_size;
    float norm = sqrtf(total[0] / replicas + total[1] * pgm->ep_size / replicas);
    float max_norm = model->cfg.grad_clip;
    size_t moments = 0;
    for (int r = 0; max_norm > 0 && norm > max_norm && r < opt->num_ranges; r++) {
        if (opt->size[r] > 0) // the gradients the optimizer reads
            scale_inplace(model->grads + place(opt, opt->grads_compact, r, moments, opt->start[r]),
                          max_norm / (norm + 1e-6f), opt->size[r]);
        moments += opt->size[r];
    }
    return norm;
}

void first_nonfinite_gradient(char *name, size_t size, Model *model, const Optimizer *opt) {
    int n = 0;
    ParamInfo *full = model_full_table(&model->cfg, &n);
    int first = n;
    for (int i = 0; i < model->num_tensors && first == n; i++) {
        const ParamInfo *p = &model->table[i];
        float squares = 0.0f;
        device_zero(model->scalar, sizeof(float));
        sum_squares_in_ranges(model->scalar, model, p, opt);
        device_to_host(&squares, model->scalar, sizeof(float));
        int j = isfinite(squares) ? -1 : param_table_find(full, n, p->name);
        if (j >= 0) first = j;
    }
    all_reduce_host(&first, 1, MPI_INT, MPI_MIN, &model->pgm->world);
    snprintf(name, size, "%s", first < n ? full[first].name : "none (the loss alone)");
    free(full);
}

int first_nonfinite_param(char *name, size_t size, Model *model, const Optimizer *opt) {
    float squares = 0.0f; // a quick pass: inf or NaN if any element is one (or beyond 1e19)
    device_zero(model->scalar, sizeof(float));
    size_t moments = 0, held = opt->params_compact ? opt->num_params : model->num_params;
    for (int r = 0; r < opt->num_ranges; moments += opt->size[r], r++)
        if (opt->size[r] > 0)
            sum_squares(model->scalar,
                        model->params + place(opt, opt->params_compact, r, moments, opt->start[r]),
                        opt->size[r]);
    device_to_host(&squares, model->scalar, sizeof(float));
    int suspect = !isfinite(squares);
    all_reduce_host(&suspect, 1, MPI_INT, MPI_MAX, &model->pgm->world);
    name[0] = '\0';
    if (!suspect) return 0;
    // then tensor by tensor, element by element on the host: a huge finite weight is not blamed
    int n = 0;
    ParamInfo *full = model_full_table(&model->cfg, &n);
    int first = n;
    float *host = xmalloc(held * sizeof(float));
    device_to_host(host, model->params, held * sizeof(float));
    for (int i = 0; i < model->num_tensors && first == n; i++) {
        const ParamInfo *p = &model->table[i];
        size_t lo = p->offset, hi = lo + (size_t)p->rows * p->cols;
        moments = 0;
        for (int r = 0; r < opt->num_ranges; moments += opt->size[r], r++) {
            size_t at = lo > opt->start[r] ? lo : opt->start[r];
            size_t end = hi < opt->start[r] + opt->size[r] ? hi : opt->start[r] + opt->size[r];
            while (at < end && isfinite(host[place(opt, opt->params_compact, r, moments, at)]))
                at++;
            if (at < end) first = param_table_find(full, n, p->name);
        }
    }
    all_reduce_host(&first, 1, MPI_INT, MPI_MIN, &model->pgm->world);
    if (first < n) snprintf(name, size, "%s", full[first].name);
    free(host);
    free(full);
    return first < n;
}

// moments for the given ranges of the flat buffers, back to back
void optimizer_init_ranges(Optimizer *opt, const Config *cfg, int num_ranges, const size_t *start,
                           const size_t *size) {
    size_t n = 0;
    for (int r = 0; r < num_ranges; r++) n += size[r];
    *opt = (Optimizer){.m = device_malloc(n * sizeof(float)),
                       .v = device_malloc(n * sizeof(float)),
                       .num_params = n,
                       .num_ranges = num_ranges,
                       .start = xmalloc(num_ranges * sizeof(size_t)),
                       .size = xmalloc(num_ranges * sizeof(size_t)),
                       .beta1 = cfg->adam_beta1,
                       .beta2 = cfg->adam_beta2,
                       .eps = cfg->adam_eps,
                       .weight_decay = cfg->weight_decay};
    memcpy(opt->start, start, num_ranges * sizeof(size_t));
    memcpy(opt->size, size, num_ranges * sizeof(size_t));
    opt->sharded = 1;
}

void optimizer_init(Optimizer *opt, const Config *cfg, size_t num_params) {
    size_t start = 0;
    optimizer_init_ranges(opt, cfg, 1, &start, &num_params);
    opt->sharded = 0;
}

void optimizer_free(Optimizer *opt) {
    device_free(opt->m);
    device_free(opt->v);
    free(opt->start);
    free(opt->size);
}

void optimizer_step(Optimizer *opt, float *params, const float *grads, float lr) {
    opt->step++;
    size_t moments = 0; // where this range's moments begin
    for (int r = 0; r < opt->num_ranges; moments += opt->size[r], r++) {
        if (opt->size[r] == 0) continue; // the last bucket's padding can leave a rank nothing
        adamw_update(params + place(opt, opt->params_compact, r, moments, opt->start[r]),
                     grads + place(opt, opt->grads_compact, r, moments, opt->start[r]),
                     opt->m + moments, opt->v + moments, opt->size[r], lr, opt->beta1, opt->beta2,
                     opt->eps, opt->weight_decay, opt->step);
    }
}
