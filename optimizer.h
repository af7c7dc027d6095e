// AdamW over this rank's flat buffers, the learning-rate schedule and gradient clipping.
#pragma once
#include "model.h"

// picotron's constant lr, or a linear warmup then cosine decay to min_lr; step counts from 1
float learning_rate_at(const Config *cfg, int step);
// When cfg->grad_clip > 0: the global L2 norm of the gradient of the whole model (each parameter
// counted once, whatever the layout), returned; above grad_clip the gradients are scaled to it.
// Returns 0 when clipping is off.
float clip_grad_norm(Model *model);
void optimizer_step(Model *model, float lr, int step);
