// One mixture-of-experts layer (moe.c over backend/*/moe.*) is Mixtral's sparse MoE block:
//   a. the backward of each new kernel and of the whole layer (d x, d router, d every expert, the
//      load-balancing loss's part alone too) equals central finite differences of a scalar loss,
//      for K = 2 and K = 1 of E = 4 experts, with and without a capacity that drops pairs, on
//      inputs drawn away from top-k ties; the backward accumulates (twice = 2x);
//   b. the layer equals transformers' MixtralSparseMoeBlock (tests/fixtures/moe_mixtral.bin, from
//      tests/reference/make_moe_fixture.py): y, aux, and the gradients of sum(y * R) + coef * aux
//      and of aux alone, within TORCH_TOL of each tensor's largest value;
//   c. with capacities that drop pairs, the dropped count and y equal a plain-C reference in
//      double that routes, counts and drops on its own; an expert with no token is no trouble.
// Every tensor goes through device memory, so the program runs on either build.
// usage: test_moe tests/fixtures/moe_mixtral.bin
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "backend/backend.h"
#include "moe.h"
#include "utils.h"
#include "tests/layer_check.h"

// Finite differences as tests/test_kernels.c takes them: the forward runs in float, so L carries
// rounding noise of ~1e-7 * sum|y * R| (the aux loss alone: its float's last bit, 2.4e-7), a few
// 1e-5 of a unit gradient over a step of 2 * FD_EPS; the central difference's truncation error
// is ~FD_EPS^2 / 6 * L''' ~ 1e-4. Measured: 2.4e-4 at worst (aux alone), where a wrong term is
// off by 1e-1 or more. MIN_GAP keeps each token's K-th and (K+1)-th router logits apart by more
// than twice what a step moves one (FD_EPS * max |x| or |Wg|, 2e-2), so no step changes a choice.
#define FD_EPS    2e-2f
#define FD_TOL    2e-3
#define MIN_GAP   0.1
#define EXACT_TOL 1e-6 // float rounding of the same sums in another order
// fp32 on both sides: y and the gradients agree to ~1e-6 of their largest values (measured
// 2e-7 to 4e-7), the aux loss to a few ulps
#define TORCH_TOL 1e-5
#define REF_TOL   1e-5 // the float layer against the double reference, relative to max |y|

static float *zeros(size_t n) {
    return xmalloc(n * sizeof(float));
} // xmalloc zeroes

// ---------------------------------------------------------------------------------------------
// The host side of a layer, in transformers' layout: x (N, C), router (E, C), gate_up (E, 2I, C)
// (rows [0, I) of each expert its gate_proj, w1; rows [I, 2I) its up_proj, w3), down (E, C, I)
typedef struct {
    int N, C, I, E;
    float *x, *router, *gate_up, *down;
} Host;

// a token's K-th minus (K+1)-th router logit (in double; E <= 64); K = E: never a tie
static double topk_gap(const float *x, const float *router, int C, int E, int K) {
    double l[64], kth = INFINITY, next = -INFINITY;
    for (int e = 0; e < E; e++) {
        l[e] = 0;
        for (int c = 0; c < C; c++) l[e] += (double)x[c] * router[(size_t)e * C + c];
    }
    for (int j = 0; j <= K && j < E; j++) { // the j-th largest, by selection
        int best = -1;
        for (int e = 0; e < E; e++)
            if (l[e] > -INFINITY && (best < 0 || l[e] > l[best])) best = e;
        if (j == K - 1) kth = l[best];
        if (j == K) next = l[best];
        l[best] = -INFINITY;
    }
    return kth - next;
}

// random weights, and token rows redrawn until each token's top-K is MIN_GAP from a tie
static Host host_random(int N, int C, int I, int E, int K) {
    Host h = {N, C, I, E, NULL, NULL, NULL, NULL};
    h.router = random_host((size_t)E * C), h.x = xmalloc((size_t)N * C * sizeof(float));
    h.gate_up = random_host((size_t)E * 2 * I * C), h.down = random_host((size_t)E * C * I);
    for (int n = 0; n < N; n++) {
        float *row = h.x + (size_t)n * C;
        do {
            for (int c = 0; c < C; c++) row[c] = uniform();
        } while (topk_gap(row, h.router, C, E, K) < MIN_GAP);
    }
    return h;
}

