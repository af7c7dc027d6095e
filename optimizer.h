// AdamW over this rank's flat buffers, the learning-rate schedule and gradient clipping.
#pragma once
#include "model.h"

// AdamW's state, owned by the optimizer, not the model: sharding it (ZeRO-1) touches only this
// and data parallelism
typedef struct {
    float *m, *v; // (num_params) first and second moments, on the device
    size_t num_params;
    int step; // updates taken so far (a resumed run restores it)
    float beta1, beta2, eps, weight_decay;
} Optimizer;

void optimizer_init(Optimizer *opt, const Config *cfg, size_t num_params);
void optimizer_free(Optimizer *opt);
// one AdamW update of params (num_params) from grads, as torch.optim.AdamW
void optimizer_step(Optimizer *opt, float *params, const float *grads, float lr);

// picotron's constant lr, or a linear warmup then cosine decay to min_lr; step counts from 1
float learning_rate_at(const Config *cfg, int step);
// When cfg->grad_clip > 0: the global L2 norm of the gradient of the whole model (each parameter
// counted once, whatever the layout), returned; above grad_clip the gradients are scaled to it.
// Returns 0 when clipping is off.
float clip_grad_norm(Model *model);
