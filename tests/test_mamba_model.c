// transformers' MambaForCausalLM on one rank, composed from the Mamba mixer (mamba.c) and the
// kernels the Llama already uses, equals transformers (tests/fixtures/mamba_tiny.bin, from
// tests/reference/make_mamba_fixture.py): logits, the mean cross-entropy and the gradient of
// every parameter. It rehearses the model's integration (issue 30's next part) before model.c
// holds it: the layer is h = h + mixer(rmsnorm(h)) (MambaBlock), then norm_f and lm_head; a
// MambaRMSNorm is rmsnorm_forward (eps layer_norm_epsilon).
// usage: test_mamba_model tests/fixtures/mamba_tiny.bin
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "backend/backend.h"
#include "mamba.h"
#include "utils.h"
#include "tests/layer_check.h"

// fp32 on both sides, the same formulas in another order: measured 1.1e-7 on the loss, 2.4e-7 on
// the logits and 7.7e-7 at worst on a gradient (layer 1's A_log), each relative to its tensor's
// largest value; 1e-5 leaves a margin of 13 over the worst
#define LOSS_TOL   1e-5
#define LOGITS_TOL 1e-5
#define GRAD_TOL   1e-5
#define SCRIPT     "tests/reference/make_mamba_fixture.py"

enum { NM = MAMBA_TENSORS, MAX_LAYERS = 8 };

// one tensor of the model, its values and its gradient on the device
typedef struct {
    char name[96];
    size_t n;
    float *p, *g;
} Param;

typedef struct {
    int C, I, S, R, W, L, V, B, T, N;
    float eps;
    Param embed, norm[MAX_LAYERS], mixer[MAX_LAYERS][NM], norm_f, lm_head;
    MambaSizes s;
    MambaWeights w[MAX_LAYERS], dw[MAX_LAYERS];
} Model;

static void param(Param *p, const Fixture *fx, const char *name, size_t n) {
    char key[128];
    snprintf(p->name, sizeof p->name, "%s", name);
    snprintf(key, sizeof key, "weight.%s", name);
    p->n = n;
    p->p = to_device(fixture_values(fx, key, n, SCRIPT), n * sizeof(float));
    p->g = device_zeros(n);
}

static MambaWeights point(const Param *m, int grad) {
    float *t[NM];
    for (int i = 0; i < NM; i++) t[i] = grad ? m[i].g : m[i].p;
    return mamba_weights_point(t);
}

static void model_load(Model *m, const Fixture *fx) {
    const float *cfg = fixture_values(fx, "config", 10, SCRIPT); // C I S R W L V tied B T
    m->C = cfg[0], m->I = cfg[1], m->S = cfg[2], m->R = cfg[3], m->W = cfg[4], m->L = cfg[5];
    m->V = cfg[6], m->B = cfg[8], m->T = cfg[9], m->N = m->B * m->T;
    m->eps = fixture_values(fx, "config.layer_norm_epsilon", 1, SCRIPT)[0];
    if (cfg[7] != 0.0f || m->L > MAX_LAYERS)
        FAIL("the fixture is untied with at most MAX_LAYERS layers", "tied %g, %d layers", cfg[7],
             m->L);
    int C = m->C;
    m->s = mamba_sizes(m->B, m->T, C, m->I, m->S, m->R, m->W);
    size_t sizes[NM];
    mamba_tensor_sizes(sizes, &m->s);
    char name[96];
    param(&m->embed, fx, "backbone.embeddings.weight", (size_t)m->V * C);
    for (int l = 0; l < m->L; l++) {
        snprintf(name, sizeof name, "backbone.layers.%d.norm.weight", l);
        param(&m->norm[l], fx, name, C);
        for (int i = 0; i < NM; i++) {
            snprintf(name, sizeof name, "backbone.layers.%d.mixer.%s", l, mamba_tensor_names[i]);
            param(&m->mixer[l][i], fx, name, sizes[i]);
        }
        m->w[l] = point(m->mixer[l], 0), m->dw[l] = point(m->mixer[l], 1);
    }
    param(&m->norm_f, fx, "backbone.norm_f.weight", C);
    param(&m->lm_head, fx, "lm_head.weight", (size_t)m->V * C);
}

static int *tokens_to_device(const Fixture *fx, const char *name, size_t n) {
    const float *f = fixture_values(fx, name, n, SCRIPT);
    int *h = xmalloc(n * sizeof(int));
    for (size_t i = 0; i < n; i++) h[i] = (int)f[i];
    int *d = to_device(h, n * sizeof(int));
    free(h);
    return d;
}

