// One Mamba mixer (mamba.c over backend/*/mamba.*) is transformers' MambaMixer:
//   a. the backward of each sequence kernel (the causal conv1d with its SiLU, and the selective
//      scan: d u, d dt, d B, d C, d dt_bias, d A_log, d D) equals central finite differences of
//      L = sum(out * R) over every element, on shapes whose channels span two of the scan's
//      channel groups (one partly filled), with and without the conv bias; the scan's backward
//      gives the same bits on 1 and 3 threads (its channel groups are summed in a fixed order);
//   b. the mixer equals transformers' MambaMixer slow path (tests/fixtures/mamba_block.bin, from
//      tests/reference/make_mamba_fixture.py): y and the gradients of sum(y * R) for x and every
//      weight, within TORCH_TOL of each tensor's largest value; a backward run twice gives twice
//      the weight gradients (they accumulate);
//   c. the comparison can fail: A_log moved by 5e-2, or D left out, moves y by more than
//      10 * TORCH_TOL;
//   d. the scan of a sequence cut in two chunks (context parallelism: mamba_context_parallel.c),
//      the second from the state the first hands over, is the scan of the whole: y, and every
//      gradient with the second chunk's gradient of its first state handed back to the first;
//      and a chunk's last state from h_in is its last state from zero + its decay product * h_in.
// Every tensor goes through device memory, so the program runs on either build.
// usage: test_mamba tests/fixtures/mamba_block.bin
#include <math.h>
#include <stdio.h>
#include <omp.h>
#include <string.h>
#include "backend/backend.h"
#include "mamba.h"
#include "utils.h"
#include "tests/layer_check.h"

// Finite differences as tests/test_moe.c takes them: the forward runs in float, so L (a sum of
// ~300 products of size ~1) carries rounding noise of ~1e-7 * sum|out * R|, a few 1e-5 of a unit
// gradient over a step of 2 * FD_EPS; the central difference's truncation error is
// ~FD_EPS^2 / 6 * L''' ~ 1e-5. Measured: 3.6e-5 at worst (d A_log); FD_TOL leaves a margin of 8,
// where a wrong term is off by 1e-1 or more.
#define FD_EPS    1e-2f
#define FD_TOL    3e-4
#define EXACT_TOL 1e-6 // float rounding of the same sums in another order
// fp32 on both sides, the same formulas in another order (torch sums C . h with a matmul, the
// conv with its own loop, and the exp of the decay here is fast_exp.h's, within 1.02 ulp):
// measured at most 4.8e-7 of each tensor's largest value (d dt_proj.weight); 1e-5 leaves a margin
// of 20, and the smallest change of c. (every A_log moved by 5e-2, A 5% larger) moves y by 8e-4
#define TORCH_TOL 1e-5
#define WRONG_MIN (10 * TORCH_TOL) // what a deliberately wrong mixer must at least be off by

static void check_at_least(const char *what, double off, double min) {
    int ok = off >= min;
    printf("  %-4s %-62s %.2e (min %.0e)\n", ok ? "ok" : "FAIL", what, off, min);
    if (!ok) failures++;
}

static float *random_device(size_t n, float scale, float offset) {
    float *h = random_host(n);
    for (size_t i = 0; i < n; i++) h[i] = offset + scale * h[i];
    float *d = to_device(h, n * sizeof(float));
    free(h);
    return d;
}

// ---------------------------------------------------------------------------------------------
// a. the kernels against finite differences
enum { KB = 2, KT = 7, KI = 20, KS = 3, KW = 4 }; // KI = 20: channel groups of 16 and of 4

typedef struct {
    float *x, *weight, *bias, *out, *pre;
    const float *R; // host (B, T, I)
} Conv;

static double conv_loss(void *p) {
    Conv *c = p;
    causal_conv1d_forward(c->out, c->pre, c->x, c->weight, c->bias, KB, KT, KI, KW);
    return dot_host(c->out, c->R, (size_t)KB * KT * KI);
}

