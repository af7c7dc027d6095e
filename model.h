// The Llama model of this rank: its parameter table and the forward and backward of its
// pipeline stage. The model decides nothing about the layout: tensor_parallel.c says which part of
// each tensor this rank holds, pipeline_parallel.c which layers, context_parallel.c which
// positions of the sequence; train.c hands their answers to model_init.
// Size letters: B batch, T tokens this rank holds (seq/cp), C hidden, D head dim, H and KV this tp
// rank's query and kv heads, I its intermediate features, V its vocabulary rows, L this stage's
// layers, N = B*T; Ns the rows of the residual stream this rank holds (N in picotron's layout;
// an extension such as sequence_parallel.c may split them). Functions take outputs first, then
// inputs, then sizes.
#pragma once
#include <stddef.h>
#include "config.h"
#include "context_parallel.h"
#include "mamba.h"
#include "moe.h"
#include "process_group_manager.h"
#include "tensor_parallel.h"

// init kinds: init_tensor's three, then a Mamba's two that model_mamba.c computes on the host
enum { UNIFORM = 0, NORMAL = 1, CONSTANT = 2, MAMBA_A_LOG = 3, MAMBA_DT_BIAS = 4 };

// One tensor of the flat parameter buffer, named as Hugging Face Llama names it. This rank holds
// the block [row0, row0+rows) x [col0, col0+cols) of the full (global_rows, global_cols) tensor.
// A checkpoint holds its first file_rows rows: all of them, but the vocabulary's padding.
typedef struct {
    char name[96];
    int rows, cols, row0, col0, global_rows, global_cols;
    int file_rows; // global_rows less the padding of the embedding and head (vocab_padding.c)
    size_t offset; // into params and grads, in floats
    int init_kind; // init_tensor's kinds: UNIFORM, NORMAL, CONSTANT
    float init_bound;
    int replicated_tp; // the same on every tp rank (norms): counted once in norms
    int expert;        // an expert's tensor: one ep rank holds it (expert_parallel.c)
    int conv_shape;    // saved as (rows, 1, cols), torch's depthwise Conv1d weight (a Mamba's)
} ParamInfo;

// how many of the block's rows (from its first) lie in the tensor a checkpoint holds: all, but the
// vocabulary's padding rows, which are never initialised, saved or read
static inline int param_rows_in_file(const ParamInfo *p) {
    int rows = p->file_rows - p->row0;
    return rows < 0 ? 0 : rows < p->rows ? rows : p->rows;
}

// The part of the network one pipeline stage runs (pipeline_parallel.c decides it): num_chunks
// chunks of num_layers / num_chunks consecutive decoder layers, chunk k's first being global layer
// layer0 + k * chunk_stride (one chunk, unless the pipeline is interleaved)
typedef struct {
    int layer0, num_layers; // global index of its first decoder layer, and how many in all
    int has_embedding;      // the first stage embeds the tokens (in its chunk 0)
    int has_head;           // the last: the final norm, the head and the loss (in its last chunk)
    int num_chunks;         // distributed.pp_virtual_stages
    int chunk_stride;       // global layers from one chunk's first to the next's (pp * per chunk)
} PipelineStage;

// the global index of the stage's local layer l (checkpoints and traces name layers by it)
static inline int stage_global_layer(const PipelineStage *s, int l) {
    int per_chunk = s->num_layers / s->num_chunks;
    return s->layer0 + l / per_chunk * s->chunk_stride + l % per_chunk;
}

// What the parallel files decided for this rank, handed to model_init by train.c
typedef struct {
    TensorParallelSizes tp; // tensor_parallel_sizes(): heads, features and vocabulary held
    PipelineStage stage;    // pipeline_stage(): layers, embedding, head
    const int *positions;   // context_parallel_positions(): (T) global positions of the tokens
    int stream_rows;        // Ns: sequence_parallel_rows() (mbs * seq / cp without it)
} ModelShard;

// A decoder layer is an attention pair and an MLP pair, each with its pre-norm and residual add;
// a mixture-of-experts MLP replaces the MLP pair alone.
typedef struct {
    float *input_layernorm, *q_proj, *k_proj, *v_proj, *o_proj;
} AttentionWeights;
typedef struct {
    float *post_attention_layernorm, *gate_proj, *up_proj, *down_proj;
    MoeWeights moe; // model.num_experts > 0: the router and the experts instead of gate, up, down
} MlpWeights;
typedef struct {
    AttentionWeights self_attn;
    MlpWeights mlp;
    // model.model_type "mamba" (model_mamba.c): the layer is norm and mixer instead
    float *norm; // (C) backbone.layers.N.norm.weight
    MambaWeights mixer;
} LayerWeights;

