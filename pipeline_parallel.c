// Pipeline parallelism, as picotron's pipeline_parallel.py.
//
// The layers are split into pp stages (pipeline_stage: the first L mod pp stages take one more);
// the first stage also embeds the tokens, the last holds the final norm, the head and the loss.
// Micro-batches flow through: each stage receives activations [mbs, seq/cp, hidden] from the
// stage before, runs its layers and sends the result on; the backward receives the gradient of
// its output (output_tensor_grad), runs model_backward and sends the gradient of its input
// (input_tensor_grad) back, as picotron's pipeline_communicate does.
// Two schedules (and a third beyond picotron, in pipeline_interleaved.c):
//   AFAB (all forward, all backward; GPipe, Huang et al. 2019): every micro-batch's activations
//     are kept until the backward starts, so a stage holds grad_acc slots.
//   1F1B (PipeDream-Flush, Narayanan et al. 2021): after pp - stage - 1 warm-up forwards, each
//     forward is followed by one backward, so a stage holds at most pp - stage slots.
// Every micro-batch's loss is scaled by 1/grad_acc (picotron forgets it here), so the gradients
// equal the ones without a pipeline. Data-parallel buckets sync during the backward of the last
// micro-batch.
#include "pipeline_parallel.h"
#include <string.h>
#include "backend/backend.h"
#include "trace.h"
#include "utils.h"

PipelineStage pipeline_stage(const Config *cfg, const ProcessGroupManager *pgm) {
    int pp = pgm->pp_size, stage = pgm->pp_rank;
    int L = cfg->num_hidden_layers, base = L / pp, extra = L % pp;
    return (PipelineStage){.layer0 = stage * base + (stage < extra ? stage : extra),
                           .num_layers = base + (stage < extra),
                           .has_embedding = pgm->pp_is_first,
                           .has_head = pgm->pp_is_last,
                           .num_chunks = 1};
}

// AFAB keeps every micro-batch until the backward; 1F1B at most pp - stage at once (its warm-up
// forwards and one more)
int pipeline_num_slots(const Config *cfg, int stage) {
    int pp = cfg->pp_size, grad_acc = cfg->gradient_accumulation_steps;
    if (pp == 1) return 1;
    if (strcmp(cfg->pp_engine, "afab") == 0) return grad_acc;
    return pp - stage < grad_acc ? pp - stage : grad_acc;
}

void pipeline_parallel_init(PipelineParallel *pipe, Model *model, DataParallel *dp,
                            MicroBatchDataLoader *loader, ProcessGroupManager *pgm) {
    *pipe = (PipelineParallel){.model = model, .dp = dp, .loader = loader, .pgm = pgm};
    if (pgm->pp_size == 1) return; // one stage: nothing travels, train.c's train_step runs it
    size_t bytes = (size_t)model->Ns * model->C * sizeof(float);
    pipe->input_tensor_grad = device_malloc(bytes);
    pipe->output_tensor_grad = device_malloc(bytes);
    pipe->buffer_bytes = 2 * bytes;
}

void pipeline_parallel_free(PipelineParallel *pipe) {
    if (pipe->input_tensor_grad) device_free(pipe->input_tensor_grad);
    if (pipe->output_tensor_grad) device_free(pipe->output_tensor_grad);
}

static size_t activation_size(const PipelineParallel *pipe) {
    return (size_t)pipe->model->Ns * pipe->model->C; // (Ns, C): a stage input or output
}

// picotron's pipeline_communicate: the four directions and the two combined exchanges. The first
// stage has no previous stage and the last no next one: there they do nothing.
static void recv_forward(PipelineParallel *pipe, int slot) {
    if (!pipe->pgm->pp_is_first)
        recv(model_stage_input(pipe->model, slot), activation_size(pipe), pipe->pgm->pp_prev,
             &pipe->pgm->pp);
}

static void send_forward(PipelineParallel *pipe, int slot) {
    if (!pipe->pgm->pp_is_last)
        send(model_stage_output(pipe->model, slot), activation_size(pipe), pipe->pgm->pp_next,
             &pipe->pgm->pp);
}

static void recv_backward(PipelineParallel *pipe) {
    if (!pipe->pgm->pp_is_last)
        recv(pipe->output_tensor_grad, activation_size(pipe), pipe->pgm->pp_next, &pipe->pgm->pp);
}

static void send_backward(PipelineParallel *pipe) {
    if (!pipe->pgm->pp_is_first)
        send(pipe->input_tensor_grad, activation_size(pipe), pipe->pgm->pp_prev, &pipe->pgm->pp);
}