static void test_conv_fd(int with_bias) {
    size_t n = (size_t)KB * KT * KI;
    float *R = random_host(n);
    Conv c = {.x = random_device(n, 1.0f, 0.0f),
              .weight = random_device(KI * KW, 1.0f, 0.0f),
              .bias = with_bias ? random_device(KI, 0.5f, 0.0f) : NULL,
              .R = R};
    c.out = device_zeros(n), c.pre = device_zeros(n);
    float *dout = to_device(R, n * sizeof(float)), *dx = device_zeros(n);
    float *dweight = device_zeros(KI * KW), *dbias = device_zeros(KI);
    conv_loss(&c);
    causal_conv1d_backward(dx, dweight, with_bias ? dbias : NULL, dout, c.x, c.pre, c.weight, KB,
                           KT, KI, KW);
    const char *label = with_bias ? "with bias" : "no bias";
    char what[96];
    snprintf(what, sizeof what, "conv1d+silu (%s): dx vs FD", label);
    check(what, fd_err(FD_EPS, conv_loss, &c, c.x, dx, n), FD_TOL);
    snprintf(what, sizeof what, "conv1d+silu (%s): d weight vs FD", label);
    check(what, fd_err(FD_EPS, conv_loss, &c, c.weight, dweight, KI * KW), FD_TOL);
    if (with_bias) {
        check("conv1d+silu (with bias): d bias vs FD",
              fd_err(FD_EPS, conv_loss, &c, c.bias, dbias, KI), FD_TOL);
        device_free(c.bias);
    }
    device_free(c.x), device_free(c.weight), device_free(c.out), device_free(c.pre);
    device_free(dout), device_free(dx), device_free(dweight), device_free(dbias);
    free(R);
}

typedef struct {
    float *y, *u, *dt, *dt_bias, *A_log, *Bm, *Cm, *D;
    const float *R; // host (B, T, I)
} Scan;

static double scan_loss(void *p) {
    Scan *s = p;
    selective_scan_forward(s->y, s->u, s->dt, s->dt_bias, s->A_log, s->Bm, s->Cm, s->D, KB, KT, KI,
                           KS);
    return dot_host(s->y, s->R, (size_t)KB * KT * KI);
}

