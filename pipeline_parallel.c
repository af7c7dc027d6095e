// Pipeline parallelism, as picotron's pipeline_parallel.py.
//
// The layers are split into pp stages (pipeline_stage: the first L mod pp stages take one more);
// the first stage also embeds the tokens, the last holds the final norm, the head and the loss.
// Micro-batches flow through: each stage receives activations [mbs, seq/cp, hidden] from the
// stage before, runs its layers and sends the result on; the backward receives the gradient of
// its output (output_tensor_grad), runs model_backward and sends the gradient of its input
// (input_tensor_grad) back, as picotron's pipeline_communicate does.
// Three schedules:
//   AFAB (all forward, all backward; GPipe, Huang et al. 2019): every micro-batch's activations
//     are kept until the backward starts, so a stage holds grad_acc slots.
//   1F1B (PipeDream-Flush, Narayanan et al. 2021): after pp - stage - 1 warm-up forwards, each
//     forward is followed by one backward, so a stage holds at most pp - stage slots.
//   Interleaved 1F1B (distributed.pp_virtual_stages = V > 1; Narayanan et al. 2021, Megatron-LM's
//     forward_backward_pipelining_with_interleaving): each rank holds V chunks of L/(pp*V) layers,
//     chunk k of rank r being virtual stage k*pp + r, so micro-batches go round the ranks V times
//     (a ring: the last rank's chunk k feeds rank 0's chunk k+1). The pipeline fills in chunks,
//     1/V of a stage each, so the bubble falls to (p-1)/(V*m+p-1) of the step, for V times the
//     messages and more micro-batches in flight.
// Every micro-batch's loss is scaled by 1/grad_acc (picotron forgets it here), so the gradients
// equal the ones without a pipeline. Data-parallel buckets sync during the backward of the last
// micro-batch, which is each chunk's last backward of the step.
#include "pipeline_parallel.h"
#include <string.h>
#include "backend/backend.h"
#include "trace.h"
#include "utils.h"

PipelineStage pipeline_stage(const Config *cfg, const ProcessGroupManager *pgm) {
    int pp = pgm->pp_size, stage = pgm->pp_rank, chunks = cfg->pp_virtual_stages;
    // interleaved, config_validate made pp * chunks divide the layers: extra is 0
    int L = cfg->num_hidden_layers, base = L / (pp * chunks), extra = L % (pp * chunks);
    return (PipelineStage){.layer0 = stage * base + (stage < extra ? stage : extra),
                           .num_layers = (base + (stage < extra)) * chunks,
                           .has_embedding = pgm->pp_is_first,
                           .has_head = pgm->pp_is_last,
                           .num_chunks = chunks,
                           .chunk_stride = pp * base};
}

enum { BACKWARD, FORWARD };
enum { OUTPUT, INPUT };

// Megatron's get_model_chunk_id, and the micro-batch of a rank's i-th forward (or backward): pp
// micro-batches go through chunk 0, the same pp through chunk 1, ..., then the next pp
static int chunk_id(int i, int direction, int pp, int chunks) {
    int k = i / pp % chunks;
    return direction == FORWARD ? k : chunks - 1 - k;
}

static int micro_id(int i, int pp, int chunks) {
    return i / (pp * chunks) * pp + i % pp;
}

// Forwards before the first backward. 1F1B: pp - stage - 1. Interleaved (Megatron's): the first
// backward is micro-batch 0's last chunk, so (V-1)*pp forwards of the chunks before it, then 2 per
// later stage while its forward goes on and its gradient comes back; all when grad_acc == pp.
static int num_warmup(int pp, int stage, int chunks, int grad_acc) {
    int total = grad_acc * chunks;
    int warmup = chunks == 1      ? pp - stage - 1
                 : grad_acc == pp ? total
                                  : (pp - stage - 1) * 2 + (chunks - 1) * pp;
    return warmup < total ? warmup : total;
}

// A micro-batch holds its slot from its chunk 0's forward to its chunk 0's backward, both in
// micro-batch order: those in flight are consecutive, micro % slots never collide, and walking the
// 1F1B order (warm-up forwards, then each forward followed by a backward) finds the most at once.
int pipeline_num_slots(const Config *cfg, int stage) {
    int pp = cfg->pp_size, chunks = cfg->pp_virtual_stages,
        grad_acc = cfg->gradient_accumulation_steps;
    if (pp == 1) return 1;
    if (strcmp(cfg->pp_engine, "afab") == 0) return grad_acc;
    int warmup = num_warmup(pp, stage, chunks, grad_acc), in_flight = 0, most = 0;
    for (int i = 0; i < grad_acc * chunks; i++) {
        if (chunk_id(i, FORWARD, pp, chunks) == 0 && ++in_flight > most) most = in_flight;
        if (i >= warmup && chunk_id(i - warmup, BACKWARD, pp, chunks) == 0) in_flight--;
    }
    return most;
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
        recv(model_stage_input(pipe->model, slot, 0), activation_size(pipe), pipe->pgm->pp_prev,
             &pipe->pgm->pp);
}

