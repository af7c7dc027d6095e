// AdamW over this rank's flat buffers, the learning-rate schedule and gradient clipping.
#pragma once
#include "model.h"

// AdamW's state, owned by the optimizer, not the model: ZeRO-1 (zero.c) shards it by giving it
// ranges
typedef struct {
    float *m, *v;      // (num_params) first and second moments of the ranges below, on the device
    size_t num_params; // floats in the ranges: the whole flat buffer, or ZeRO-1's shard of it
    int num_ranges;
    size_t *start, *size; // (num_ranges) the ranges of the flat buffers this rank updates; m and v
                          // hold their moments back to back, in this order
    int sharded;          // 1: the ranges are this rank's shard (ZeRO), not every parameter
    // ZeRO-2 keeps only the shard's gradients, ZeRO-3 its parameters too: those buffers hold the
    // ranges back to back, as m and v do, instead of the whole flat buffer
    int grads_compact, params_compact;
    int step; // updates taken so far (a resumed run restores it)
    float beta1, beta2, eps, weight_decay;
} Optimizer;

// every parameter of the flat buffer (num_params) updated by this rank
void optimizer_init(Optimizer *opt, const Config *cfg, size_t num_params);
// only the given ranges of the flat buffer (ZeRO-1's shard: moments of that size)
void optimizer_init_ranges(Optimizer *opt, const Config *cfg, int num_ranges, const size_t *start,
                           const size_t *size);
void optimizer_free(Optimizer *opt);
// one AdamW update of this rank's ranges of params from grads, as torch.optim.AdamW
void optimizer_step(Optimizer *opt, float *params, const float *grads, float lr);

// picotron's constant lr, or a linear warmup then cosine decay to min_lr; step counts from 1
float learning_rate_at(const Config *cfg, int step);
// The global L2 norm of the gradient of the whole model (each parameter counted once, whatever the
// layout), returned; when cfg->grad_clip > 0 and the norm is above it, the gradients are scaled to
// it. Computed even when clipping is off: a non-finite norm is how a diverged run is caught. With
// ZeRO-1 each rank holds the averaged gradient of its shard only: the shards' squares add up.
float clip_grad_norm(Model *model, const Optimizer *opt);
// The whole-model name of the first tensor (in layout order) whose gradient holds an inf or a NaN,
// the same on every rank; "none (...)" when every gradient is finite (in opt's ranges: ZeRO-1's
// shard is all of the gradient a rank holds)
void first_nonfinite_gradient(char *name, size_t size, Model *model, const Optimizer *opt);
// After an update: the whole-model name of the first tensor whose parameters in opt's ranges hold
// an inf or a NaN, the same on every rank, and 1; else "" and 0. One sum of squares when all are
// finite, the common case.
int first_nonfinite_param(char *name, size_t size, Model *model, const Optimizer *opt);