static void test_scan_fd(void) {
    size_t n = (size_t)KB * KT * KI, nS = (size_t)KB * KT * KS;
    float *R = random_host(n);
    // A_log near log(1), log(2), ...: decays exp(delta * A) from ~0.9 to ~0.3 over the states
    float *A_log = random_host(KI * KS);
    for (int i = 0; i < KI * KS; i++) A_log[i] = logf(1.0f + i % KS) + 0.3f * A_log[i];
    Scan s = {.u = random_device(n, 1.0f, 0.0f),
              .dt = random_device(n, 1.0f, -0.5f),
              .dt_bias = random_device(KI, 0.5f, 0.0f),
              .A_log = to_device(A_log, KI * KS * sizeof(float)),
              .Bm = random_device(nS, 1.0f, 0.0f),
              .Cm = random_device(nS, 1.0f, 0.0f),
              .D = random_device(KI, 0.3f, 1.0f),
              .R = R};
    s.y = device_zeros(n);
    float *dy = to_device(R, n * sizeof(float)), *du = device_zeros(n), *ddt = device_zeros(n);
    float *dB = device_zeros(nS), *dC = device_zeros(nS), *ddt_bias = device_zeros(KI);
    float *dA_log = device_zeros(KI * KS), *dD = device_zeros(KI);
    scan_loss(&s);
    selective_scan_backward(du, ddt, dB, dC, ddt_bias, dA_log, dD, dy, s.u, s.dt, s.dt_bias,
                            s.A_log, s.Bm, s.Cm, s.D, KB, KT, KI, KS);
    struct {
        const char *name;
        float *x, *grad;
        size_t n;
    } t[] = {{"du", s.u, du, n},
             {"d dt (through the softplus)", s.dt, ddt, n},
             {"d B (summed over channels)", s.Bm, dB, nS},
             {"d C (summed over channels)", s.Cm, dC, nS},
             {"d dt_bias", s.dt_bias, ddt_bias, KI},
             {"d A_log", s.A_log, dA_log, KI * KS},
             {"d D", s.D, dD, KI}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        char what[96];
        snprintf(what, sizeof what, "selective scan: %s vs FD", t[i].name);
        check(what, fd_err(FD_EPS, scan_loss, &s, t[i].x, t[i].grad, t[i].n), FD_TOL);
    }
    // 1 thread and 3: the same bits in every gradient (weights accumulate: zero them first)
    double differ = 0;
    float *one[7];
    for (int threads = 1; threads <= 3; threads += 2) {
        omp_set_num_threads(threads);
        for (int i = 4; i < 7; i++) device_zero(t[i].grad, t[i].n * sizeof(float));
        selective_scan_backward(du, ddt, dB, dC, ddt_bias, dA_log, dD, dy, s.u, s.dt, s.dt_bias,
                                s.A_log, s.Bm, s.Cm, s.D, KB, KT, KI, KS);
        for (int i = 0; i < 7; i++) {
            float *h = to_host(t[i].grad, t[i].n);
            if (threads == 1)
                one[i] = h;
            else {
                differ += memcmp(h, one[i], t[i].n * sizeof(float)) != 0;
                free(h), free(one[i]);
            }
        }
    }
    omp_set_num_threads(1);
    check("selective scan backward: gradients that differ, 1 vs 3 threads", differ, 0.0);
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) device_free(t[i].x), device_free(t[i].grad);
    device_free(s.y), device_free(dy);
    free(R), free(A_log);
}

// ---------------------------------------------------------------------------------------------
// d. the scan in chunks: rows [t0, t0 + n) of each sequence of a host (B, KT, w) tensor, on the
// device as (B, n, w)
static float *rows_to_device(const float *h, int t0, int n, int w) {
    float *part = xmalloc((size_t)KB * n * w * sizeof(float));
    for (int b = 0; b < KB; b++)
        memcpy(part + (size_t)b * n * w, h + ((size_t)b * KT + t0) * w,
               (size_t)n * w * sizeof(float));
    float *d = to_device(part, (size_t)KB * n * w * sizeof(float));
    free(part);
    return d;
}

// max |whole's rows [t0, t0+n) - part| / max |whole| for (B, KT, w) and (B, n, w) device tensors
static double rows_err(const float *whole, const float *part, int t0, int n, int w) {
    float *hw = to_host(whole, (size_t)KB * KT * w), *hp = to_host(part, (size_t)KB * n * w);
    float *sub = xmalloc((size_t)KB * n * w * sizeof(float));
    for (int b = 0; b < KB; b++)
        memcpy(sub + (size_t)b * n * w, hw + ((size_t)b * KT + t0) * w,
               (size_t)n * w * sizeof(float));
    double err = rel_to_max(hp, sub, (size_t)KB * n * w);
    free(hw), free(hp), free(sub);
    return err;
}

static double device_err(const float *a, const float *b, size_t n) {
    float *ha = to_host(a, n), *hb = to_host(b, n);
    double err = rel_to_max(ha, hb, n);
    free(ha), free(hb);
    return err;
}

