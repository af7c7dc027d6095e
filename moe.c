// A mixture-of-experts MLP, Mixtral's sparse MoE block, forward and backward by hand.
//
// forward, for N tokens x (N, C):
//   router:  logits = x @ Wg^T (N, E); probs = softmax(logits); each token picks its K most
//            probable experts and renormalises their probs to sum to 1 (Mixtral)
//   sort:    the (token, choice) pairs are grouped by expert, in token order, so each expert
//            reads its tokens as contiguous rows of x_sorted and runs as one matmul per weight;
//            with a capacity, an expert takes only its first `capacity` pairs and the rest are
//            dropped (GShard, Lepikhin et al. 2020; Switch Transformer, Fedus et al. 2021): in
//            expert parallelism (later) the capacity bounds the buffers that travel
//   experts: out_sorted = down(silu(gate(x_sorted)) * up(x_sorted)), each expert on its rows;
//            under expert parallelism the rows travel to the rank that holds their expert first,
//            and the outputs back after (expert_parallel.c: x_expert and out_expert are those
//            ranks' rows, each expert's from every source rank in turn)
//   combine: y[n] = sum_j w[n, j] * out_sorted[pos[n, j]]
//   aux:     E * sum_e f_e * P_e, f_e the pairs routed to e per token (before drops; they sum
//            to K, as transformers' load_balancing_loss_func counts them), P_e the mean prob of
//            e: smallest when the load is uniform (Switch Transformer, eq. 4-6).
//            Both are sums over the micro-batch's tokens divided by their number, so when context
//            parallelism splits a micro-batch, the E pair counts and E prob sums are summed over
//            the cp ranks first (one all-reduce of 2E floats) and every rank forms the same aux.
// The backward runs these lines in reverse. Only the expert offsets (E+1 ints) and the load (2E
// floats) come to the host: each expert's matmul needs its number of rows there, and aux is
// formed there.
#include <math.h>
#include "moe.h"
#include "backend/backend.h"
#include "utils.h"

MoeSizes moe_sizes(int N, int C, int I, int E, int K, double capacity_factor, int ep) {
    if (N < 0 || C < 1 || I < 1 || E < 1 || K < 1 || K > E || ep < 1 || E % ep != 0)
        FAIL("a layer needs 1 <= K <= E experts, positive sizes and ep dividing E",
             "mixture of experts: N=%d C=%d I=%d E=%d K=%d ep=%d", N, C, I, E, K, ep);
    if (!(capacity_factor >= 0.0))
        FAIL("capacity_factor is 0 (no limit) or a positive factor, such as 1.25",
             "mixture of experts: capacity_factor = %g", capacity_factor);
    MoeSizes s = {.N = N, .C = C, .I = I, .E = E, .K = K, .ep = ep, .El = E / ep, .R = N * K};
    if (capacity_factor > 0.0) {
        // 0.1 * 30 is 3.0000000000000004 in binary: the 1e-9 keeps such rounding from adding a slot
        double slots = ceil(capacity_factor * N * K / E - 1e-9);
        s.capacity = slots < 1.0 ? 1 : slots > (double)N * K ? N * K : (int)slots;
    }
    // each of the ep ranks sends at most N*K pairs, and with a capacity at most `capacity` to
    // each expert here
    if (ep > 1) s.R = ep * (s.capacity && s.El * s.capacity < N * K ? s.El * s.capacity : N * K);
    return s;
}

// Lays the buffers out in one allocation: a first pass with base NULL counts the bytes, a second
// hands out the pieces, each aligned to 256 bytes (what cudaMalloc gives its allocations).
static void *piece(char *base, size_t *offset, size_t bytes) {
    void *p = base ? base + *offset : NULL;
    *offset += (bytes + 255) / 256 * 256;
    return p;
}

static size_t activations_layout(MoeActivations *a, char *base, const MoeSizes *s) {
    size_t N = s->N, C = s->C, I = s->I, E = s->E, K = s->K, R = s->R, f = sizeof(float), o = 0;
    size_t i = sizeof(int);
    a->logits = piece(base, &o, N * E * f), a->probs = piece(base, &o, N * E * f);
    a->topk_ids = piece(base, &o, N * K * i), a->topk_w = piece(base, &o, N * K * f);
    a->counts = piece(base, &o, E * i), a->offsets = piece(base, &o, (E + 1) * i);
    a->pos = piece(base, &o, N * K * i);
    a->x_sorted = piece(base, &o, N * K * C * f), a->out_sorted = piece(base, &o, N * K * C * f);
    a->x_expert = a->x_sorted, a->out_expert = a->out_sorted;
    if (s->ep > 1)
        a->x_expert = piece(base, &o, R * C * f), a->out_expert = piece(base, &o, R * C * f);
    a->gate = piece(base, &o, R * I * f), a->up = piece(base, &o, R * I * f);
    a->act = piece(base, &o, R * I * f);
    a->load = piece(base, &o, 2 * E * f);
    return o;
}

