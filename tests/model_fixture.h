// The tiny Llama of a reference fixture (tests/reference/make_fixture.py) on one rank: its
// config, weights and batch, one forward and backward, and the AdamW loss curve. Shared by the
// tests that hold the C model to Hugging Face's: tests/test_model_vs_torch.c (fp32) and
// tests/gpu/test_model_bf16.c (bf16 products).
// Header-only, for test programs: every function is static.
#pragma once
#include <math.h>
#include <string.h>
#include <mpi.h>
#include "backend/backend.h"
#include "config.h"
#include "model.h"
#include "optimizer.h"
#include "pipeline_parallel.h"
#include "process_group_manager.h"
#include "utils.h"
#include "tests/fixture.h"
#include "tests/test_util.h"

// the model's sizes, norm eps and rope theta, the batch shape, and AdamW's lr and weight decay
static void fixture_config(Config *cfg, const Fixture *fx) {
    const float *c = fixture_find(fx, "config")->data;
    config_defaults(cfg);
    cfg->hidden_size = (int)c[0];
    cfg->intermediate_size = (int)c[1];
    cfg->num_hidden_layers = (int)c[2];
    cfg->num_attention_heads = (int)c[3];
    cfg->num_key_value_heads = (int)c[4];
    cfg->vocab_size = (int)c[5];
    cfg->max_position_embeddings = (int)c[6];
    cfg->tie_word_embeddings = (int)c[7];
    cfg->micro_batch_size = (int)c[8];
    cfg->seq_length = (int)c[9];
    cfg->gradient_accumulation_steps = 1;
    cfg->rms_norm_eps = fixture_find(fx, "config.rms_norm_eps")->data[0];
    cfg->rope_theta = fixture_find(fx, "config.rope_theta")->data[0];
    // a mixture of experts (tests/reference/make_moe_model_fixture.py): E, K, I, aux coefficient
    const FixtureRecord *moe = fixture_find_opt(fx, "config.moe");
    if (moe) {
        cfg->num_experts = (int)moe->data[0];
        cfg->num_experts_per_tok = (int)moe->data[1];
        cfg->moe_intermediate_size = (int)moe->data[2];
        cfg->router_aux_loss_coef = moe->data[3];
    }
    const float *lr_wd = fixture_find(fx, "adam.lr_wd")->data;
    cfg->learning_rate = lr_wd[0];
    cfg->weight_decay = lr_wd[1];
}

// copies every "weight.<name>" record into the parameter of that name; every parameter must be
// covered once, with the fixture's shape
static void fixture_load_weights(Model *model, const Fixture *fx) {
    size_t covered = 0;
    for (int i = 0; i < fx->n; i++) {
        const FixtureRecord *r = &fx->rec[i];
        if (strncmp(r->name, "weight.", 7) != 0) continue;
        const ParamInfo *p = model_find_param(model, r->name + 7);
        if (!p)
            FAIL("model.c's parameter table must use Hugging Face names",
                 "the model has no parameter %s", r->name + 7);
        size_t n = (size_t)p->global_rows * p->global_cols;
        if (n != r->count || p->rows != p->global_rows || p->cols != p->global_cols)
            FAIL("", "%s: model holds %dx%d of %dx%d, fixture %zu values", p->name, p->rows,
                 p->cols, p->global_rows, p->global_cols, r->count);
        host_to_device(model->params + p->offset, r->data, n * sizeof(float));
        covered += n;
    }
    for (int t = 0; t < model->num_tensors; t++) {
        char key[160];
        snprintf(key, sizeof key, "weight.%s", model->table[t].name);
        if (!fixture_find_opt(fx, key))
            FAIL("a tied lm_head must not be a parameter of its own",
                 "model parameter %s is not in the fixture", model->table[t].name);
    }
    if (covered != model->num_params)
        FAIL("", "fixture covers %zu of the model's %zu parameters", covered, model->num_params);
}

// a fixture and the model it describes, on one rank
typedef struct {
    Fixture *fx;
    Config cfg;
    Model model;
    int N, *tokens, *targets; // the fixture's batch: (N = micro_batch_size * seq_length), host
    int *positions;           // (seq_length): 0, 1, ...
} FixtureModel;

