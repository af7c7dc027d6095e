// Interleaved 1F1B (distributed.pp_virtual_stages = V > 1; Narayanan et al. 2021, Megatron-LM's
// forward_backward_pipelining_with_interleaving), beyond picotron: each rank holds V chunks of
// L/(pp*V) layers, chunk k of rank r being virtual stage k*pp + r, so micro-batches go round the
// ranks V times (a ring: the last rank's chunk k feeds rank 0's chunk k+1). The pipeline fills in
// chunks, 1/V of a stage each, so the bubble falls to (p-1)/(V*m+p-1) of the step, for V times the
// messages and more micro-batches in flight.
//
// It runs on pipeline_parallel.c's PipelineParallel and the model's chunk API
// (model_chunk_forward, model_chunk_backward); pipeline_parallel.c does not know it.
#include "pipeline_interleaved.h"
#include "backend/backend.h"
#include "trace.h"
#include "utils.h"

PipelineStage pipeline_interleaved_stage(const Config *cfg, const ProcessGroupManager *pgm) {
    int pp = pgm->pp_size, stage = pgm->pp_rank, chunks = cfg->pp_virtual_stages;
    int per_chunk = cfg->num_hidden_layers / (pp * chunks); // config_validate: it divides
    return (PipelineStage){.layer0 = stage * per_chunk,
                           .num_layers = per_chunk * chunks,
                           .has_embedding = pgm->pp_is_first,
                           .has_head = pgm->pp_is_last,
                           .num_chunks = chunks,
                           .chunk_stride = pp * per_chunk};
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

// Forwards before the first backward (Megatron's): the first backward is micro-batch 0's last
// chunk, so (V-1)*pp forwards of the chunks before it, then 2 per later stage while its forward
// goes on and its gradient comes back; all when grad_acc == pp.
static int num_warmup(int pp, int stage, int chunks, int grad_acc) {
    int total = grad_acc * chunks;
    int warmup = grad_acc == pp ? total : (pp - stage - 1) * 2 + (chunks - 1) * pp;
    return warmup < total ? warmup : total;
}

// A micro-batch holds its slot from its chunk 0's forward to its chunk 0's backward, both in
// micro-batch order: those in flight are consecutive, micro % slots never collide, and walking the
// 1F1B order (warm-up forwards, then each forward followed by a backward) finds the most at once.
int pipeline_interleaved_num_slots(const Config *cfg, int stage) {
    int pp = cfg->pp_size, chunks = cfg->pp_virtual_stages,
        grad_acc = cfg->gradient_accumulation_steps;
    int warmup = num_warmup(pp, stage, chunks, grad_acc), in_flight = 0, most = 0;
    for (int i = 0; i < grad_acc * chunks; i++) {
        if (chunk_id(i, FORWARD, pp, chunks) == 0 && ++in_flight > most) most = in_flight;
        if (i >= warmup && chunk_id(i - warmup, BACKWARD, pp, chunks) == 0) in_flight--;
    }
    return most;
}

// the first virtual stage reads the tokens and the last the targets
static float forward_chunk(PipelineParallel *pipe, int step, int micro, int chunk) {
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
    float loss = model_chunk_forward(model, slot, chunk, loss_scale) / grad_acc;
    trace_end(EV_FORWARD, micro, chunk, start);
    return loss;
}

// the first virtual stage's input is the tokens: no gradient to send back. The last
// micro-batch's backward is each chunk's last of the step: its gradients are final.
static void backward_chunk(PipelineParallel *pipe, int micro, int chunk) {
    Model *model = pipe->model;
    double start = trace_begin();
    pipe->dp->require_backward_grad_sync = micro == model->cfg.gradient_accumulation_steps - 1;
    model_chunk_backward(model,
                         model->stage.has_embedding && chunk == 0 ? NULL : pipe->input_tensor_grad,
                         pipe->output_tensor_grad, micro % model->num_slots, chunk);
    trace_end(EV_BACKWARD, micro, chunk, start);
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
    return side == INPUT ? model_chunk_input(model, slot, chunk)
                         : model_chunk_output(model, slot, chunk);
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
    size_t n = (size_t)pipe->model->Ns * pipe->model->C; // (Ns, C): a chunk input or output
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
float train_step_pipeline_interleaved(PipelineParallel *pipe, int step) {
    int pp = pipe->pgm->pp_size, chunks = pipe->model->stage.num_chunks;
    int grad_acc = pipe->model->cfg.gradient_accumulation_steps, total = grad_acc * chunks;
    int warmup = num_warmup(pp, pipe->pgm->pp_rank, chunks, grad_acc), remaining = total - warmup;
    float loss = 0.0f;
    communicate(pipe, -1, -1, 0, -1);
    for (int i = 0; i < warmup; i++) {
        loss +=
            forward_chunk(pipe, step, micro_id(i, pp, chunks), chunk_id(i, FORWARD, pp, chunks));
        // the last warm-up exchange also fetches the first backward's gradient
        communicate(pipe, i, -1, i + 1, i == warmup - 1 && remaining > 0 ? 0 : -1);
    }
    if (remaining == 0) communicate(pipe, -1, -1, -1, 0); // all warm-up: a tick of its own
    for (int i = 0, f = warmup; i < remaining; i++, f++) {
        loss +=
            forward_chunk(pipe, step, micro_id(f, pp, chunks), chunk_id(f, FORWARD, pp, chunks));
        backward_chunk(pipe, micro_id(i, pp, chunks), chunk_id(i, BACKWARD, pp, chunks));
        communicate(pipe, f, i, f + 1, i + 1);
    }
    for (int i = remaining; i < total; i++) {
        backward_chunk(pipe, micro_id(i, pp, chunks), chunk_id(i, BACKWARD, pp, chunks));
        communicate(pipe, -1, i, -1, i + 1);
    }
    return loss;
}
