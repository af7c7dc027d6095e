// Pipeline parallelism, as picotron's pipeline_parallel.py.
//
// The layers are split into pp stages (the first L mod pp stages take one more); the first stage
// also embeds the tokens, the last holds the final norm, the head and the loss. Micro-batches
// flow through: each stage receives activations [mbs, seq/cp, hidden] from the stage before,
// runs its layers and sends the result on; the backward sends gradients of the same shape back.
// Two schedules:
//   AFAB (all forward, all backward; GPipe, Huang et al. 2019): every micro-batch's activations
//     are kept until the backward starts, so a stage holds grad_acc slots.
//   1F1B (PipeDream-Flush, Narayanan et al. 2021): after pp - stage - 1 warm-up forwards, each
//     forward is followed by one backward, so a stage holds at most pp - stage slots.
// Every micro-batch's loss is scaled by 1/grad_acc (picotron forgets it here), so the gradients
// equal the ones without a pipeline. Data-parallel buckets sync during each stage's own last
// backward of the step: on the last stage, which has no warm-up, that is inside the steady loop.
#include "pipeline_parallel.h"
#include <string.h>
#include "backend/backend.h"
#include "utils.h"

void distribute_layers(int *layer0, int *count, int num_layers, int pp, int stage) {
    int base = num_layers / pp, extra = num_layers % pp;
    *count = base + (stage < extra);
    *layer0 = stage * base + (stage < extra ? stage : extra);
}

int pipeline_num_slots(const Config *cfg, int stage) {
    int grad_acc = cfg->gradient_accumulation_steps;
    if (cfg->pp_size == 1) return 1;
    if (strcmp(cfg->pp_engine, "afab") == 0) return grad_acc;
    int in_flight = cfg->pp_size - stage;
    return in_flight < grad_acc ? in_flight : grad_acc;
}

static size_t activation_size(const Model *model) {
    return (size_t)model->B * model->T * model->C;
}

// picotron's pipeline_communicate: the four directions and the two combined exchanges
static void recv_forward(Model *model, int slot) {
    if (!model->first_stage)
        recv(model_stage_input(model, slot), activation_size(model), model->pgm->pp_prev,
             &model->pgm->pp);
}

static void send_forward(Model *model, int slot) {
    if (!model->last_stage)
        send(model_stage_output(model, slot), activation_size(model), model->pgm->pp_next,
             &model->pgm->pp);
}

static void recv_backward(Model *model) {
    if (!model->last_stage)
        recv(model->dresid, activation_size(model), model->pgm->pp_next, &model->pgm->pp);
}

static void send_backward(Model *model) {
    if (!model->first_stage)
        send(model->dresid, activation_size(model), model->pgm->pp_prev, &model->pgm->pp);
}

// the last stage has no next stage: nothing to send, and its backward starts from the loss
static void send_forward_recv_backward(Model *model, int slot) {
    if (!model->last_stage)
        send_recv(model_stage_output(model, slot), model->pgm->pp_next, model->dresid,
                  model->pgm->pp_next, activation_size(model), &model->pgm->pp);
}

static void send_backward_recv_forward(Model *model, int slot) {
    if (!model->first_stage)
        send_recv(model->dresid, model->pgm->pp_prev, model_stage_input(model, slot),
                  model->pgm->pp_prev, activation_size(model), &model->pgm->pp);
}

static float forward_micro_batch(Model *model, const Dataset *ds, int step, int micro) {
    int grad_acc = model->cfg.gradient_accumulation_steps, slot = micro % model->num_slots;
    // only the first stage reads tokens and only the last the targets
    if (model->first_stage || model->last_stage) load_micro_batch(model, slot, ds, step, micro);
    float loss_scale = 1.0f / ((float)model->B * model->T * grad_acc);
    return model_forward(model, slot, loss_scale) / grad_acc;
}

static void backward_micro_batch(Model *model, DataParallel *dp, int micro, int sync) {
    dp->require_backward_grad_sync = sync;
    model_backward(model, micro % model->num_slots);
}

static float train_step_pipeline_afab(Model *model, DataParallel *dp, const Dataset *ds, int step) {
    int grad_acc = model->cfg.gradient_accumulation_steps;
    float loss = 0.0f;
    for (int micro = 0; micro < grad_acc; micro++) {
        recv_forward(model, micro % model->num_slots);
        loss += forward_micro_batch(model, ds, step, micro);
        send_forward(model, micro % model->num_slots);
    }
    for (int micro = 0; micro < grad_acc; micro++) {
        recv_backward(model);
        backward_micro_batch(model, dp, micro, micro == grad_acc - 1);
        send_backward(model);
    }
    return loss;
}

static float train_step_pipeline_1f1b(Model *model, DataParallel *dp, const Dataset *ds, int step) {
    int grad_acc = model->cfg.gradient_accumulation_steps;
    int warmup = model->pgm->pp_size - model->pgm->pp_rank - 1;
    if (warmup > grad_acc) warmup = grad_acc;
    int remaining = grad_acc - warmup;
    float loss = 0.0f;
    for (int micro = 0; micro < warmup; micro++) {
        recv_forward(model, micro % model->num_slots);
        loss += forward_micro_batch(model, ds, step, micro);
        send_forward(model, micro % model->num_slots);
    }
    if (remaining > 0) recv_forward(model, warmup % model->num_slots);
    for (int i = 0; i < remaining; i++) {
        int last = i == remaining - 1, fwd = warmup + i;
        loss += forward_micro_batch(model, ds, step, fwd);
        send_forward_recv_backward(model, fwd % model->num_slots);
        // a stage without warm-up (the last) makes its final backward here
        backward_micro_batch(model, dp, i, warmup == 0 && last);
        if (last)
            send_backward(model);
        else
            send_backward_recv_forward(model, (fwd + 1) % model->num_slots);
    }
    for (int i = 0; i < warmup; i++) {
        recv_backward(model);
        backward_micro_batch(model, dp, remaining + i, i == warmup - 1);
        send_backward(model);
    }
    return loss;
}

float pipeline_train_step(Model *model, DataParallel *dp, const Dataset *ds, int step) {
    if (strcmp(model->cfg.pp_engine, "afab") == 0)
        return train_step_pipeline_afab(model, dp, ds, step);
    return train_step_pipeline_1f1b(model, dp, ds, step);
}

void pipeline_sync_tied_embeddings(Model *model) {
    if (model->pgm->pp_size == 1 || !model->cfg.tie_word_embeddings) return;
    if (!model->first_stage && !model->last_stage) return;
    size_t offset = model->embed - model->params;
    all_reduce(model->grads + offset, (size_t)model->V * model->C, REDUCE_SUM, &model->pgm->embed);
}
