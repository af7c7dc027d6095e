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
// The global L2 norm of the gradient of the whole model (each parameter counted once, whatever the
// layout), returned; when cfg->grad_clip > 0 and the norm is above it, the gradients are scaled to
// it. Computed even when clipping is off: a non-finite norm is how a diverged run is caught.
float clip_grad_norm(Model *model);
// The whole-model name of the first tensor (in layout order) whose gradient holds an inf or a NaN,
// the same on every rank; "none (...)" when every gradient is finite
void first_nonfinite_gradient(char *name, size_t size, Model *model);