static void host_free(Host *h) {
    free(h->x), free(h->router), free(h->gate_up), free(h->down);
}

// The layer on the device, with its gradients; L = sum(y * R) + aux_scale * aux
typedef struct {
    MoeSizes s;
    float *x, *router, *gate_up, *down, *y, *dy; // device
    float *dx, *drouter, *dgate_up, *ddown;      // device gradients
    ExpertWeights *experts, *dexperts;           // (E)
    MoeWeights w, dw;
    MoeActivations a;
    MoeGrads g;
    const float *R; // host (N, C)
    float aux_scale, aux;
} Layer;

// the experts' pointers into transformers' fused tensors: the mapping the model will use
static void point_experts(ExpertWeights *ex, float *gate_up, float *down, int C, int I, int E) {
    for (int e = 0; e < E; e++) {
        ex[e].gate_proj = gate_up + (size_t)e * 2 * I * C;
        ex[e].up_proj = ex[e].gate_proj + (size_t)I * C;
        ex[e].down_proj = down + (size_t)e * C * I;
    }
}

static Layer layer_new(const Host *h, int N, int K, double capacity_factor, const float *R,
                       float aux_scale) {
    int C = h->C, I = h->I, E = h->E;
    Layer l = {.s = moe_sizes(N, C, I, E, K, capacity_factor, 1), .R = R, .aux_scale = aux_scale};
    size_t nx = (size_t)N * C, nr = (size_t)E * C, ngu = (size_t)E * 2 * I * C;
    size_t nd = (size_t)E * C * I;
    l.x = to_device(h->x, nx * sizeof(float)), l.router = to_device(h->router, nr * sizeof(float));
    l.gate_up = to_device(h->gate_up, ngu * sizeof(float));
    l.down = to_device(h->down, nd * sizeof(float));
    l.y = device_zeros(nx), l.dy = to_device(R, nx * sizeof(float));
    l.dx = device_zeros(nx), l.drouter = device_zeros(nr);
    l.dgate_up = device_zeros(ngu), l.ddown = device_zeros(nd);
    l.experts = xmalloc(E * sizeof(ExpertWeights)), l.dexperts = xmalloc(E * sizeof(ExpertWeights));
    point_experts(l.experts, l.gate_up, l.down, C, I, E);
    point_experts(l.dexperts, l.dgate_up, l.ddown, C, I, E);
    l.w = (MoeWeights){l.router, l.experts}, l.dw = (MoeWeights){l.drouter, l.dexperts};
    moe_activations_alloc(&l.a, &l.s);
    moe_grads_alloc(&l.g, &l.s);
    return l;
}

static void layer_free(Layer *l) {
    device_free(l->x), device_free(l->router), device_free(l->gate_up), device_free(l->down);
    device_free(l->y), device_free(l->dy), device_free(l->dx), device_free(l->drouter);
    device_free(l->dgate_up), device_free(l->ddown);
    free(l->experts), free(l->dexperts);
    moe_activations_free(&l->a);
    moe_grads_free(&l->g);
}

static double layer_loss(void *p) {
    Layer *l = p;
    l->aux = moe_forward(l->y, &l->a, l->x, &l->w, &l->s, NULL, NULL);
    return dot_host(l->y, l->R, (size_t)l->s.N * l->s.C) + (double)l->aux_scale * l->aux;
}

// forward, then the gradients from zero
static void layer_grads(Layer *l) {
    const MoeSizes *s = &l->s;
    device_zero(l->dx, (size_t)s->N * s->C * sizeof(float));
    device_zero(l->drouter, (size_t)s->E * s->C * sizeof(float));
    device_zero(l->dgate_up, (size_t)s->E * 2 * s->I * s->C * sizeof(float));
    device_zero(l->ddown, (size_t)s->E * s->C * s->I * sizeof(float));
    layer_loss(l);
    moe_backward(l->dx, &l->dw, &l->g, l->dy, l->aux_scale, &l->a, l->x, &l->w, s, NULL);
}

