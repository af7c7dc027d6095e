// The Llama model of this rank: its parameter table and the forward and backward of its
// pipeline stage, sharded over tensor parallelism and the context-parallel sequence split.
#pragma once
#include <stddef.h>
#include "config.h"
#include "context_parallel.h"
#include "process_group_manager.h"
#include "tensor_parallel.h"

#define MAX_PARAMS 4096

enum { UNIFORM = 0, NORMAL = 1, CONSTANT = 2 };

// One tensor of the flat parameter buffer, named as Hugging Face Llama names it. This rank holds
// the block [row0, row0+rows) x [col0, col0+cols) of the full (global_rows, global_cols) tensor.
typedef struct {
    char name[96];
    int rows, cols, row0, col0, global_rows, global_cols;
    size_t offset; // into params / grads / m / v, in floats
    int init_kind; // init_tensor's kinds: UNIFORM, NORMAL, CONSTANT
    float init_bound;
    int replicated_tp; // the same on every tp rank (norms): counted once in norms
} ParamInfo;

// pointers into the flat buffers for one decoder layer
typedef struct {
    float *input_layernorm, *q_proj, *k_proj, *v_proj, *o_proj;
    float *post_attention_layernorm, *gate_proj, *up_proj, *down_proj;
} LayerWeights;

// what one micro-batch in flight keeps for its backward (one slot each)
typedef struct {
    int *tokens, *targets;  // (N) on the device
    float *resid;           // (L+1, N, C): input of each layer, then the stage output
    float *resid_mid;       // (L, N, C): after attention's residual add
    float *ln1, *ln2;       // (L, N, C)
    float *rstd1, *rstd2;   // (L, N)
    float *q, *att;         // (L, N, H*D)
    float *kv;              // (L, 2, N, KV*D): k then v, as the context ring sends them
    float *lse;             // (L, B, Hl, T)
    float *gate, *up, *act; // (L, N, Il)
    float *lnf, *rstdf;     // (N, C), (N): final norm (last stage)
    float *dlogits;         // (N, V): gradient of the loss, computed with the forward
    float loss;             // mean over this rank's tokens of the micro-batch
} Activations;

typedef struct Model {
    Config cfg;
    ProcessGroupManager *pgm;
    // sizes this rank holds (STYLE.md letters)
    int B, T, C, H, KV, D, I, V, L; // H, KV, I, V: this tp rank's share; T = seq / cp
    int layer0;                     // global index of this stage's first layer
    int vocab_start;                // first vocab row of this tp rank
    int first_stage, last_stage;
    // flat buffers (device) and their table
    ParamInfo table[MAX_PARAMS];
    int num_tensors;
    size_t num_params;
    float *params, *grads, *m, *v;
    LayerWeights *layers;       // (L), pointers into params
    float *embed;               // (V, C) first stage, and last stage when tied
    float *norm, *lm_head;      // last stage; lm_head == embed when tied
    float *rope_cos, *rope_sin; // (T, D/2) at the global positions of this rank's tokens
    // activations
    Activations *slots; // (num_slots)
    int num_slots, slots_in_use, peak_slots_in_use;
    // buffers shared by all slots: one micro-batch runs at a time
    float *dresid;                      // (N, C): gradient flowing down the residual stream
    float *dln, *dq, *datt, *dkv;       // (N, C), (N, H*D) x2, (2, N, KV*D)
    float *dgate, *dup, *dact, *logits; // (N, I) x3, (N, V)
    VocabParallelLossBuffers loss_buffers;
    float *scalar; // (1): a one-float all-reduce's buffer
    RingAttention ring;
    // data-parallel hook: called as each layer's gradients are final (NULL: none)
    void (*on_grads_ready)(void *ctx, size_t offset, size_t count);
    void *hook_ctx;
} Model;

void model_init(Model *model, const Config *cfg, ProcessGroupManager *pgm, int num_slots);
// model_memory.c: activation slots and backward buffers; cos/sin (T, D/2) at these positions
void model_alloc_buffers(Model *model, int num_slots);
void model_rope_tables(Model *model, const int *positions);
void model_free(Model *model);
const ParamInfo *model_find_param(const Model *model, const char *name);

// tokens/targets: (B, T) host arrays of this rank's tokens (already split over cp)
void model_set_batch(Model *model, int slot, const int *tokens, const int *targets);
// First stage embeds the slot's tokens; other stages read stage_input(slot), filled by the
// pipeline. The last stage computes the loss (returned, also in the slot) and dlogits, scaled by
// loss_scale (1 / (tokens of this rank's micro-batch * grad_acc)).
float model_forward(Model *model, int slot, float loss_scale);
// Last stage starts from the slot's dlogits; other stages from stage_output_grad(), filled by the
// pipeline. Leaves the gradient of the stage input in model->dresid.
void model_backward(Model *model, int slot);
float *model_stage_input(Model *model, int slot);  // (N, C) resid[0]
float *model_stage_output(Model *model, int slot); // (N, C) resid[L]
