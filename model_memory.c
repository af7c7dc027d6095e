// Where one rank's model keeps its tensors: the activation slots of the micro-batches in
// flight, the buffers the backward shares between them, the RoPE tables, and the parameter
// table's rows. It allocates and lays out; it calls nothing of the model's.
//
// Activation recomputation (training.recompute; Chen et al. 2016, "Training Deep Nets with
// Sublinear Memory Cost", and Megatron-LM's "full" recomputation): a slot then keeps only each
// layer's input, the residual stream resid (L+1, N, C), and the head's tensors. Every slot's
// layers point at one shared layer's worth of saved tensors: the forward overwrites it layer by
// layer, and the backward runs each layer's forward again into it, from resid[l], just before that
// layer's backward. Per micro-batch in flight and layer, what is kept shrinks from C + 3C +
// 2H*D + 2KV*D + 3I floats a token (resid and the saved tensors, leaving out rstd and lse) to C;
// the price is one more forward of every layer in each backward (about a third more compute, a
// backward costing two forwards), with its tensor- and context-parallel communication run again.
// The same kernels on the same inputs give the same bits, so the losses do not change. Selective
// recomputation (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
// Models") would keep the GEMM outputs and redo only attention, whose (T, T) scores this model
// never stores anyway.
#include <math.h>
#include <stddef.h>
#include <string.h>
#include "backend/backend.h"
#include "model.h"
#include "utils.h"
#include "vocab_padding.h"

// Every tensor a decoder layer saves for its backward: where its pointer lives in
// LayerActivations, and its floats per token. This one table lays out each slot's layers and the
// backward's gradient buffers; a new saved tensor is one field and one row.
typedef struct {
    size_t field; // offsetof(LayerActivations, ...)
    size_t width; // floats per token
    int residual; // 1: held for the residual stream's rows only (Ns of the N when an extension
                  // splits the stream: the norms and the residual adds); 0: for all N tokens
} SavedTensor;

// floats one layer saves, `rows` of each residual-stream tensor; with `base`, also points s's
// fields at consecutive ranges of it. A mixture of experts replaces gate, up and act by its own
// saved tensors (moe.c lays them out), a Mamba's layer its mixer's (mamba.c); with_experts 0
// leaves those out: the backward's gradients
static size_t layer_activations_layout(LayerActivations *s, float *base, const Model *m,
                                       size_t rows, int with_experts) {
    int experts = m->cfg.num_experts > 0;
    size_t C = m->C, HD = (size_t)m->H * m->D, KVD = (size_t)m->KV * m->D, I = experts ? 0 : m->I;
#define ROW(f, w, residual)                                                                        \
    { offsetof(LayerActivations, f), (w), (residual) }
    const SavedTensor table[] = {
        ROW(self_attn.ln1, C, 1),  ROW(self_attn.rstd1, 1, 1),  ROW(self_attn.q, HD, 0),
        ROW(self_attn.k, KVD, 0),  ROW(self_attn.v, KVD, 0), // v after k: one block for the ring
        ROW(self_attn.att, HD, 0), ROW(self_attn.lse, m->H, 0), ROW(mid, C, 1),
        ROW(mlp.ln2, C, 1),        ROW(mlp.rstd2, 1, 1),        ROW(mlp.gate, I, 0),
        ROW(mlp.up, I, 0), // up right after gate: zeroed with it
        ROW(mlp.act, I, 0)};
    // a Mamba's layer: its norm's output and rstd, then the mixer's tensors (model_mamba.c)
    const SavedTensor mamba_table[] = {ROW(self_attn.ln1, C, 1), ROW(self_attn.rstd1, 1, 1)};
#undef ROW
    int mamba = config_is_mamba(&m->cfg);
    const SavedTensor *rows_of = mamba ? mamba_table : table;
    size_t count = mamba ? 2 : sizeof table / sizeof table[0];
    size_t N = (size_t)m->B * m->T, used = 0;
    for (size_t i = 0; i < count; i++) {
        if (base) *(float **)((char *)s + rows_of[i].field) = base + used;
        used += (rows_of[i].residual ? rows : N) * rows_of[i].width;
    }
    if (mamba && with_experts) {
        if (base) mamba_activations_place(&s->mixer, base + used, &m->mamba);
        used += mamba_activations_bytes(&m->mamba) / sizeof(float); // whole 256-byte pieces
    }
    if (experts && with_experts) {
        if (base) moe_activations_place(&s->mlp.moe, base + used, &m->moe);
        used += moe_activations_bytes(&m->moe) / sizeof(float); // whole 256-byte pieces
    }
    return used;
}

// the floats of one layer's saved tensors in a slot: Ns rows of the residual stream's
static size_t saved_floats(const Model *model) {
    return layer_activations_layout(NULL, NULL, model, model->Ns, 1);
}