// ---------------------------------------------------------------------------------------------
// a. the kernels against finite differences
typedef struct {
    int N, E, K;
    float *logits, *probs, *topk_w, *load;
    int *ids, *counts, *offsets, *pos;
    const float *Rw; // host (N, K)
    float aux_scale;
} Router;

static double router_loss(void *p) {
    Router *r = p;
    moe_router_forward(r->probs, r->ids, r->topk_w, r->logits, r->N, r->E, r->K);
    moe_dispatch(r->counts, r->offsets, r->pos, r->ids, r->N, r->E, r->K, 0);
    // aux = E * sum_e (counts[e] / N) * (sum_n probs[n, e] / N), from moe_load's halves
    moe_load(r->load, r->probs, r->counts, r->N, r->E);
    float *load = to_host(r->load, 2 * (size_t)r->E);
    double aux = 0.0;
    for (int e = 0; e < r->E; e++) aux += (double)load[e] * load[r->E + e];
    aux *= (double)r->E / ((double)r->N * r->N);
    free(load);
    return dot_host(r->topk_w, r->Rw, (size_t)r->N * r->K) + (double)r->aux_scale * aux;
}

// L = sum(topk_w * Rw) + aux_scale * aux, the router's two outputs that carry a gradient
static void test_router(int K, float rw_scale, float aux_scale, const char *what) {
    enum { N = 7, E = 4 };
    float logits[N * E], Rw[N * K];
    for (int n = 0; n < N; n++) { // each token's top-K MIN_GAP from a tie
        // topk_gap of x = (1) through a router (E, 1) that holds the logits
        float one = 1.0f;
        do {
            for (int e = 0; e < E; e++) logits[n * E + e] = 2.0f * uniform();
        } while (topk_gap(&one, &logits[n * E], 1, E, K) < MIN_GAP);
    }
    for (int i = 0; i < N * K; i++) Rw[i] = rw_scale * uniform();
    Router r = {.N = N, .E = E, .K = K, .Rw = Rw, .aux_scale = aux_scale};
    r.logits = to_device(logits, sizeof logits), r.probs = device_zeros(N * E);
    r.topk_w = device_zeros(N * K), r.load = device_zeros(2 * E);
    r.ids = device_malloc(N * K * sizeof(int)), r.pos = device_malloc(N * K * sizeof(int));
    r.counts = device_malloc(E * sizeof(int)), r.offsets = device_malloc((E + 1) * sizeof(int));
    float *dRw = to_device(Rw, sizeof Rw), *dlogits = device_zeros(N * E);
    router_loss(&r);
    moe_router_backward(dlogits, dRw, r.probs, r.ids, r.topk_w, r.load, aux_scale, N, N, E, K);
    check(what, fd_err(FD_EPS, router_loss, &r, r.logits, dlogits, N * E), FD_TOL);
    device_free(r.logits), device_free(r.probs), device_free(r.topk_w), device_free(r.load);
    device_free(r.ids), device_free(r.counts), device_free(r.offsets), device_free(r.pos);
    device_free(dRw), device_free(dlogits);
}

// exact ties go to the lower expert index, the chosen in order of prob, largest first
static void test_router_ties(void) {
    enum { N = 4, E = 4, K = 3 };
    const float logits[N * E] = {1, 1, 1, 0, 0, 2, 2, 2, 3, 3, 3, 3, 0, 5, 1, 5};
    const int want[N * K] = {0, 1, 2, 1, 2, 3, 0, 1, 2, 1, 3, 2};
    float *d_logits = to_device(logits, sizeof logits), *probs = device_zeros(N * E);
    float *w = device_zeros(N * K);
    int *ids = device_malloc(sizeof want), got[N * K];
    moe_router_forward(probs, ids, w, d_logits, N, E, K);
    device_to_host(got, ids, sizeof got);
    int wrong = 0;
    for (int i = 0; i < N * K; i++) wrong += got[i] != want[i];
    check("router: ties go to the lower index, largest first (ids wrong)", wrong, 0.0);
    device_free(d_logits), device_free(probs), device_free(w), device_free(ids);
}