static void compare_param(const Param *p, const Fixture *fx, double *worst, char *where) {
    char key[128];
    snprintf(key, sizeof key, "grad.%s", p->name);
    float *got = to_host(p->g, p->n);
    double err = rel_to_max(got, fixture_values(fx, key, p->n, SCRIPT), p->n);
    if (!(err <= *worst)) *worst = err, snprintf(where, 96, "%s", p->name); // a NaN is worst
    free(got);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s tests/fixtures/mamba_tiny.bin\n", argv[0]);
        return 2;
    }
    backend_init(0);
    Fixture *fx = xmalloc(sizeof(Fixture));
    fixture_load(fx, argv[1]);
    Model m;
    model_load(&m, fx);
    int N = m.N, C = m.C, V = m.V, L = m.L;
    size_t NC = (size_t)N * C;
    printf("d. MambaForCausalLM (%s): C=%d I=%d S=%d R=%d W=%d, %d layers, V=%d, B=%d T=%d\n",
           argv[1], C, m.I, m.S, m.R, m.W, L, V, m.B, m.T);
    int *inputs = tokens_to_device(fx, "inputs", N), *targets = tokens_to_device(fx, "targets", N);

    // forward: h_0 = embeddings; h_{l+1} = h_l + mixer_l(rmsnorm(h_l)); logits = lm_head(norm_f)
    float *h[MAX_LAYERS + 1], *ln[MAX_LAYERS], *rstd[MAX_LAYERS];
    MambaActivations a[MAX_LAYERS];
    MambaGrads g;
    mamba_grads_alloc(&g, &m.s);
    for (int l = 0; l <= L; l++) h[l] = device_zeros(NC);
    embedding_forward(h[0], inputs, m.embed.p, N, C, 0, V);
    for (int l = 0; l < L; l++) {
        ln[l] = device_zeros(NC), rstd[l] = device_zeros(N);
        mamba_activations_alloc(&a[l], &m.s);
        rmsnorm_forward(ln[l], rstd[l], h[l], m.norm[l].p, N, C, m.eps);
        mamba_forward(h[l + 1], &a[l], ln[l], &m.w[l], &m.s);
        add_inplace(h[l + 1], h[l], NC);
    }
    float *hf = device_zeros(NC), *rstd_f = device_zeros(N), *logits = device_zeros((size_t)N * V);
    rmsnorm_forward(hf, rstd_f, h[L], m.norm_f.p, N, C, m.eps);
    matmul_forward(logits, hf, m.lm_head.p, N, C, V);
    float *stats = device_zeros(5 * (size_t)N), *loss_sum = device_zeros(1), loss;
    float *maxes = stats, *sumexp = stats + N, *target_logit = stats + 2 * N,
          *losses = stats + 3 * N;
    cross_entropy_stats(maxes, sumexp, target_logit, logits, targets, N, V, 0);
    cross_entropy_loss(losses, maxes, sumexp, target_logit, N);
    sum_reduce(loss_sum, losses, N);
    device_to_host(&loss, loss_sum, sizeof loss);
    loss /= N;

    // backward, the forward's lines in reverse
    float *dlogits = device_zeros((size_t)N * V), *dhf = device_zeros(NC), *dh = device_zeros(NC);
    float *dln = device_zeros(NC);
    // forward: loss = mean cross-entropy of logits
    cross_entropy_backward(dlogits, logits, maxes, sumexp, targets, 1.0f / N, N, V, 0);
    // forward: logits = hf @ lm_head^T
    matmul_backward_write(dhf, m.lm_head.g, dlogits, hf, m.lm_head.p, N, C, V);
    // forward: hf = rmsnorm(h_L, norm_f)
    rmsnorm_backward(dh, m.norm_f.g, dhf, h[L], m.norm_f.p, rstd_f, N, C);
    for (int l = L - 1; l >= 0; l--) {
        // forward: h_{l+1} = h_l + mixer_l(ln_l), ln_l = rmsnorm(h_l): dh carries d h_{l+1},
        // which is also the residual's part of d h_l
        device_zero(dln, NC * sizeof(float));
        mamba_backward(dln, &m.dw[l], &g, dh, &a[l], ln[l], &m.w[l], &m.s);
        rmsnorm_backward(dh, m.norm[l].g, dln, h[l], m.norm[l].p, rstd[l], N, C);
    }
    // forward: h_0 = embeddings[inputs]
    embedding_backward(m.embed.g, dh, inputs, N, C, 0, V);

    float want = fixture_values(fx, "loss", 1, SCRIPT)[0];
    printf("  loss %.6f, transformers %.6f\n", loss, want);
    check("loss vs transformers (relative)", fabs(loss - want) / fabs(want), LOSS_TOL);
    check_vs_fixture("logits", logits, fx, "logits", (size_t)N * V, SCRIPT, LOGITS_TOL);
    double worst = 0.0;
    char where[96] = "";
    int n_params = 0;
    compare_param(&m.embed, fx, &worst, where), n_params++;
    for (int l = 0; l < L; l++) {
        compare_param(&m.norm[l], fx, &worst, where), n_params++;
        for (int i = 0; i < NM; i++) compare_param(&m.mixer[l][i], fx, &worst, where), n_params++;
    }
    compare_param(&m.norm_f, fx, &worst, where), n_params++;
    compare_param(&m.lm_head, fx, &worst, where), n_params++;
    char what[128];
    snprintf(what, sizeof what, "every gradient (%d tensors), worst %s", n_params, where);
    check(what, worst, GRAD_TOL);
    printf("%s: %d check(s) failed\n", failures ? "FAIL" : "PASS", failures);
    fixture_free(fx);
    free(fx);
    return failures ? 1 : 0;
}