static void test_scan_chunks(void) {
    enum { T1 = 3, T2 = KT - T1, NIN = 5, NOUT = 8 };
    size_t n = (size_t)KB * KT * KI, nS = (size_t)KB * KT * KS, st = (size_t)KB * KI * KS;
    float *host[NIN] = {random_host(n), random_host(n), random_host(nS), random_host(nS),
                        random_host(n)}; // u, dt, B, C, dy
    for (size_t i = 0; i < n; i++) host[1][i] -= 0.5f;
    float *A_log = random_host(KI * KS);
    for (int i = 0; i < KI * KS; i++) A_log[i] = logf(1.0f + i % KS) + 0.3f * A_log[i];
    float *dt_bias = random_device(KI, 0.5f, 0.0f), *D = random_device(KI, 0.3f, 1.0f);
    float *A = to_device(A_log, KI * KS * sizeof(float));
    // [0]: the whole sequence, [1], [2]: its chunks of T1 and T2 tokens. in: u dt B C dy; out: y,
    // du, ddt, dB, dC, d dt_bias, d A_log, d D (the chunks share the last three: they add up)
    int width[NIN] = {KI, KI, KS, KS, KI}, t0[3] = {0, 0, T1}, len[3] = {KT, T1, T2};
    int out_width[5] = {KI, KI, KI, KS, KS};
    float *in[3][NIN], *out[3][NOUT];
    for (int c = 0; c < 3; c++) {
        for (int k = 0; k < NIN; k++) in[c][k] = rows_to_device(host[k], t0[c], len[c], width[k]);
        for (int k = 0; k < 5; k++) out[c][k] = device_zeros((size_t)KB * len[c] * out_width[k]);
        if (c < 2) // the chunks' parameter gradients: one set, as the whole's
            out[c][5] = device_zeros(KI), out[c][6] = device_zeros(KI * KS),
            out[c][7] = device_zeros(KI);
        else
            for (int k = 5; k < NOUT; k++) out[2][k] = out[1][k];
    }
    float *h1 = device_zeros(st), *h2 = device_zeros(st), *h2_zero = device_zeros(st);
    float *decay2 = device_zeros(st), *G = device_zeros(st), *y_zero = device_zeros(n);
#define SCAN_ARGS(c) in[c][0], in[c][1], dt_bias, A, in[c][2], in[c][3], D, KB, len[c], KI, KS
#define BACK_ARGS(c)                                                                               \
    out[c][1], out[c][2], out[c][3], out[c][4], out[c][5], out[c][6], out[c][7], in[c][4],         \
        in[c][0], in[c][1], dt_bias, A, in[c][2], in[c][3], D, KB, len[c], KI, KS
    selective_scan_forward(out[0][0], SCAN_ARGS(0));
    selective_scan_chunk_forward(out[1][0], SCAN_ARGS(1), NULL, h1, NULL);
    selective_scan_chunk_forward(out[2][0], SCAN_ARGS(2), h1, h2, NULL);
    selective_scan_chunk_forward(y_zero, SCAN_ARGS(2), NULL, h2_zero, decay2);
    selective_scan_backward(BACK_ARGS(0));
    // the second chunk first: the gradient its tokens send to its first state, then the first
    // chunk with that gradient arriving at its last state
    selective_scan_chunk_backward(BACK_ARGS(2), h1, NULL, G);
    selective_scan_chunk_backward(BACK_ARGS(1), NULL, G, NULL);
#undef SCAN_ARGS
#undef BACK_ARGS
    const char *names[5] = {"y", "du", "d dt", "d B", "d C"};
    double worst = 0.0;
    for (int k = 0; k < 5; k++) {
        double e1 = rows_err(out[0][k], out[1][k], 0, T1, out_width[k]);
        double e2 = rows_err(out[0][k], out[2][k], T1, T2, out_width[k]);
        char what[96];
        snprintf(what, sizeof what, "chunked scan (%d + %d tokens): %s equals the whole's", T1, T2,
                 names[k]);
        check(what, e1 > e2 ? e1 : e2, EXACT_TOL);
    }
    for (int k = 5; k < NOUT; k++) {
        double e = device_err(out[1][k], out[0][k], k == 6 ? (size_t)KI * KS : KI);
        if (!(e <= worst)) worst = e;
    }
    check("chunked scan: d dt_bias, d A_log, d D (the chunks' sums) equal the whole's", worst,
          EXACT_TOL);
    // h_last from h1 = h_last from zero + decay * h1, the linearity context parallelism rests on
    float *a = to_host(h2, st), *z = to_host(h2_zero, st), *P = to_host(decay2, st);
    float *h = to_host(h1, st);
    for (size_t e = 0; e < st; e++) z[e] += P[e] * h[e];
    check("a chunk's last state = its last state from zero + its decay * the state handed in",
          rel_to_max(z, a, st), EXACT_TOL);
    free(a), free(z), free(P), free(h), free(A_log);
    for (int k = 0; k < NIN; k++) free(host[k]);
    for (int c = 0; c < 3; c++)
        for (int k = 0; k < NIN + (c < 2 ? NOUT : 5); k++)
            device_free(k < NIN ? in[c][k] : out[c][k - NIN]);
    float *rest[] = {dt_bias, D, A, h1, h2, h2_zero, decay2, G, y_zero};
    for (size_t k = 0; k < sizeof rest / sizeof rest[0]; k++) device_free(rest[k]);
}