// the shuffles, on the routing of random logits with a capacity that drops pairs
typedef struct {
    int N, C, K, kept;
    float *x, *x_sorted, *out_sorted, *topk_w, *y;
    const int *pos;
    const float *R, *Rs; // host (N, C) for y, (N*K, C) for x_sorted
} Shuffle;

static double gather_loss(void *p) {
    Shuffle *s = p;
    moe_gather_forward(s->x_sorted, s->x, s->pos, s->N, s->C, s->K);
    return dot_host(s->x_sorted, s->Rs, (size_t)s->kept * s->C); // the rows the experts read
}

static double combine_loss(void *p) {
    Shuffle *s = p;
    moe_combine_forward(s->y, s->out_sorted, s->topk_w, s->pos, s->N, s->C, s->K);
    return dot_host(s->y, s->R, (size_t)s->N * s->C);
}

static void test_shuffles(void) {
    enum { N = 9, C = 5, E = 4, K = 2, CAPACITY = 3 };
    float *logits = random_host(N * E);
    float *d_logits = to_device(logits, N * E * sizeof(float)), *probs = device_zeros(N * E);
    int *ids = device_malloc(N * K * sizeof(int)), *counts = device_malloc(E * sizeof(int));
    int *offsets = device_malloc((E + 1) * sizeof(int)), *pos = device_malloc(N * K * sizeof(int));
    Shuffle s = {.N = N, .C = C, .K = K, .pos = pos};
    s.topk_w = device_zeros(N * K);
    moe_router_forward(probs, ids, s.topk_w, d_logits, N, E, K);
    moe_dispatch(counts, offsets, pos, ids, N, E, K, CAPACITY);
    int off[E + 1];
    device_to_host(off, offsets, sizeof off);
    s.kept = off[E];
    float *R = random_host(N * C), *Rs = random_host(N * K * C);
    s.R = R, s.Rs = Rs;
    float *x = random_host(N * C), *outs = random_host(N * K * C), *w = random_host(N * K);
    s.x = to_device(x, N * C * sizeof(float)), s.x_sorted = device_zeros(N * K * C);
    s.out_sorted = to_device(outs, N * K * C * sizeof(float)), s.y = device_zeros(N * C);
    host_to_device(s.topk_w, w, N * K * sizeof(float)); // any weights: combine is linear in them
    float *d_R = to_device(R, N * C * sizeof(float)), *d_Rs = to_device(Rs, N * K * C * 4);
    float *dx = device_zeros(N * C), *dsorted = device_zeros(N * K * C), *dw = device_zeros(N * K);
    char what[96];
    snprintf(what, sizeof what, "gather dx vs FD (capacity %d drops %d of %d pairs)", CAPACITY,
             N * K - s.kept, N * K);
    moe_gather_backward(dx, d_Rs, pos, N, C, K);
    check(what, fd_err(FD_EPS, gather_loss, &s, s.x, dx, N * C), FD_TOL);
    moe_combine_backward(dsorted, dw, d_R, s.out_sorted, s.topk_w, pos, N, C, K);
    check("combine d out_sorted vs FD (dropped pairs' rows get none)",
          fd_err(FD_EPS, combine_loss, &s, s.out_sorted, dsorted, N * K * C), FD_TOL);
    check("combine d topk_w vs FD (dropped pairs' weights get 0)",
          fd_err(FD_EPS, combine_loss, &s, s.topk_w, dw, N * K), FD_TOL);
    free(logits), free(R), free(Rs), free(x), free(outs), free(w);
    device_free(d_logits), device_free(probs), device_free(ids), device_free(counts);
    device_free(offsets), device_free(pos), device_free(s.topk_w), device_free(s.x);
    device_free(s.x_sorted), device_free(s.out_sorted), device_free(s.y), device_free(d_R);
    device_free(d_Rs), device_free(dx), device_free(dsorted), device_free(dw);
}