// this stage's tensors, as pointers into one flat buffer (the parameters, or their gradients)
typedef struct {
    float *embed_tokens;   // (V, C) first stage, and last stage when tied
    LayerWeights *layers;  // (L)
    float *norm, *lm_head; // (C), (V, C) last stage; lm_head == embed_tokens when tied
} ModelWeights;

// What one decoder layer saves for its backward, each tensor (N, width); the gradients the
// backward computes have the same names and shapes. model_memory.c lays both out from one table.
typedef struct {
    float *ln1, *rstd1; // (Ns, C), (Ns): input_layernorm's output and 1/rms
    float *q, *k, *v;   // (N, H*D), (N, KV*D) x2: k then v, one block as the context ring sends it
    float *att, *lse;   // (N, H*D), (B, H, T): attention's output and log-sum-exp
} AttentionActivations;
typedef struct {
    float *ln2, *rstd2;     // (Ns, C), (Ns): post_attention_layernorm's output and 1/rms
    float *gate, *up, *act; // (N, I): act = silu(gate) * up (none with experts)
    MoeActivations moe;     // with experts: the router's choices and each expert's rows
} MlpActivations;
typedef struct {
    AttentionActivations self_attn;
    float *mid; // (Ns, C): the residual stream between attention and MLP
    MlpActivations mlp;
    MambaActivations mixer; // a Mamba's (its norm's output and rstd are self_attn's ln1, rstd1)
} LayerActivations;

// one micro-batch in flight (one slot each)
typedef struct Activations {
    int *tokens, *targets;    // (N) on the device
    float *resid;             // (L+chunks, Ns, C): per chunk, its layers' inputs, then its output
    LayerActivations *layers; // (L): pointers into `memory`; recomputing, all into the shared layer
    float *lnf, *rstdf;       // (Ns, C), (Ns): final norm (last stage)
    float *dlogits;           // (N, V): gradient of the loss, computed with the forward
    float loss;               // mean over this rank's tokens of the micro-batch
    float *memory;            // the slot's one device allocation
} Activations;

// The mixture of experts' numbers (model_moe.c), on the host: the step's so far, then the run's
typedef struct {
    double aux;  // this rank's part of the step's load-balancing loss (its layers, micro-batches)
    float *step; // (num_hidden_layers, E + 1): this step's pairs routed to each expert, then the
                 // pairs dropped, of this stage's layers (global index), its micro-batches
    float *reduced; // (1 + num_hidden_layers * (E + 1)) device: aux and step, summed over ranks
    double *run;    // (num_hidden_layers, E + 2): the steps' sums of step's rows, then of max/mean
    int steps;
} MoeStats;