// ---------------------------------------------------------------------------------------------
// b. the mixer against transformers
#define WEIGHTS mamba_tensor_names
enum { NW = MAMBA_TENSORS };

#define SCRIPT "tests/reference/make_mamba_fixture.py"
static const float *record(const Fixture *fx, const char *name, size_t count) {
    return fixture_values(fx, name, count, SCRIPT);
}

// The mixer on the device: its weights and their gradients, each in WEIGHTS' order
typedef struct {
    MambaSizes s;
    float *x, *y, *dy, *dx;
    float *p[NW], *dp[NW];
    size_t n[NW];
    MambaWeights w, dw;
    MambaActivations a;
    MambaGrads g;
} Mixer;

static Mixer mixer_from_fixture(const Fixture *fx) {
    const float *cfg = record(fx, "config", 8); // B, T, C, I, S, R, W, use_conv_bias
    Mixer m = {.s = mamba_sizes(cfg[0], cfg[1], cfg[2], cfg[3], cfg[4], cfg[5], cfg[6])};
    if (cfg[7] != 1.0f) FAIL("the fixture's mixer has a conv bias", "use_conv_bias %g", cfg[7]);
    size_t sizes[NW];
    mamba_tensor_sizes(sizes, &m.s);
    for (int i = 0; i < NW; i++) {
        char name[64];
        snprintf(name, sizeof name, "weight.%s", WEIGHTS[i]);
        m.n[i] = sizes[i];
        m.p[i] = to_device(record(fx, name, sizes[i]), sizes[i] * sizeof(float));
        m.dp[i] = device_zeros(sizes[i]);
    }
    size_t nx = (size_t)m.s.N * m.s.C;
    m.x = to_device(record(fx, "x", nx), nx * sizeof(float));
    m.dy = to_device(record(fx, "R", nx), nx * sizeof(float));
    m.y = device_zeros(nx), m.dx = device_zeros(nx);
    m.w = mamba_weights_point(m.p), m.dw = mamba_weights_point(m.dp);
    mamba_activations_alloc(&m.a, &m.s);
    mamba_grads_alloc(&m.g, &m.s);
    return m;
}

static void mixer_free(Mixer *m) {
    for (int i = 0; i < NW; i++) device_free(m->p[i]), device_free(m->dp[i]);
    device_free(m->x), device_free(m->y), device_free(m->dy), device_free(m->dx);
    mamba_activations_free(&m->a);
    mamba_grads_free(&m->g);
}

static void compare(const char *what, const float *dev, const Fixture *fx, const char *name,
                    size_t n) {
    check_vs_fixture(what, dev, fx, name, n, SCRIPT, TORCH_TOL);
}

