// Where one rank's model keeps its tensors: the activation slots of the micro-batches in
// flight, the buffers the backward shares between them, and the RoPE tables.
#include <math.h>
#include "backend/backend.h"
#include "model.h"
#include "utils.h"

static void alloc_activations(Model *model, Activations *a) {
    size_t N = (size_t)model->B * model->T, L = model->L, C = model->C, HD = model->H * model->D,
           KVD = model->KV * model->D;
    a->tokens = device_malloc(N * sizeof(int));
    a->targets = device_malloc(N * sizeof(int));
#define ALLOC(field, count) a->field = device_malloc((count) * sizeof(float))
    ALLOC(resid, (L + 1) * N * C);
    ALLOC(resid_mid, L * N * C);
    ALLOC(ln1, L * N * C);
    ALLOC(ln2, L * N * C);
    ALLOC(rstd1, L * N);
    ALLOC(rstd2, L * N);
    ALLOC(q, L * N * HD);
    ALLOC(kv, L * 2 * N * KVD);
    ALLOC(att, L * N * HD);
    ALLOC(lse, L * N * model->H);
    ALLOC(gate, L * N * model->I);
    ALLOC(up, L * N * model->I);
    ALLOC(act, L * N * model->I);
    if (model->last_stage) {
        ALLOC(lnf, N * C);
        ALLOC(rstdf, N);
        ALLOC(dlogits, N * model->V);
    }
#undef ALLOC
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
    model->num_slots = num_slots;
    model->slots = xmalloc(num_slots * sizeof(Activations));
    for (int s = 0; s < num_slots; s++) alloc_activations(model, &model->slots[s]);

    size_t N = (size_t)model->B * model->T, HD = model->H * model->D;
    model->dresid = device_malloc(N * model->C * sizeof(float));
    model->dln = device_malloc(N * model->C * sizeof(float));
    model->dq = device_malloc(N * HD * sizeof(float));
    model->datt = device_malloc(N * HD * sizeof(float));
    model->dkv = device_malloc(2 * N * model->KV * model->D * sizeof(float));
    model->dgate = device_malloc(N * model->I * sizeof(float));
    model->dup = device_malloc(N * model->I * sizeof(float));
    model->dact = device_malloc(N * model->I * sizeof(float));
    if (model->last_stage) {
        model->logits = device_malloc(N * model->V * sizeof(float));
        VocabParallelLossBuffers *lb = &model->loss_buffers;
        lb->maxes = device_malloc(N * sizeof(float));
        lb->stats = device_malloc(2 * N * sizeof(float));
        lb->losses = device_malloc(N * sizeof(float));
        lb->loss_sum = device_malloc(sizeof(float));
    }
    model->scalar = device_malloc(sizeof(float));
}

static void free_activations(Activations *a) {
    float *buffers[] = {a->resid, a->resid_mid, a->ln1,   a->ln2,    a->rstd1, a->rstd2,
                        a->q,     a->kv,        a->att,   a->lse,    a->gate,  a->up,
                        a->act,   a->lnf,       a->rstdf, a->dlogits};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++)
        if (buffers[i]) device_free(buffers[i]);
    device_free(a->tokens);
    device_free(a->targets);
}

void model_free(Model *model) {
    for (int s = 0; s < model->num_slots; s++) free_activations(&model->slots[s]);
    float *buffers[] = {model->params,
                        model->grads,
                        model->m,
                        model->v,
                        model->rope_cos,
                        model->rope_sin,
                        model->dresid,
                        model->dln,
                        model->dq,
                        model->datt,
                        model->dkv,
                        model->dgate,
                        model->dup,
                        model->dact,
                        model->logits,
                        model->loss_buffers.maxes,
                        model->loss_buffers.stats,
                        model->loss_buffers.losses,
                        model->loss_buffers.loss_sum,
                        model->scalar};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++)
        if (buffers[i]) device_free(buffers[i]);
    ring_attention_free(&model->ring);
    free(model->layers);
    free(model->slots);
}

void model_set_batch(Model *model, int slot, const int *tokens, const int *targets) {
    size_t bytes = (size_t)model->B * model->T * sizeof(int);
    host_to_device(model->slots[slot].tokens, tokens, bytes);
    host_to_device(model->slots[slot].targets, targets, bytes);
}

float *model_stage_input(Model *model, int slot) {
    return model->slots[slot].resid;
}

float *model_stage_output(Model *model, int slot) {
    return model->slots[slot].resid + (size_t)model->L * model->B * model->T * model->C;
}