// A slot is one allocation: resid (L+chunks, Ns, C), then each layer's saved tensors (none when
// they are recomputed), then the last stage's final norm and dlogits.
static size_t slot_floats(const Model *model) {
    size_t N = (size_t)model->B * model->T, Ns = model->Ns, L = model->L, C = model->C;
    size_t head = model->stage.has_head ? Ns * C + Ns + N * model->V : 0;
    size_t layers = model->cfg.recompute ? 0 : L * saved_floats(model);
    return (L + model->stage.num_chunks) * Ns * C + layers + head;
}

// under recomputation: the one shared layer's saved tensors, then its output (Ns, C)
static size_t recompute_floats(const Model *model) {
    if (!model->cfg.recompute) return 0;
    return saved_floats(model) + (size_t)model->Ns * model->C;
}

static void alloc_activations(Model *model, Activations *a) {
    size_t N = (size_t)model->B * model->T, Ns = model->Ns, L = model->L, C = model->C;
    a->memory = device_malloc(slot_floats(model) * sizeof(float));
    a->tokens = device_malloc(N * sizeof(int));
    a->targets = device_malloc(N * sizeof(int));
    a->layers = xmalloc((L ? L : 1) * sizeof(LayerActivations));
    float *p = a->memory;
    a->resid = p;
    p += (L + model->stage.num_chunks) * Ns * C;
    for (size_t l = 0; l < L; l++) {
        if (model->cfg.recompute) // every layer saves into the one shared layer
            layer_activations_layout(&a->layers[l], model->recompute_memory, model, Ns, 1);
        else
            p += layer_activations_layout(&a->layers[l], p, model, Ns, 1);
    }
    if (model->stage.has_head) {
        a->lnf = p;
        a->rstdf = p + Ns * C;
        a->dlogits = p + Ns * C + Ns;
    }
}

// Hugging Face Llama's rotary tables, in float as transformers computes them:
// inv_freq[i] = theta^(-2i/D), angle = position * inv_freq[i]
void model_rope_tables(Model *model, const int *positions) {
    int T = model->T, half = model->D / 2;
    float *cos_host = xmalloc((size_t)T * half * sizeof(float));
    float *sin_host = xmalloc((size_t)T * half * sizeof(float));
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            float inv_freq = 1.0f / powf(model->cfg.rope_theta, (float)(2 * i) / model->D);
            float angle = (float)positions[t] * inv_freq;
            cos_host[t * half + i] = cosf(angle);
            sin_host[t * half + i] = sinf(angle);
        }
    model->rope_cos = device_malloc((size_t)T * half * sizeof(float));
    model->rope_sin = device_malloc((size_t)T * half * sizeof(float));
    host_to_device(model->rope_cos, cos_host, (size_t)T * half * sizeof(float));
    host_to_device(model->rope_sin, sin_host, (size_t)T * half * sizeof(float));
    free(cos_host);
    free(sin_host);
}

void model_alloc_buffers(Model *model, int num_slots) {
    ring_attention_init(&model->ring, &model->pgm->cp, model->B, model->cfg.seq_length, model->H,
                        model->KV, model->D, model->cfg.cp_zigzag);
    if (model->cfg.recompute) {
        model->recompute_memory = device_malloc(recompute_floats(model) * sizeof(float));
        model->recompute_output = model->recompute_memory + saved_floats(model);
    }
    size_t N = (size_t)model->B * model->T;
    model->num_slots = num_slots;
    model->slots = xmalloc(num_slots * sizeof(Activations));
    for (int s = 0; s < num_slots; s++) alloc_activations(model, &model->slots[s]);

    // the backward's gradients: one layer's worth, laid out as a layer's saved tensors but for
    // all N rows (a column-parallel backward sums its input gradient over tp in them)
    size_t d_floats = layer_activations_layout(NULL, NULL, model, N, 0);
    model->d_memory = device_malloc(d_floats * sizeof(float));
    layer_activations_layout(&model->d, model->d_memory, model, N, 0);
    model->dresid = device_malloc((size_t)model->Ns * model->C * sizeof(float));
    if (model->stage.has_head) {
        model->logits = device_malloc(N * model->V * sizeof(float));
        VocabParallelLossBuffers *lb = &model->loss_buffers;
        lb->maxes = device_malloc(N * sizeof(float));
        lb->stats = device_malloc(2 * N * sizeof(float));
        lb->losses = device_malloc(N * sizeof(float));
        lb->loss_sum = device_malloc(sizeof(float));
        lb->padded_columns = vocab_padding_columns(&model->cfg, model->vocab_start, model->V);
    }
    model->scalar = device_malloc(2 * sizeof(float));
}

// what model_alloc_buffers allocates for `slots` micro-batches in flight: their slots (with their
// tokens and targets), the buffers every slot shares: the backward's, and recomputation's, and
// what the extensions added
size_t model_activation_bytes(const Model *model, int slots) {
    size_t N = (size_t)model->B * model->T;
    size_t backward =
        layer_activations_layout(NULL, NULL, model, N, 0) + (size_t)model->Ns * model->C;
    backward += model->stage.has_head ? N * model->V + 4 * N + 1 : 0;
    size_t shared = backward + recompute_floats(model) + 1;
    return (slots * (slot_floats(model) + 2 * N) + shared) * sizeof(float) + model->extension_bytes;
}

