// A mixture-of-experts MLP: Mixtral's sparse MoE block (Jiang et al. 2024, "Mixtral of Experts";
// Hugging Face transformers' MixtralSparseMoeBlock), forward and backward by hand. It stands where
// a decoder layer's MLP stands: y (N, C) from x (N, C), plus the load-balancing loss.
// Size letters: N tokens, C hidden, I each expert's intermediate size, E experts, K experts per
// token (Mixtral: E = 8, K = 2). Every tensor lives on the device; this file only passes pointers.
#pragma once
#include <stddef.h>
#include "backend/comm.h"
#include "expert_parallel.h"

// one expert, a SwiGLU MLP: down_proj(silu(gate_proj(x)) * up_proj(x))
typedef struct {
    float *gate_proj; // (I, C): Mixtral's w1; rows [0, I) of transformers' gate_up_proj[e]
    float *up_proj;   // (I, C): w3; rows [I, 2I) of gate_up_proj[e]
    float *down_proj; // (C, I): w2; transformers' down_proj[e]
} ExpertWeights;

// the layer's tensors, in a parameter buffer or in its gradient buffer
typedef struct {
    float *router;          // (E, C): Mixtral's gate (block_sparse_moe.gate, mlp.gate)
    ExpertWeights *experts; // (El), a host array of device pointers: this rank's experts
} MoeWeights;

typedef struct {
    int N, C, I, E, K;
    int capacity; // pairs an expert takes from one rank (GShard's expert capacity); 0: no limit
    int ep, El;   // expert parallelism: ep ranks share the E experts, El = E/ep on each
    int R;        // rows this rank's experts may receive: N*K without expert parallelism
} MoeSizes;

// capacity_factor 0: no limit; else capacity = ceil(capacity_factor * N * K / E) (at least 1);
// ep: the ranks the experts are split over (1: all here)
MoeSizes moe_sizes(int N, int C, int I, int E, int K, double capacity_factor, int ep);

// What the forward saves for the backward (one micro-batch), sized once by moe_activations_alloc
typedef struct {
    float *logits, *probs;   // (N, E): router logits and their softmax
    int *topk_ids;           // (N, K): the experts chosen, largest prob first
    float *topk_w;           // (N, K): their probs renormalised to sum to 1
    int *counts;             // (E): pairs routed to each expert, before capacity drops
    int *offsets;            // (E+1): expert e holds sorted rows [offsets[e], offsets[e+1])
    int *pos;                // (N, K): each pair's sorted row, -1 when capacity dropped it
    float *x_sorted;         // (N*K, C): the kept pairs' inputs, grouped by expert
    float *out_sorted;       // (N*K, C): each kept pair's expert output
    float *x_expert;         // (R, C): the rows this rank's experts run on, exchange.segments
    float *out_expert;       // (R, C): their outputs (both are x_sorted, out_sorted when ep = 1)
    float *gate, *up, *act;  // (R, I): act = silu(gate) * up
    ExpertExchange exchange; // expert parallelism's counts, kept for the backward
    float *load;             // (2E): moe_load's, summed over the ranks that hold the micro-batch
    int *offsets_host;       // (E+1): offsets, copied to the host to size each expert's products
    float *load_host;        // (2E): load on the host, where aux is formed
    int tokens;              // the micro-batch's tokens (N times the ranks that split it)
    float aux;               // the load-balancing loss of the micro-batch
    int dropped;             // pairs the capacity dropped in the last forward
    void *memory;            // the one device allocation (moe_activations_alloc's)
} MoeActivations;

// The backward's buffers, which any number of saved micro-batches can share
typedef struct {
    float *dlogits;      // (N, E)
    float *dtopk_w;      // (N, K)
    float *dsorted;      // (N*K, C): d out_sorted, then d x_sorted
    float *dexpert;      // (R, C): d out_expert, then d x_expert (dsorted when ep = 1)
    float *dact, *dgate; // (R, I)
    float *dup;          // (R, I)
    void *memory;
} MoeGrads;

void moe_activations_alloc(MoeActivations *a, const MoeSizes *s);
void moe_activations_free(MoeActivations *a);
// The same in a caller's memory (the model's activation slots): the device bytes a layer's saved
// tensors take, and a laid out over memory (those bytes, 256-byte pieces) with its own host arrays
size_t moe_activations_bytes(const MoeSizes *s);
void moe_activations_place(MoeActivations *a, void *memory, const MoeSizes *s);
void moe_activations_free_host(MoeActivations *a);
void moe_grads_alloc(MoeGrads *g, const MoeSizes *s);
void moe_grads_free(MoeGrads *g);
size_t moe_grads_bytes(const MoeSizes *s);

// y (N, C) = sum over each token's K experts of weight * expert(x); returns the load-balancing
// loss aux = E * sum_e f_e * P_e (Switch Transformer), which the caller scales by
// router_aux_loss_coef. Fills a for the backward. y may be x's buffer: x is read before y is
// written. cp: the ranks that hold the other tokens of the micro-batch (context parallelism),
// over which f and P are summed (E + E floats); NULL: these N tokens are the whole micro-batch.
// ep: the ranks that hold the other experts (expert_parallel.c); NULL: every expert is here.
float moe_forward(float *y, MoeActivations *a, const float *x, const MoeWeights *w,
                  const MoeSizes *s, Group *cp, ExpertParallel *ep);
// dx (N, C) += and every tensor of dw += the gradient of sum(y * dy) + aux_scale * aux, aux_scale
// being d loss / d aux (router_aux_loss_coef times the loss's own scale); a from moe_forward on x.
// It is the two halves below, which tensor parallelism separates (model_moe.c).
void moe_backward(float *dx, const MoeWeights *dw, MoeGrads *g, const float *dy, float aux_scale,
                  const MoeActivations *a, const float *x, const MoeWeights *w, const MoeSizes *s,
                  ExpertParallel *ep);
// The combine's and the experts' half: dx += the experts' input gradient, dw's experts +=, and
// g->dtopk_w (N, K) = dy . each pair's expert output
void moe_experts_backward(float *dx, const MoeWeights *dw, MoeGrads *g, const float *dy,
                          const MoeActivations *a, const MoeWeights *w, const MoeSizes *s,
                          ExpertParallel *ep);
// The router's half, from g->dtopk_w and the aux loss: g->dlogits (N, E), dw->router += and,
// unless dx is NULL, dx (N, C) += dlogits @ router
void moe_router_grad(float *dx, const MoeWeights *dw, MoeGrads *g, float aux_scale,
                     const MoeActivations *a, const float *x, const MoeWeights *w,
                     const MoeSizes *s);