// loads the fixture at path and builds its model with its weights; nothing is run yet
static void fixture_model_init(FixtureModel *fm, const char *path, ProcessGroupManager *pgm) {
    fm->fx = xmalloc(sizeof(Fixture));
    fixture_load(fm->fx, path);
    fixture_config(&fm->cfg, fm->fx);
    int N = fm->N = fm->cfg.micro_batch_size * fm->cfg.seq_length;
    // one rank: the whole of every tensor, every layer, every position
    fm->positions = xmalloc(fm->cfg.seq_length * sizeof(int));
    context_parallel_positions(fm->positions, 0, 1, fm->cfg.seq_length, 0);
    ModelShard shard = {.tp = tensor_parallel_sizes(&fm->cfg, &pgm->tp),
                        .stage = pipeline_stage(&fm->cfg, pgm),
                        .positions = fm->positions,
                        .stream_rows = N};
    model_init(&fm->model, &fm->cfg, pgm, &shard, 1);
    fixture_load_weights(&fm->model, fm->fx);
    fm->tokens = xmalloc(N * sizeof(int)), fm->targets = xmalloc(N * sizeof(int));
    const FixtureRecord *in = fixture_find(fm->fx, "inputs");
    const FixtureRecord *tg = fixture_find(fm->fx, "targets");
    if (in->count != (size_t)N || tg->count != (size_t)N)
        FAIL("", "inputs/targets hold %zu/%zu tokens, B*T = %d", in->count, tg->count, N);
    for (int i = 0; i < N; i++) {
        fm->tokens[i] = (int)in->data[i];
        fm->targets[i] = (int)tg->data[i];
    }
}

static void fixture_model_free(FixtureModel *fm) {
    free(fm->tokens), free(fm->targets), free(fm->positions);
    model_free(&fm->model);
    fixture_free(fm->fx);
    free(fm->fx);
}

// One forward and backward on the batch, gradients from zero (left in model.grads). Prints the
// loss beside the fixture's, which `reference` names; loss_err: relative; logits_err: max |diff|
// over max |reference logit|.
static void fixture_forward_backward(double *loss_err, double *logits_err, FixtureModel *fm,
                                     const char *reference) {
    Model *model = &fm->model;
    int N = fm->N, C = model->cfg.hidden_size, V = model->cfg.vocab_size;
    backend_step_begin(); // a step: the weights stay as loaded until its end
    device_zero(model->grads, model->num_params * sizeof(float));
    model_set_batch(model, 0, fm->tokens, fm->targets);
    float loss = model_forward(model, 0, 1.0f / N);
    // a slot keeps dlogits, not the logits: they are computed again from the final norm's output
    float *logits_dev = device_malloc((size_t)N * V * sizeof(float));
    float *logits = xmalloc((size_t)N * V * sizeof(float));
    matmul_forward(logits_dev, model->slots[0].lnf, model->w.lm_head, N, C, V); // (N, V)
    device_to_host(logits, logits_dev, (size_t)N * V * sizeof(float));
    model_backward(model, NULL, NULL, 0);
    float want_loss = fixture_find(fm->fx, "loss")->data[0];
    printf("  loss %.7f, %s %.7f\n", loss, reference, want_loss);
    *loss_err = fabs(loss - want_loss) / fabs(want_loss);
    *logits_err = rel_to_max(logits, fixture_find(fm->fx, "logits")->data, (size_t)N * V);
    device_free(logits_dev);
    free(logits);
}

// As many AdamW steps on the batch as the fixture's "adam.losses" holds, a fresh optimizer from
// the model's weights. Prints each loss beside the fixture's with `digits` decimals and returns
// the largest relative difference.
static double fixture_adamw_losses(FixtureModel *fm, int digits) {
    Model *model = &fm->model;
    const FixtureRecord *want = fixture_find(fm->fx, "adam.losses");
    double loss_err = 0;
    Optimizer opt; // torch's defaults: betas (0.9, 0.999), eps 1e-8
    optimizer_init(&opt, &fm->cfg, model->num_params);
    printf("  adamw losses:");
    for (size_t s = 0; s < want->count; s++) {
        backend_step_begin(); // AdamW wrote the weights at the end of the last step
        device_zero(model->grads, model->num_params * sizeof(float));
        model_set_batch(model, 0, fm->tokens, fm->targets);
        float l = model_forward(model, 0, 1.0f / fm->N);
        model_backward(model, NULL, NULL, 0);
        optimizer_step(&opt, model->params, model->grads, fm->cfg.learning_rate);
        loss_err = fmax(loss_err, fabs(l - want->data[s]) / fabs(want->data[s]));
        printf(" %.*f/%.*f", digits, l, digits, want->data[s]);
    }
    optimizer_free(&opt);
    return loss_err;
}

// The main of a fixture test: run_fixture(path, pgm) on each fixture of the command line, on one
// rank, the backend's products in dtype (NULL: as built). Returns main's exit status.
static int fixture_main(int argc, char **argv,
                        int (*run_fixture)(const char *path, ProcessGroupManager *pgm),
                        const char *dtype) {
    MPI_Init(&argc, &argv);
    if (argc < 2) user_error("usage: %s FIXTURE.bin [FIXTURE.bin ...]", argv[0]);
    backend_init(0);
    if (dtype) backend_set_dtype(dtype);
    ProcessGroupManager pgm;
    process_group_manager_init(&pgm, 1, 1, 1, 1, 1);
    int ok = 1;
    for (int i = 1; i < argc; i++) ok &= run_fixture(argv[i], &pgm);
    process_group_manager_free(&pgm);
    MPI_Finalize();
    return ok ? 0 : 1;
}