typedef struct Model {
    Config cfg;
    ProcessGroupManager *pgm;
    PipelineStage stage;
    int B, T, C, D, H, KV, I, V, L; // this rank's sizes, read from the shard once, in model_init
    int Ns;                         // rows of the residual stream held (ModelShard's stream_rows)
    int vocab_start;                // first vocabulary row of this tp rank
    // flat buffers (device) and the table that names their ranges
    ParamInfo *table; // (num_tensors), grown as model_add_param registers tensors
    int num_tensors, table_capacity;
    size_t num_params;
    float *params, *grads;
    ModelWeights w, dw; // the same table over params and over grads
    // the flat ranges of the stage's parts, in layout order: part p (-1 the embedding, empty on a
    // middle stage; 0..L-1 a decoder layer; L the head: the final norm and an untied lm_head)
    // holds [part_start[p + 1], part_start[p + 2]). ZeRO-3's units (zero.c).
    size_t *part_start; // (L + 3)
    // model_add_param's pointers (window_hi > 0): only for tensors in [window_lo, window_hi), base
    // standing for element window_lo; NULL for the others (ZeRO-3 points a part at its gathered
    // copy)
    size_t window_lo, window_hi;
    float *rope_cos, *rope_sin; // (T, D/2) at the global positions of this rank's tokens
    // activations
    Activations *slots; // (num_slots)
    int num_slots, slots_in_use, peak_slots_in_use;
    // the backward's buffers, shared by all slots: one micro-batch runs at a time
    LayerActivations d; // one layer's gradients (all N rows), pointers into d_memory
    float *d_memory;
    float *dresid;     // (Ns, C): the residual stream's gradient when the caller wants none back
    TensorParallel tp; // this rank's tp group, and how the stream is held (tensor_parallel.h)
    // full recomputation (training.recompute): the one layer's saved tensors that every slot's
    // layers point at, refilled before each layer's backward, and that layer's output (Ns, C),
    // which nothing reads (the slot's resid already holds it)
    float *recompute_memory, *recompute_output;
    float *logits; // (N, V)
    VocabParallelLossBuffers loss_buffers;
    float *scalar; // (2): device floats for tiny all-reduces (the step's loss, the grad norm)
    RingAttention ring;
    // mixture of experts (cfg.num_experts > 0): one layer's sizes, the backward's buffers shared
    // by every layer and slot, and the statistics of the load
    MoeSizes moe;
    ExpertParallel ep; // which experts this rank holds, and the all-to-alls' bytes and time
    MoeGrads moe_grads;
    MoeStats moe_stats;
    // a Mamba (cfg.model_type "mamba"): one layer's sizes, and the backward's buffers
    MambaSizes mamba;
    MambaGrads mamba_grads;
    MambaContextParallel *mamba_cp; // NULL without context parallelism
    float *mamba_dy; // (N, C) under sequence parallelism: the gathered gradient of a layer's out
    // data parallelism's backward hook (picotron's register_backward_hook): called as the
    // gradients of params [offset, offset + count) become final for the step; NULL: none
    void (*on_grads_ready)(void *ctx, size_t offset, size_t count);
    void *hook_ctx;
    // ZeRO-3's (zero.c): called before the forward (backward 0) or the backward (1) of part p
    // (as part_start numbers them) reads its weights, so that they can be gathered; NULL: none
    void (*on_params_needed)(void *ctx, int part, int backward);
    void *params_ctx;
    // after each micro-batch's loss on the last stage, where loss_buffers.losses holds its token
    // losses and a->dlogits their gradient (each domain's loss, DoReMi's weights: doremi.c)
    void (*on_loss)(struct Model *model, struct Activations *a);
    void *loss_ctx;
    // device bytes the extensions allocated for this model's activations (sequence parallelism's
    // gathered stream, the experts' buffers), which model_activation_bytes counts with its own
    size_t extension_bytes;
} Model;

void model_init(Model *model, const Config *cfg, ProcessGroupManager *pgm, const ModelShard *shard,
                int num_slots);
// p's first values (init_tensor's kinds), into dst (rows x cols): the seed and p's name decide
// them, whatever the layout
void model_init_tensor(const Model *model, float *dst, const ParamInfo *p);
// model_memory.c: activation slots and backward buffers (and their release); cos/sin (T, D/2)
// at these positions
void model_alloc_buffers(Model *model, int num_slots);
void model_free_buffers(Model *model);
// the bytes of activations and the backward's buffers with `slots` micro-batches in flight
size_t model_activation_bytes(const Model *model, int slots);
void model_rope_tables(Model *model, const int *positions);
void model_free(Model *model);
const ParamInfo *model_find_param(const Model *model, const char *name); // NULL: not here
int param_table_find(const ParamInfo *table, int n, const char *name);   // its index, or -1
// The whole model's tensors (every layer, none split), in layout order: what a checkpoint holds.
// Returns the table (malloc'd: the caller frees it) and its length in *n.
ParamInfo *model_full_table(const Config *cfg, int *n);
// Registers this rank's shard of the Hugging Face tensor `name` (rows, cols), split over tp as
// `split` says, in model->table; a VOCAB_PARALLEL tensor (rows = vocab_size) gets the padded
// vocabulary's rows. Returns its place in `base` (NULL: the sizing pass).
float *model_add_param(Model *model, float *base, const char *name, int rows, int cols,
                       TensorParallelSplit split, int init_kind);
// model.c: this stage's parameter table, and w's pointers into base (NULL: only the sizes)
void model_layout_params(Model *model, ModelWeights *w, float *base);
// 1 for the one copy of p's elements that counts in this model replica: norms are the same on
// every tp rank, and the tied embedding's copy on the last stage repeats the first stage's
int model_param_counts_once(const Model *model, const ParamInfo *p);