static void test_vs_torch(const Fixture *fx) {
    Mixer m = mixer_from_fixture(fx);
    const MambaSizes *s = &m.s;
    size_t nx = (size_t)s->N * s->C;
    printf("  fixture: B=%d T=%d C=%d I=%d S=%d R=%d W=%d, conv bias\n", s->B, s->T, s->C, s->I,
           s->S, s->R, s->W);
    mamba_forward(m.y, &m.a, m.x, &m.w, s);
    mamba_backward(m.dx, &m.dw, &m.g, m.dy, &m.a, m.x, &m.w, s);
    compare("y", m.y, fx, "y", nx);
    compare("dx", m.dx, fx, "grad.x", nx);
    for (int i = 0; i < NW; i++) {
        char what[64], name[64];
        snprintf(what, sizeof what, "d %s", WEIGHTS[i]);
        snprintf(name, sizeof name, "grad.%s", WEIGHTS[i]);
        compare(what, m.dp[i], fx, name, m.n[i]);
    }
    // the weight gradients accumulate: a second backward doubles them
    float *once[NW];
    for (int i = 0; i < NW; i++) once[i] = to_host(m.dp[i], m.n[i]);
    mamba_backward(m.dx, &m.dw, &m.g, m.dy, &m.a, m.x, &m.w, s);
    double err = 0;
    for (int i = 0; i < NW; i++) {
        float *twice = to_host(m.dp[i], m.n[i]);
        for (size_t j = 0; j < m.n[i]; j++) once[i][j] *= 2.0f;
        err = fmax(err, rel_to_max(twice, once[i], m.n[i]));
        free(once[i]), free(twice);
    }
    check("backward twice = 2x (every weight gradient)", err, EXACT_TOL);
    mixer_free(&m);
}

// ---------------------------------------------------------------------------------------------
// c. a wrong mixer fails the comparison: y's distance from transformers' must exceed WRONG_MIN
static void test_wrong(const Fixture *fx) {
    Mixer m = mixer_from_fixture(fx);
    size_t nx = (size_t)m.s.N * m.s.C, nA = (size_t)m.s.I * m.s.S;
    float *A_log = to_host(m.w.A_log, nA), *y;
    for (size_t i = 0; i < nA; i++) A_log[i] += 5e-2f;
    host_to_device(m.w.A_log, A_log, nA * sizeof(float));
    mamba_forward(m.y, &m.a, m.x, &m.w, &m.s);
    y = to_host(m.y, nx);
    check_at_least("every A_log + 5e-2: y off transformers' by",
                   rel_to_max(y, record(fx, "y", nx), nx), WRONG_MIN);
    free(y);
    host_to_device(m.w.A_log, record(fx, "weight.A_log", nA), nA * sizeof(float));
    device_zero(m.w.D, (size_t)m.s.I * sizeof(float));
    mamba_forward(m.y, &m.a, m.x, &m.w, &m.s);
    y = to_host(m.y, nx);
    check_at_least("D = 0 (no skip connection): y off transformers' by",
                   rel_to_max(y, record(fx, "y", nx), nx), WRONG_MIN);
    free(y), free(A_log);
    mixer_free(&m);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s tests/fixtures/mamba_block.bin\n", argv[0]);
        return 2;
    }
    backend_init(0);
    rng_state = 42;
    printf("a. finite differences (FD_EPS %g)\n", FD_EPS);
    test_conv_fd(1);
    test_conv_fd(0);
    test_scan_fd();
    Fixture *fx = xmalloc(sizeof(Fixture));
    fixture_load(fx, argv[1]);
    printf("b. against transformers' MambaMixer (%s)\n", argv[1]);
    test_vs_torch(fx);
    printf("c. the comparison can fail\n");
    test_wrong(fx);
    printf("d. the scan in chunks, a state handed over\n");
    test_scan_chunks();
    fixture_free(fx);
    free(fx);
    printf("%s: %d check(s) failed\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