static void send_forward(PipelineParallel *pipe, int slot) {
    if (!pipe->pgm->pp_is_last)
        send(model_stage_output(pipe->model, slot, 0), activation_size(pipe), pipe->pgm->pp_next,
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
        send_recv(model_stage_output(pipe->model, slot, 0), pipe->pgm->pp_next,
                  pipe->output_tensor_grad, pipe->pgm->pp_next, activation_size(pipe),
                  &pipe->pgm->pp);
}

static void send_backward_recv_forward(PipelineParallel *pipe, int slot) {
    if (!pipe->pgm->pp_is_first)
        send_recv(pipe->input_tensor_grad, pipe->pgm->pp_prev,
                  model_stage_input(pipe->model, slot, 0), pipe->pgm->pp_prev,
                  activation_size(pipe), &pipe->pgm->pp);
}

// the first virtual stage reads the tokens and the last the targets
static float forward_micro_batch(PipelineParallel *pipe, int step, int micro, int chunk) {
    Model *model = pipe->model;
    int grad_acc = model->cfg.gradient_accumulation_steps, slot = micro % model->num_slots;
    int chunks = model->stage.num_chunks;
    double start = trace_begin();
    if ((model->stage.has_embedding && chunk == 0) ||
        (model->stage.has_head && chunk == chunks - 1)) {
        load_micro_batch(pipe->loader, step, micro);
        model_set_batch(model, slot, pipe->loader->input_ids, pipe->loader->target_ids);
    }
    float loss_scale = 1.0f / ((float)model->B * model->T * grad_acc);
    float loss = model_forward(model, slot, chunk, loss_scale) / grad_acc;
    trace_end(EV_FORWARD, micro, chunks > 1 ? chunk : -1, start);
    return loss;
}

// the first virtual stage's input is the tokens: no gradient to send back. The last
// micro-batch's backward is each chunk's last of the step: its gradients are final.
static void backward_micro_batch(PipelineParallel *pipe, int micro, int chunk) {
    Model *model = pipe->model;
    double start = trace_begin();
    pipe->dp->require_backward_grad_sync = micro == model->cfg.gradient_accumulation_steps - 1;
    model_backward(model, model->stage.has_embedding && chunk == 0 ? NULL : pipe->input_tensor_grad,
                   pipe->output_tensor_grad, micro % model->num_slots, chunk);
    trace_end(EV_BACKWARD, micro, model->stage.num_chunks > 1 ? chunk : -1, start);
}

static float train_step_pipeline_afab(PipelineParallel *pipe, int step) {
    int grad_acc = pipe->model->cfg.gradient_accumulation_steps, slots = pipe->model->num_slots;
    float loss = 0.0f;
    for (int micro = 0; micro < grad_acc; micro++) {
        recv_forward(pipe, micro % slots);
        loss += forward_micro_batch(pipe, step, micro, 0);
        send_forward(pipe, micro % slots);
    }
    for (int micro = 0; micro < grad_acc; micro++) {
        recv_backward(pipe);
        backward_micro_batch(pipe, micro, 0);
        send_backward(pipe);
    }
    return loss;
}

static float train_step_pipeline_1f1b(PipelineParallel *pipe, int step) {
    int grad_acc = pipe->model->cfg.gradient_accumulation_steps, slots = pipe->model->num_slots;
    int warmup = num_warmup(pipe->pgm->pp_size, pipe->pgm->pp_rank, 1, grad_acc);
    int remaining = grad_acc - warmup;
    float loss = 0.0f;
    for (int micro = 0; micro < warmup; micro++) {
        recv_forward(pipe, micro % slots);
        loss += forward_micro_batch(pipe, step, micro, 0);
        send_forward(pipe, micro % slots);
    }
    if (remaining > 0) recv_forward(pipe, warmup % slots);
    for (int i = 0; i < remaining; i++) {
        int last = i == remaining - 1, fwd = warmup + i;
        loss += forward_micro_batch(pipe, step, fwd, 0);
        send_forward_recv_backward(pipe, fwd % slots);
        backward_micro_batch(pipe, i, 0);
        if (last)
            send_backward(pipe);
        else
            send_backward_recv_forward(pipe, (fwd + 1) % slots);
    }
    for (int i = 0; i < warmup; i++) {
        recv_backward(pipe);
        backward_micro_batch(pipe, remaining + i, 0);
        send_backward(pipe);
    }
    return loss;
}

// Interleaved: the input or output of a rank's i-th forward (its slot's rows), or of its i-th
// backward (the gradient buffers); NULL where nothing travels: before virtual stage 0, after the
// last one, outside the step's grad_acc * V forwards and backwards.
static float *exchanged(PipelineParallel *pipe, int direction, int i, int side) {
    Model *model = pipe->model;
    int pp = pipe->pgm->pp_size, chunks = model->stage.num_chunks;
    if (i < 0 || i >= model->cfg.gradient_accumulation_steps * chunks) return NULL;
    int chunk = chunk_id(i, direction, pp, chunks),
        slot = micro_id(i, pp, chunks) % model->num_slots;
    if (side == INPUT ? pipe->pgm->pp_is_first && chunk == 0
                      : pipe->pgm->pp_is_last && chunk == chunks - 1)
        return NULL;
    if (direction == BACKWARD)
        return side == INPUT ? pipe->input_tensor_grad : pipe->output_tensor_grad;
    return side == INPUT ? model_stage_input(model, slot, chunk)
                         : model_stage_output(model, slot, chunk);
}

// Megatron's _communicate: one lock-step exchange with both neighbours on the ring, waited for
// before anything else runs. On pp, the output of forward `sent_fwd` goes to the next rank and the
// input of forward `next_fwd` comes from the previous one; on pp_grad, the input gradient of
// backward `sent_bwd` goes back and the output gradient of backward `next_bwd` comes in (-1: none).
// Nothing lands in the wrong buffer: each direction has its own communicator, on which MPI (one
// tag) and NCCL match two ranks' messages in posting order, and every rank's i-th forward is the
// same chunk and micro-batch, so rank r's outputs leave in the order rank r+1 takes them (across
// the wrap, the last rank's forward i feeds rank 0's forward i + pp: the same order); gradients
// likewise. Nothing deadlocks: an exchange waits only until its peers post their halves, and all
// ranks' exchanges fall into ticks (with grad_acc > pp, rank r's j-th is tick j + r), each meeting
// only its own tick's, so once a tick is done the next one's are all posted, and complete
// (tests/t_54 walks them for pp <= 8, V <= 4, grad_acc <= 6pp; all warm-up needs its own tick).
static void communicate(PipelineParallel *pipe, int sent_fwd, int sent_bwd, int next_fwd,
                        int next_bwd) {
    ProcessGroupManager *pgm = pipe->pgm;
    int pp = pgm->pp_size, next = (pgm->pp_rank + 1) % pp, prev = (pgm->pp_rank + pp - 1) % pp;
    size_t n = activation_size(pipe);
    Handle h[2] = {send_recv_start(exchanged(pipe, FORWARD, sent_fwd, OUTPUT), next,
                                   exchanged(pipe, FORWARD, next_fwd, INPUT), prev, n, &pgm->pp),
                   send_recv_start(exchanged(pipe, BACKWARD, sent_bwd, INPUT), prev,
                                   exchanged(pipe, BACKWARD, next_bwd, OUTPUT), next, n,
                                   &pgm->pp_grad)};
    comm_wait(&h[0]);
    comm_wait(&h[1]);
}

// Megatron's forward_backward_pipelining_with_interleaving: the warm-up forwards, then 1F1B
// pairs, then the cool-down backwards, over grad_acc * V forwards and backwards of one chunk
// each, each followed by one exchange that sends what it made and receives what comes next
static float train_step_pipeline_interleaved(PipelineParallel *pipe, int step) {
    int pp = pipe->pgm->pp_size, chunks = pipe->model->stage.num_chunks;
    int grad_acc = pipe->model->cfg.gradient_accumulation_steps, total = grad_acc * chunks;
    int warmup = num_warmup(pp, pipe->pgm->pp_rank, chunks, grad_acc), remaining = total - warmup;
    float loss = 0.0f;
    communicate(pipe, -1, -1, 0, -1);
    for (int i = 0; i < warmup; i++) {
        loss += forward_micro_batch(pipe, step, micro_id(i, pp, chunks),
                                    chunk_id(i, FORWARD, pp, chunks));
        // the last warm-up exchange also fetches the first backward's gradient
        communicate(pipe, i, -1, i + 1, i == warmup - 1 && remaining > 0 ? 0 : -1);
    }
    if (remaining == 0) communicate(pipe, -1, -1, -1, 0); // all warm-up: a tick of its own
    for (int i = 0, f = warmup; i < remaining; i++, f++) {
        loss += forward_micro_batch(pipe, step, micro_id(f, pp, chunks),
                                    chunk_id(f, FORWARD, pp, chunks));
        backward_micro_batch(pipe, micro_id(i, pp, chunks), chunk_id(i, BACKWARD, pp, chunks));
        communicate(pipe, f, i, f + 1, i + 1);
    }
    for (int i = remaining; i < total; i++) {
        backward_micro_batch(pipe, micro_id(i, pp, chunks), chunk_id(i, BACKWARD, pp, chunks));
        communicate(pipe, -1, i, -1, i + 1);
    }
    return loss;
}

float pipeline_train_step(PipelineParallel *pipe, int step) {
    if (strcmp(pipe->model->cfg.pp_engine, "afab") == 0)
        return train_step_pipeline_afab(pipe, step);
    if (pipe->model->stage.num_chunks > 1) return train_step_pipeline_interleaved(pipe, step);
    return train_step_pipeline_1f1b(pipe, step);
}

void pipeline_sync_tied_embeddings(Model *model) {
    if (model->pgm->pp_size == 1 || !model->cfg.tie_word_embeddings) return;
    if (!model->stage.has_embedding && !model->stage.has_head) return;
    all_reduce(model->dw.embed_tokens, (size_t)model->V * model->C, REDUCE_SUM, &model->pgm->embed);
}