// the whole layer: every gradient against finite differences, and twice = 2x
static void test_layer_fd(int K, double capacity_factor, float R_scale, float aux_scale,
                          const char *label) {
    enum { N = 10, C = 6, I = 5, E = 4 };
    Host h = host_random(N, C, I, E, K);
    float *R = random_host(N * C);
    for (int i = 0; i < N * C; i++) R[i] *= R_scale;
    Layer l = layer_new(&h, N, K, capacity_factor, R, aux_scale);
    layer_grads(&l);
    char what[128];
    printf("  %s: capacity %d, %d of %d pairs dropped, aux %.4f\n", label, l.s.capacity,
           l.a.dropped, N * K, l.aux);
    const struct {
        const char *name;
        float *x, *grad;
        size_t n;
    } t[] = {{"dx", l.x, l.dx, N * C},
             {"d router", l.router, l.drouter, E * C},
             {"d gate_up_proj (w1, w3)", l.gate_up, l.dgate_up, E * 2 * I * C},
             {"d down_proj (w2)", l.down, l.ddown, E * C * I}};
    int n_tensors = R_scale == 0 ? 2 : 4; // aux alone reaches only x and the router
    for (int i = 0; i < n_tensors; i++) {
        snprintf(what, sizeof what, "layer %s: %s vs FD", label, t[i].name);
        check(what, fd_err(FD_EPS, layer_loss, &l, t[i].x, t[i].grad, t[i].n), FD_TOL);
    }
    if (R_scale != 0) {
        float *once[4], *twice[4];
        for (int i = 0; i < 4; i++) once[i] = to_host(t[i].grad, t[i].n);
        moe_backward(l.dx, &l.dw, &l.g, l.dy, l.aux_scale, &l.a, l.x, &l.w, &l.s, NULL);
        double err = 0;
        for (int i = 0; i < 4; i++) {
            twice[i] = to_host(t[i].grad, t[i].n);
            for (size_t j = 0; j < t[i].n; j++) once[i][j] *= 2.0f;
            err = fmax(err, rel_to_max(twice[i], once[i], t[i].n));
            free(once[i]), free(twice[i]);
        }
        snprintf(what, sizeof what, "layer %s: backward twice = 2x (every gradient)", label);
        check(what, err, EXACT_TOL);
    }
    layer_free(&l);
    host_free(&h);
    free(R);
}

// ---------------------------------------------------------------------------------------------
// b. against transformers
#define SCRIPT "tests/reference/make_moe_fixture.py"
static const float *record(const Fixture *fx, const char *name, size_t count) {
    return fixture_values(fx, name, count, SCRIPT);
}

static Host host_from_fixture(const Fixture *fx, int *K) {
    const float *cfg = record(fx, "config", 6); // B, T, C, I, E, K
    Host h = {(int)cfg[0] * (int)cfg[1], (int)cfg[2], (int)cfg[3], (int)cfg[4], 0, 0, 0, 0};
    *K = (int)cfg[5];
    h.x = (float *)record(fx, "x", (size_t)h.N * h.C);
    h.router = (float *)record(fx, "weight.gate.weight", (size_t)h.E * h.C);
    h.gate_up = (float *)record(fx, "weight.experts.gate_up_proj", (size_t)h.E * 2 * h.I * h.C);
    h.down = (float *)record(fx, "weight.experts.down_proj", (size_t)h.E * h.C * h.I);
    return h;
}

static void compare(const char *what, const float *dev, const Fixture *fx, const char *name,
                    size_t n) {
    check_vs_fixture(what, dev, fx, name, n, SCRIPT, TORCH_TOL);
}