void model_free_buffers(Model *model) {
    for (int s = 0; s < model->num_slots; s++) {
        Activations *a = &model->slots[s];
        device_free(a->memory);
        device_free(a->tokens);
        device_free(a->targets);
        for (int l = 0; l < model->L && model->cfg.num_experts > 0; l++)
            moe_activations_free_host(&a->layers[l].mlp.moe);
        free(a->layers);
    }
    float *buffers[] = {model->params,
                        model->grads,
                        model->rope_cos,
                        model->rope_sin,
                        model->d_memory,
                        model->recompute_memory,
                        model->dresid,
                        model->logits,
                        model->loss_buffers.maxes,
                        model->loss_buffers.stats,
                        model->loss_buffers.losses,
                        model->loss_buffers.loss_sum,
                        model->scalar};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++)
        if (buffers[i]) device_free(buffers[i]);
    ring_attention_free(&model->ring);
    free(model->w.layers);
    free(model->dw.layers);
    free(model->slots);
}

void model_set_batch(Model *model, int slot, const int *tokens, const int *targets) {
    size_t bytes = (size_t)model->B * model->T * sizeof(int);
    host_to_device(model->slots[slot].tokens, tokens, bytes);
    host_to_device(model->slots[slot].targets, targets, bytes);
}

// resid holds, chunk after chunk, the inputs of the chunk's layers and then its output: layer l
// of chunk k = l / per_chunk reads row l + k, and writes the next
float *model_layer_input(const Model *model, const Activations *a, int l) {
    int per_chunk = model->L / model->stage.num_chunks;
    return a->resid + (size_t)(l + l / per_chunk) * model->Ns * model->C;
}

float *model_chunk_input(Model *model, int slot, int chunk) {
    return model_layer_input(model, &model->slots[slot],
                             chunk * (model->L / model->stage.num_chunks));
}

float *model_chunk_output(Model *model, int slot, int chunk) {
    int last = (chunk + 1) * (model->L / model->stage.num_chunks) - 1; // the chunk's last layer
    return model_layer_input(model, &model->slots[slot], last) + (size_t)model->Ns * model->C;
}

float *model_add_param(Model *model, float *base, const char *name, int rows, int cols,
                       TensorParallelSplit split, int init_kind) {
    if (model->num_tensors == model->table_capacity) { // doubling: a large MoE has thousands
        model->table_capacity = model->table_capacity ? 2 * model->table_capacity : 64;
        model->table = realloc(model->table, model->table_capacity * sizeof(ParamInfo));
        if (!model->table) FAIL("", "out of memory growing the parameter table");
    }
    // the embedding and the head (rows: vocab_size) hold the padded vocabulary (vocab_padding.c);
    // a checkpoint holds the rows given
    int file_rows = rows;
    if (split == VOCAB_PARALLEL) rows = vocab_size_with_padding(&model->cfg);
    Shard s = tensor_parallel_shard(split, rows, cols, &model->pgm->tp);
    ParamInfo *p = &model->table[model->num_tensors++];
    *p = (ParamInfo){.rows = s.rows,
                     .cols = s.cols,
                     .row0 = s.row0,
                     .col0 = s.col0,
                     .global_rows = rows,
                     .global_cols = cols,
                     .file_rows = file_rows,
                     .offset = model->num_params,
                     .init_kind = init_kind,
                     .replicated_tp = split == REPLICATED};
    snprintf(p->name, sizeof p->name, "%s", name);
    // linear layers start uniform(+-1/sqrt(fan_in)) of the whole tensor, as picotron; the
    // embedding N(0, 1); norms 1
    p->init_bound = init_kind == UNIFORM ? 1.0f / sqrtf(cols) : 1.0f;
    model->num_params += (size_t)s.rows * s.cols;
    if (model->window_hi == 0) return base ? base + p->offset : NULL;
    int inside = p->offset >= model->window_lo && p->offset < model->window_hi;
    return base && inside ? base + (p->offset - model->window_lo) : NULL;
}

int model_param_counts_once(const Model *model, const ParamInfo *p) {
    if (p->replicated_tp && model->pgm->tp_rank != 0) return 0;
    // the tied copy is the last stage's part -1
    return !(model->cfg.tie_word_embeddings && !model->stage.has_embedding &&
             p->offset < model->part_start[1]);
}

int param_table_find(const ParamInfo *table, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(table[i].name, name) == 0) return i;
    return -1;
}

const ParamInfo *model_find_param(const Model *model, const char *name) {
    int i = param_table_find(model->table, model->num_tensors, name);
    return i < 0 ? NULL : &model->table[i];
}