size_t moe_activations_bytes(const MoeSizes *s) {
    MoeActivations a;
    return activations_layout(&a, NULL, s);
}

void moe_activations_place(MoeActivations *a, void *memory, const MoeSizes *s) {
    activations_layout(a, memory, s);
    a->memory = NULL; // the caller's
    a->offsets_host = xmalloc((size_t)(s->E + 1) * sizeof(int));
    a->load_host = xmalloc(2 * (size_t)s->E * sizeof(float));
    expert_exchange_alloc(&a->exchange, s->ep, s->El);
    a->tokens = a->dropped = 0;
    a->aux = 0.0f;
}

void moe_activations_free_host(MoeActivations *a) {
    free(a->offsets_host);
    free(a->load_host);
    expert_exchange_free(&a->exchange);
}

void moe_activations_alloc(MoeActivations *a, const MoeSizes *s) {
    void *memory = device_malloc(moe_activations_bytes(s));
    moe_activations_place(a, memory, s);
    a->memory = memory;
}

void moe_activations_free(MoeActivations *a) {
    device_free(a->memory);
    moe_activations_free_host(a);
}

static size_t grads_layout(MoeGrads *g, char *base, const MoeSizes *s) {
    size_t N = s->N, C = s->C, I = s->I, E = s->E, K = s->K, R = s->R, f = sizeof(float), o = 0;
    g->dlogits = piece(base, &o, N * E * f), g->dtopk_w = piece(base, &o, N * K * f);
    g->dsorted = piece(base, &o, N * K * C * f);
    g->dexpert = s->ep > 1 ? piece(base, &o, R * C * f) : g->dsorted;
    g->dact = piece(base, &o, R * I * f), g->dgate = piece(base, &o, R * I * f);
    g->dup = piece(base, &o, R * I * f);
    return o;
}

size_t moe_grads_bytes(const MoeSizes *s) {
    MoeGrads g;
    return grads_layout(&g, NULL, s);
}

void moe_grads_alloc(MoeGrads *g, const MoeSizes *s) {
    g->memory = device_malloc(moe_grads_bytes(s));
    grads_layout(g, g->memory, s);
}

void moe_grads_free(MoeGrads *g) {
    device_free(g->memory);
}

// aux = E * sum_e f_e * P_e from the micro-batch's load: pairs and prob sums of each expert over
// its tokens, whichever ranks hold them
static float aux_loss(MoeActivations *a, const MoeSizes *s, Group *cp) {
    int E = s->E;
    moe_load(a->load, a->probs, a->counts, s->N, E);
    if (cp) all_reduce(a->load, 2 * (size_t)E, REDUCE_SUM, cp);
    device_to_host(a->load_host, a->load, 2 * (size_t)E * sizeof(float));
    a->tokens = s->N * (cp ? cp->size : 1);
    double total = 0.0;
    for (int e = 0; e < E; e++) total += (double)a->load_host[e] * a->load_host[E + e];
    double tokens = a->tokens;
    return a->tokens > 0 ? (float)(E * total / (tokens * tokens)) : 0.0f;
}

// the experts' SwiGLU MLPs on their rows: segment i of x_expert (rows [seg[i], seg[i+1])) came
// from source rank i / El for local expert i % El (one rank: segment e is expert e's rows)
static void experts_forward(MoeActivations *a, const MoeWeights *w, const MoeSizes *s) {
    int C = s->C, I = s->I, El = s->El, S = s->ep * El;
    const int *seg = a->exchange.segments;
    for (int i = 0; i < S; i++) {
        const ExpertWeights *x = &w->experts[i % El];
        size_t r0 = seg[i];
        int rows = seg[i + 1] - seg[i]; // none: the products do nothing
        matmul_forward(a->gate + r0 * I, a->x_expert + r0 * C, x->gate_proj, rows, C, I);
        matmul_forward(a->up + r0 * I, a->x_expert + r0 * C, x->up_proj, rows, C, I);
    }
    swiglu_forward(a->act, a->gate, a->up, (size_t)seg[S] * I); // every expert's rows at once
    for (int i = 0; i < S; i++) {
        size_t r0 = seg[i];
        int rows = seg[i + 1] - seg[i];
        matmul_forward(a->out_expert + r0 * C, a->act + r0 * I, w->experts[i % El].down_proj, rows,
                       I, C);
    }
}