static void test_vs_torch(const Fixture *fx) {
    int K;
    Host h = host_from_fixture(fx, &K);
    int N = h.N, C = h.C, I = h.I, E = h.E;
    float coef = record(fx, "coef", 1)[0];
    printf("  fixture: N=%d C=%d I=%d E=%d K=%d, router_aux_loss_coef %g\n", N, C, I, E, K, coef);
    Layer l = layer_new(&h, N, K, 0.0, record(fx, "R", (size_t)N * C), coef);
    layer_grads(&l);
    compare("y", l.y, fx, "y", (size_t)N * C);
    float aux_want = record(fx, "aux", 1)[0];
    check("aux vs transformers' load_balancing_loss_func (relative)",
          fabs(l.aux - aux_want) / fabs(aux_want), TORCH_TOL);
    compare("dx", l.dx, fx, "grad.x", (size_t)N * C);
    compare("d router", l.drouter, fx, "grad.gate.weight", (size_t)E * C);
    compare("d gate_up_proj", l.dgate_up, fx, "grad.experts.gate_up_proj", (size_t)E * 2 * I * C);
    compare("d down_proj", l.ddown, fx, "grad.experts.down_proj", (size_t)E * C * I);
    layer_free(&l);
    // aux alone: dy = 0, aux_scale = 1
    float *zero = zeros((size_t)N * C);
    l = layer_new(&h, N, K, 0.0, zero, 1.0f);
    layer_grads(&l);
    compare("aux alone: dx", l.dx, fx, "grad_aux.x", (size_t)N * C);
    compare("aux alone: d router", l.drouter, fx, "grad_aux.gate.weight", (size_t)E * C);
    layer_free(&l);
    free(zero);
}

// ---------------------------------------------------------------------------------------------
// c. capacity: a reference in plain C and double that routes, counts and drops on its own.
// y (N, C); returns the (token, choice) pairs dropped.
static int reference_layer(double *y, const Host *h, int N, int K, int capacity) {
    int C = h->C, I = h->I, E = h->E, dropped = 0, taken[64] = {0};
    double g[256], u[256];
    memset(y, 0, (size_t)N * C * sizeof(double));
    for (int n = 0; n < N; n++) { // token order: the order in which experts fill up
        const float *x = h->x + (size_t)n * C;
        double p[64], chosen_p[64], sum = 0.0, chosen = 0.0;
        int chosen_e[64], used[64] = {0};
        for (int e = 0; e < E; e++) {
            p[e] = 0;
            for (int c = 0; c < C; c++) p[e] += (double)x[c] * h->router[(size_t)e * C + c];
        }
        double m = p[0];
        for (int e = 1; e < E; e++) m = fmax(m, p[e]);
        for (int e = 0; e < E; e++) p[e] = exp(p[e] - m), sum += p[e];
        for (int j = 0; j < K; j++) { // the K most probable, first of equals first
            int best = -1;
            for (int e = 0; e < E; e++)
                if (!used[e] && (best < 0 || p[e] > p[best])) best = e;
            used[best] = 1, chosen_e[j] = best, chosen_p[j] = p[best] / sum;
            chosen += chosen_p[j];
        }
        for (int j = 0; j < K; j++) {
            int e = chosen_e[j];
            if (capacity > 0 && taken[e] >= capacity) {
                dropped++;
                continue;
            }
            taken[e]++;
            const float *gu = h->gate_up + (size_t)e * 2 * I * C, *dn = h->down + (size_t)e * C * I;
            for (int i = 0; i < I; i++) {
                g[i] = u[i] = 0;
                for (int c = 0; c < C; c++)
                    g[i] += (double)gu[(size_t)i * C + c] * x[c],
                        u[i] += (double)gu[(size_t)(I + i) * C + c] * x[c];
                g[i] = g[i] / (1.0 + exp(-g[i])) * u[i]; // silu(gate) * up
            }
            for (int c = 0; c < C; c++) {
                double o = 0;
                for (int i = 0; i < I; i++) o += (double)dn[(size_t)c * I + i] * g[i];
                y[(size_t)n * C + c] += chosen_p[j] / chosen * o;
            }
        }
    }
    return dropped;
}