// tokens/targets: (B, T) host arrays of this rank's tokens (already split over cp)
void model_set_batch(Model *model, int slot, const int *tokens, const int *targets);
// The forward of the stage's chunk `chunk` (0 without interleaving). The first stage's chunk 0
// embeds the slot's tokens; every other chunk reads model_stage_input(slot, chunk), filled by the
// pipeline. The last stage's last chunk computes the loss (returned, also in the slot) and
// dlogits, scaled by loss_scale (1 / (tokens of this rank's micro-batch * grad_acc)).
float model_chunk_forward(Model *model, int slot, int chunk, float loss_scale);
// The chunk's backward, picotron's output_tensor_grad in and input_tensor_grad out:
// output_grad (Ns, C) is the gradient of the chunk output (NULL for the last stage's last chunk:
// the loss gives it); input_grad (Ns, C) receives the gradient of the chunk input (NULL: not
// wanted, as for the first stage's chunk 0, whose input is the tokens).
void model_chunk_backward(Model *model, float *input_grad, const float *output_grad, int slot,
                          int chunk);
float *model_chunk_input(Model *model, int slot, int chunk);  // (Ns, C) the chunk's first resid row
float *model_chunk_output(Model *model, int slot, int chunk); // (Ns, C) its last
// picotron's model: one chunk, the stage's every layer
static inline float model_forward(Model *model, int slot, float loss_scale) {
    return model_chunk_forward(model, slot, 0, loss_scale);
}
static inline void model_backward(Model *model, float *input_grad, const float *output_grad,
                                  int slot) {
    model_chunk_backward(model, input_grad, output_grad, slot, 0);
}
static inline float *model_stage_input(Model *model, int slot) {
    return model_chunk_input(model, slot, 0);
}
static inline float *model_stage_output(Model *model, int slot) {
    return model_chunk_output(model, slot, 0);
}
// (Ns, C) the resid row that holds the input of the stage's local layer l in slot a
float *model_layer_input(const Model *model, const Activations *a, int l);

// model_moe.c: the mixture-of-experts MLP that replaces a layer's MLP when cfg.num_experts > 0.
// Its tensors in the table (global layer index layer), as model_layout_params's MLP part
void moe_layout_params(Model *model, MlpWeights *m, float *base, int layer);
// out (Ns, C) = mid + moe(ln2), ln2 = rmsnorm(mid); s receives what the backward needs
void moe_mlp_forward(Model *model, float *out, MlpActivations *s, const float *mid,
                     const MlpWeights *w);
// dresid holds d(out) on entry and d(mid) on return; counts the load of local layer l's step
void moe_mlp_backward(Model *model, float *dresid, const MlpWeights *dw, const MlpActivations *s,
                      const float *mid, const MlpWeights *w, int l);
// for model_init (before model_alloc_buffers: the layers' sizes need it): one layer's sizes, the
// backward's buffers, the statistics (their device bytes go to extension_bytes); and their release
void moe_alloc_buffers(Model *model);
void moe_free_buffers(Model *model);
// The step's load-balancing loss over the whole global batch, as one rank's run gives it (every
// rank calls it after the step): the mean over layers of each layer's, averaged over the
// micro-batches; the run's statistics of the load take the step's. 0 for a dense model.
float moe_step_aux_loss(Model *model);
// the load per expert over the run, and the pairs dropped (nothing for a dense model)
void moe_report(const Model *model);

// model_mamba.c: a Mamba (cfg.model_type "mamba", transformers' MambaForCausalLM) in place of the
// Llama. This stage's parameter table and w's pointers into base, as model_layout_params
void mamba_layout_params(Model *model, ModelWeights *w, float *base);
// p's initial values (kinds MAMBA_A_LOG, MAMBA_DT_BIAS), into params + p->offset
void mamba_init_tensor(Model *model, const ParamInfo *p);
// out (Ns, C) = x + mixer(rmsnorm(x)), x the input of slot a's local layer l
void mamba_layer_forward(Model *model, float *out, const Activations *a, int l);
// dresid holds d(out) on entry and d(x) on return
void mamba_layer_backward(Model *model, float *dresid, const Activations *a, int l);
// the layer's sizes and backward buffers (before model_alloc_buffers), and their release
void mamba_alloc_buffers(Model *model);
void mamba_free_buffers(Model *model);
// ./generate's recurrent state instead of a KV cache (B = 1, tp = cp = 1): after the prompt's
// window forward (P tokens), each layer's SSM state (L, I, S), a device allocation the caller
// frees; then one token at position pos, its row of every slot tensor and of logits, the state
// stepped
float *mamba_decode_begin(Model *model, int P);
void mamba_decode_step(Model *model, int pos, int token, float *states);