float moe_forward(float *y, MoeActivations *a, const float *x, const MoeWeights *w,
                  const MoeSizes *s, Group *cp, ExpertParallel *ep) {
    int N = s->N, C = s->C, E = s->E, K = s->K;
    ExpertParallel all;
    if (!ep) expert_parallel_init(ep = &all, NULL, E);
    // router: logits = x @ Wg^T; softmax; top-K; renormalise
    matmul_forward(a->logits, x, w->router, N, C, E);
    moe_router_forward(a->probs, a->topk_ids, a->topk_w, a->logits, N, E, K);
    // sort the pairs by expert; the load-balancing loss counts them before capacity drops
    moe_dispatch(a->counts, a->offsets, a->pos, a->topk_ids, N, E, K, s->capacity);
    a->aux = aux_loss(a, s, cp);
    device_to_host(a->offsets_host, a->offsets, (size_t)(E + 1) * sizeof(int));
    a->dropped = N * K - a->offsets_host[E];
    moe_gather_forward(a->x_sorted, x, a->pos, N, C, K);
    // expert parallelism: counts first, then each pair to the rank that holds its expert
    expert_parallel_counts(&a->exchange, a->offsets_host, C, ep);
    expert_parallel_to_experts(a->x_expert, a->x_sorted, &a->exchange, ep);
    experts_forward(a, w, s);
    expert_parallel_to_tokens(a->out_sorted, a->out_expert, &a->exchange, ep);
    // combine: each token's kept pairs, weighted
    moe_combine_forward(y, a->out_sorted, a->topk_w, a->pos, N, C, K);
    return a->aux;
}

void moe_backward(float *dx, const MoeWeights *dw, MoeGrads *g, const float *dy, float aux_scale,
                  const MoeActivations *a, const float *x, const MoeWeights *w, const MoeSizes *s,
                  ExpertParallel *ep) {
    moe_experts_backward(dx, dw, g, dy, a, w, s, ep);
    moe_router_grad(dx, dw, g, aux_scale, a, x, w, s);
}

void moe_experts_backward(float *dx, const MoeWeights *dw, MoeGrads *g, const float *dy,
                          const MoeActivations *a, const MoeWeights *w, const MoeSizes *s,
                          ExpertParallel *ep) {
    int N = s->N, C = s->C, I = s->I, E = s->E, K = s->K, El = s->El, S = s->ep * El;
    ExpertParallel all;
    if (!ep) expert_parallel_init(ep = &all, NULL, E);
    const int *seg = a->exchange.segments;
    size_t pairs_kept = a->offsets_host[E], rows = seg[S], f = sizeof(float);
    // forward: y[n] = sum_j w[n, j] * out_sorted[pos[n, j]]
    device_zero(g->dsorted, pairs_kept * C * f);
    device_zero(g->dtopk_w, (size_t)N * K * f);
    moe_combine_backward(g->dsorted, g->dtopk_w, dy, a->out_sorted, a->topk_w, a->pos, N, C, K);
    // forward: out_sorted came back from the experts' ranks: d out goes to them the same way
    expert_parallel_to_experts(g->dexpert, g->dsorted, &a->exchange, ep);
    // forward: out_expert = act @ down_proj^T, on each expert's rows (which write d act whole)
    for (int i = 0; i < S; i++) {
        size_t r0 = seg[i];
        int n = seg[i + 1] - seg[i];
        matmul_backward_write(g->dact + r0 * I, dw->experts[i % El].down_proj, g->dexpert + r0 * C,
                              a->act + r0 * I, w->experts[i % El].down_proj, n, I, C);
    }
    // forward: act = silu(gate) * up
    swiglu_backward(g->dgate, g->dup, g->dact, a->gate, a->up, rows * I);
    // forward: gate = x_expert @ gate_proj^T, up = x_expert @ up_proj^T. d out_expert is spent,
    // so its buffer takes d x_expert: gate's product writes it, up's adds.
    for (int i = 0; i < S; i++) {
        const ExpertWeights *dwe = &dw->experts[i % El], *we = &w->experts[i % El];
        size_t r0 = seg[i];
        int n = seg[i + 1] - seg[i];
        matmul_backward_write(g->dexpert + r0 * C, dwe->gate_proj, g->dgate + r0 * I,
                              a->x_expert + r0 * C, we->gate_proj, n, C, I);
        matmul_backward(g->dexpert + r0 * C, dwe->up_proj, g->dup + r0 * I, a->x_expert + r0 * C,
                        we->up_proj, n, C, I);
    }
    // forward: x_expert came from the tokens' ranks: d x goes back to them
    expert_parallel_to_tokens(g->dsorted, g->dexpert, &a->exchange, ep);
    // forward: x_sorted[pos[n, j]] = x[n]
    moe_gather_backward(dx, g->dsorted, a->pos, N, C, K);
}

void moe_router_grad(float *dx, const MoeWeights *dw, MoeGrads *g, float aux_scale,
                     const MoeActivations *a, const float *x, const MoeWeights *w,
                     const MoeSizes *s) {
    int N = s->N, C = s->C, E = s->E, K = s->K;
    // forward: probs, topk_w = router(logits), and aux = E * sum_e f_e * P_e (f_e constant)
    device_zero(g->dlogits, (size_t)N * E * sizeof(float));
    moe_router_backward(g->dlogits, g->dtopk_w, a->probs, a->topk_ids, a->topk_w, a->load,
                        aux_scale, a->tokens, N, E, K);
    // forward: logits = x @ Wg^T
    matmul_backward(dx, dw->router, g->dlogits, x, w->router, N, C, E);
}