static void send_forward_recv_backward(PipelineParallel *pipe, int slot) {
    if (!pipe->pgm->pp_is_last)
        send_recv(model_stage_output(pipe->model, slot), pipe->pgm->pp_next,
                  pipe->output_tensor_grad, pipe->pgm->pp_next, activation_size(pipe),
                  &pipe->pgm->pp);
}

static void send_backward_recv_forward(PipelineParallel *pipe, int slot) {
    if (!pipe->pgm->pp_is_first)
        send_recv(pipe->input_tensor_grad, pipe->pgm->pp_prev, model_stage_input(pipe->model, slot),
                  pipe->pgm->pp_prev, activation_size(pipe), &pipe->pgm->pp);
}

// the first stage reads the tokens and the last the targets
static float forward_micro_batch(PipelineParallel *pipe, int step, int micro) {
    Model *model = pipe->model;
    int grad_acc = model->cfg.gradient_accumulation_steps, slot = micro % model->num_slots;
    double start = trace_begin();
    if (model->stage.has_embedding || model->stage.has_head) {
        load_micro_batch(pipe->loader, step, micro);
        model_set_batch(model, slot, pipe->loader->input_ids, pipe->loader->target_ids);
    }
    float loss_scale = 1.0f / ((float)model->B * model->T * grad_acc);
    float loss = model_forward(model, slot, loss_scale) / grad_acc;
    trace_end(EV_FORWARD, micro, -1, start);
    return loss;
}

// the first stage's input is the tokens: no gradient to send back. The last micro-batch's
// backward is the last of the step: its gradients are final.
static void backward_micro_batch(PipelineParallel *pipe, int micro) {
    Model *model = pipe->model;
    double start = trace_begin();
    pipe->dp->require_backward_grad_sync = micro == model->cfg.gradient_accumulation_steps - 1;
    model_backward(model, model->stage.has_embedding ? NULL : pipe->input_tensor_grad,
                   pipe->output_tensor_grad, micro % model->num_slots);
    trace_end(EV_BACKWARD, micro, -1, start);
}

static float train_step_pipeline_afab(PipelineParallel *pipe, int step) {
    int grad_acc = pipe->model->cfg.gradient_accumulation_steps, slots = pipe->model->num_slots;
    float loss = 0.0f;
    for (int micro = 0; micro < grad_acc; micro++) {
        recv_forward(pipe, micro % slots);
        loss += forward_micro_batch(pipe, step, micro);
        send_forward(pipe, micro % slots);
    }
    for (int micro = 0; micro < grad_acc; micro++) {
        recv_backward(pipe);
        backward_micro_batch(pipe, micro);
        send_backward(pipe);
    }
    return loss;
}

static float train_step_pipeline_1f1b(PipelineParallel *pipe, int step) {
    int grad_acc = pipe->model->cfg.gradient_accumulation_steps, slots = pipe->model->num_slots;
    int warmup = pipe->pgm->pp_size - pipe->pgm->pp_rank - 1; // forwards before the first backward
    if (warmup > grad_acc) warmup = grad_acc;
    int remaining = grad_acc - warmup;
    float loss = 0.0f;
    for (int micro = 0; micro < warmup; micro++) {
        recv_forward(pipe, micro % slots);
        loss += forward_micro_batch(pipe, step, micro);
        send_forward(pipe, micro % slots);
    }
    if (remaining > 0) recv_forward(pipe, warmup % slots);
    for (int i = 0; i < remaining; i++) {
        int last = i == remaining - 1, fwd = warmup + i;
        loss += forward_micro_batch(pipe, step, fwd);
        send_forward_recv_backward(pipe, fwd % slots);
        backward_micro_batch(pipe, i);
        if (last)
            send_backward(pipe);
        else
            send_backward_recv_forward(pipe, (fwd + 1) % slots);
    }
    for (int i = 0; i < warmup; i++) {
        recv_backward(pipe);
        backward_micro_batch(pipe, remaining + i);
        send_backward(pipe);
    }
    return loss;
}

float pipeline_train_step(PipelineParallel *pipe, int step) {
    if (strcmp(pipe->model->cfg.pp_engine, "afab") == 0)
        return train_step_pipeline_afab(pipe, step);
    return train_step_pipeline_1f1b(pipe, step);
}

void pipeline_sync_tied_embeddings(Model *model) {
    if (model->pgm->pp_size == 1 || !model->cfg.tie_word_embeddings) return;
    if (!model->stage.has_embedding && !model->stage.has_head) return;
    all_reduce(model->dw.embed_tokens, (size_t)model->V * model->C, REDUCE_SUM, &model->pgm->embed);
}