static void test_capacity(const Fixture *fx) {
    int K_fx;
    Host h = host_from_fixture(fx, &K_fx);
    const struct {
        int N, K;
        double factor;
        const char *why;
    } cases[] = {{h.N, K_fx, 0.0, "no capacity"},
                 {h.N, K_fx, 0.75, "capacity factor 0.75"},
                 {h.N, K_fx, 0.3, "capacity factor 0.3"},
                 {h.N, 1, 1.0, "K=1, capacity factor 1"},
                 {3, 1, 0.0, "K=1 on 3 tokens: an expert gets none"}};
    int C = h.C;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int N = cases[i].N, K = cases[i].K;
        // the capacity as the test computes it: GShard's ceil(factor * N * K / E)
        int capacity = cases[i].factor > 0 ? (int)ceil(cases[i].factor * N * K / h.E) : 0;
        double *want = xmalloc((size_t)N * C * sizeof(double));
        int dropped = reference_layer(want, &h, N, K, capacity);
        float *R = zeros((size_t)N * C), *want_f = zeros((size_t)N * C);
        for (size_t j = 0; j < (size_t)N * C; j++) want_f[j] = (float)want[j];
        Layer l = layer_new(&h, N, K, cases[i].factor, R, 0.0f);
        layer_loss(&l);
        char what[128];
        snprintf(what, sizeof what, "%s: capacity %d == %d, dropped %d == %d", cases[i].why,
                 l.s.capacity, capacity, l.a.dropped, dropped);
        check(what, l.s.capacity == capacity && l.a.dropped == dropped ? 0.0 : 1.0, 0.0);
        float *y = to_host(l.y, (size_t)N * C);
        snprintf(what, sizeof what, "%s: y vs plain-C reference (kept pairs)", cases[i].why);
        check(what, rel_to_max(y, want_f, (size_t)N * C), REF_TOL);
        if (i == 0) { // the reference itself against transformers
            check("plain-C reference y vs transformers",
                  rel_to_max(want_f, record(fx, "y", (size_t)N * C), (size_t)N * C), TORCH_TOL);
        }
        layer_free(&l);
        free(want), free(R), free(want_f), free(y);
    }
    // a factor stored a hair above its decimal value adds no slot: 0.1 * 30 = 3.0000000000000004
    MoeSizes s = moe_sizes(30, 4, 4, 1, 1, 0.1, 1);
    check("capacity factor 0.1 of 30 pairs on 1 expert: 3 slots", fabs(s.capacity - 3.0), 0.0);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s tests/fixtures/moe_mixtral.bin\n", argv[0]);
        return 2;
    }
    backend_init(0);
    rng_state = 42;
    printf("a. finite differences (FD_EPS %g)\n", FD_EPS);
    test_router(2, 1.0f, 0.5f, "router K=2: dlogits (top-k weights + 0.5 aux) vs FD");
    test_router(1, 1.0f, 0.5f, "router K=1: dlogits (top-k weights + 0.5 aux) vs FD");
    test_router(2, 0.0f, 1.0f, "router K=2: dlogits (aux alone) vs FD");
    test_router_ties();
    test_shuffles();
    test_layer_fd(2, 0.0, 1.0f, 0.5f, "K=2");
    test_layer_fd(1, 0.0, 1.0f, 0.5f, "K=1");
    test_layer_fd(2, 0.5, 1.0f, 0.5f, "K=2 capacity 0.5");
    test_layer_fd(2, 0.0, 0.0f, 1.0f, "K=2 aux alone");
    Fixture *fx = xmalloc(sizeof(Fixture));
    fixture_load(fx, argv[1]);
    printf("b. against transformers' MixtralSparseMoeBlock (%s)\n", argv[1]);
    test_vs_torch(fx);
    printf("c. capacity against a plain-C reference\n");
    test_capacity(fx);
    fixture_free(fx);
    free(fx);
    printf("%s: %d check(s) failed\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
