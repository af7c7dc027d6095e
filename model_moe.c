// The mixture-of-experts MLP of the model (cfg.num_experts > 0): moe.c's block (Mixtral's sparse
// MoE) in a decoder layer, under every layout, and the statistics of the experts' load.
//
// Tensors, named as transformers saves a Mixtral (MixtralForCausalLM's save_pretrained), so the
// table's names are the checkpoint's, the optimizer state's and init_from's, with no renaming: the
// router model.layers.{l}.block_sparse_moe.gate.weight (E, C) is replicated on the tp ranks
// (counted once, as the norms); each expert e has its own gate_proj, up_proj and down_proj,
// model.layers.{l}.block_sparse_moe.experts.{e}.w1 / w3 / w2.weight, split over tp exactly as
// the dense MLP (gate and up column-parallel, down row-parallel: I/tp features of every expert
// on each tp rank). Expert parallelism splits the experts themselves: ep rank r lays out experts
// [r*E/ep, (r+1)*E/ep) only, under their global names (expert_parallel.c moves the tokens).
//
// Tensor parallelism: every tp rank holds the same N tokens (gathered first under sequence
// parallelism), so each routes them identically and runs its I/tp share of every chosen expert;
// the combined output is then a partial sum over tp, all-reduced (reduce-scattered under sequence
// parallelism), as the dense MLP's down_proj output. In the backward, d topk_w = dy . expert
// output needs the whole output, so the partial dots are summed over tp before the router's
// backward; dx sums the experts' partial input gradients over tp, then adds the router's part,
// which every tp rank computes identically and which must be counted once.
//
// Loss: the training loss is CE + router_aux_loss_coef * (mean over layers of each layer's
// Switch aux), per micro-batch, averaged over micro-batches as CE is. Context parallelism splits
// a micro-batch's tokens: moe.c sums each expert's pair count and prob sum over cp (2E floats per
// layer) before forming aux, so every cp rank has one rank's aux. The logged loss stays CE; the
// step's aux is reported beside it (metrics "aux_loss"), summed over the pipeline stages' layers.
#include <math.h>
#include <stdio.h>
#include "backend/backend.h"
#include "model.h"
#include "tensor_parallel.h"
#include "utils.h"

// an expert's tensor: marked so that its gradient averages over its own replicas
// (data_parallel.c) and its ep rank writes it (checkpoint.c)
static float *add_expert_param(Model *model, float *base, const char *name, int rows, int cols,
                               TensorParallelSplit split) {
    float *p = model_add_param(model, base, name, rows, cols, split, UNIFORM);
    model->table[model->num_tensors - 1].expert = 1;
    return p;
}

void moe_layout_params(Model *model, MlpWeights *m, float *base, int layer) {
    const Config *c = &model->cfg;
    int C = c->hidden_size, I = c->moe_intermediate_size, E = c->num_experts;
    // this ep rank's experts (model_full_table's grid of one has ep_size 0: all of them)
    int ep = model->pgm->ep_size > 1 ? model->pgm->ep_size : 1, El = E / ep;
    int first = model->pgm->ep_rank * El;
    char n[96];
    snprintf(n, sizeof n, "model.layers.%d.block_sparse_moe.gate.weight", layer);
    m->moe.router = model_add_param(model, base, n, E, C, REPLICATED, UNIFORM);
    if (!m->moe.experts) m->moe.experts = xmalloc(El * sizeof(ExpertWeights));
    for (int e = first; e < first + El; e++) {
        ExpertWeights *x = &m->moe.experts[e - first];
#define NAME(w)                                                                                    \
    (snprintf(n, sizeof n, "model.layers.%d.block_sparse_moe.experts.%d.%s", layer, e, w), n)
        // Mixtral's w1 is gate_proj, w3 up_proj, w2 down_proj
        x->gate_proj = add_expert_param(model, base, NAME("w1.weight"), I, C, COLUMN_PARALLEL);
        x->up_proj = add_expert_param(model, base, NAME("w3.weight"), I, C, COLUMN_PARALLEL);
        x->down_proj = add_expert_param(model, base, NAME("w2.weight"), C, I, ROW_PARALLEL);
#undef NAME
    }
}

// out = mid + moe(ln2), ln2 = rmsnorm(mid)
void moe_mlp_forward(Model *model, float *out, MlpActivations *s, const float *mid,
                     const MlpWeights *w) {
    int N = model->B * model->T, C = model->C, Ns = model->Ns;
    TensorParallel *tp = &model->tp;
    rmsnorm_forward(s->ln2, s->rstd2, mid, w->post_attention_layernorm, Ns, C,
                    model->cfg.rms_norm_eps);
    const float *ln2 = tensor_parallel_region_input(tp, s->ln2); // (N, C)
    // y, this tp rank's partial sum, may overwrite the gathered ln2: moe_forward reads x first
    float *y = tensor_parallel_region_partial(tp, out);
    moe_forward(y, &s->moe, ln2, &w->moe, &model->moe, &model->pgm->cp, &model->ep);
    tensor_parallel_region_sum(tp, out, y, (size_t)N * C);
    add_inplace(out, mid, (size_t)Ns * C);
}

// the step's load of local layer l: taken in the backward, which runs once per micro-batch and
// layer, whether or not the forward ran again for it (recomputation)
static void count_load(Model *model, const MoeActivations *a, int l) {
    const Config *c = &model->cfg;
    int E = model->moe.E, layer = stage_global_layer(&model->stage, l);
    MoeStats *st = &model->moe_stats;
    st->aux += a->aux / ((double)c->num_hidden_layers * c->gradient_accumulation_steps);
    float *row = st->step + (size_t)layer * (E + 1);
    for (int e = 0; e < E; e++) row[e] += a->load_host[e];
    row[E] += a->dropped;
}

void moe_mlp_backward(Model *model, float *dresid, const MlpWeights *dw, const MlpActivations *s,
                      const float *mid, const MlpWeights *w, int l) {
    const Config *c = &model->cfg;
    int N = model->B * model->T, C = model->C, Ns = model->Ns, E = model->moe.E;
    const MoeActivations *a = &s->moe;
    MoeGrads *g = &model->moe_grads;
    TensorParallel *tp = &model->tp;
    float *dln2 = model->d.mlp.ln2; // (N, C)
    // forward: y = combine(experts(ln2)), every tp rank's share of each expert
    const float *dy = tensor_parallel_region_input(tp, dresid); // (N, C)
    device_zero(dln2, (size_t)N * C * sizeof(float));
    moe_experts_backward(dln2, &dw->moe, g, dy, a, &w->moe, &model->moe, &model->ep);
    // d topk_w[n, j] = dy[n] . out[n, j] needs the expert's whole output, of which this rank
    // holds a partial sum over its I/tp features: the dots add up over tp
    all_reduce(g->dtopk_w, (size_t)N * model->moe.K, REDUCE_SUM, tp->group);
    // the experts' input gradients are partial sums too (column-parallel gate and up)
    Handle h = tensor_parallel_grad_sum_start(tp, dln2, (size_t)N * C);
    comm_wait(&h);
    // forward: logits = ln2 @ router^T, aux from their softmax. d loss / d aux of one layer's
    // aux in one micro-batch is coef / (layers * grad_acc); times cp because the cp*dp gradient
    // average divides the cp ranks' parts, which together are the micro-batch's gradient
    float aux_scale = c->router_aux_loss_coef * model->pgm->cp_size /
                      ((float)c->num_hidden_layers * c->gradient_accumulation_steps);
    const float *ln2 = tensor_parallel_region_input(tp, s->ln2);
    moe_router_grad(NULL, &dw->moe, g, aux_scale, a, ln2, &w->moe, &model->moe);
    // the router's part of d ln2, the same on every tp rank: once, on this rank's stream rows
    size_t row0 = (size_t)(tensor_parallel_own_rows(tp, dln2) - dln2) / C;
    matmul_backward(dln2 + row0 * C, NULL, g->dlogits + row0 * E, NULL, w->moe.router, Ns, C, E);
    // forward: ln2 = rmsnorm(mid), on this rank's rows
    rmsnorm_backward(dresid, dw->post_attention_layernorm, dln2 + row0 * C, mid,
                     w->post_attention_layernorm, s->rstd2, Ns, C);
    count_load(model, a, l);
}

void moe_alloc_buffers(Model *model) {
    const Config *c = &model->cfg;
    int I =
        tensor_parallel_shard(COLUMN_PARALLEL, c->moe_intermediate_size, 1, &model->pgm->tp).rows;
    model->moe = moe_sizes(model->B * model->T, model->C, I, c->num_experts, c->num_experts_per_tok,
                           c->moe_capacity_factor, model->pgm->ep_size);
    expert_parallel_init(&model->ep, &model->pgm->ep, c->num_experts);
    moe_grads_alloc(&model->moe_grads, &model->moe);
    size_t rows = (size_t)c->num_hidden_layers * (c->num_experts + 1);
    MoeStats *st = &model->moe_stats;
    st->step = xmalloc(rows * sizeof(float));
    st->run = xmalloc((size_t)c->num_hidden_layers * (c->num_experts + 2) * sizeof(double));
    st->reduced = device_malloc((1 + rows) * sizeof(float));
    model->extension_bytes += moe_grads_bytes(&model->moe) + (1 + rows) * sizeof(float);
}

void moe_free_buffers(Model *model) {
    moe_grads_free(&model->moe_grads);
    device_free(model->moe_stats.reduced);
    free(model->moe_stats.step);
    free(model->moe_stats.run);
    for (int l = 0; l < model->L; l++) {
        free(model->w.layers[l].mlp.moe.experts);
        free(model->dw.layers[l].mlp.moe.experts);
    }
}

// The step's aux and load, as one rank would have them: each cp rank holds the same (the
// micro-batch's, summed over cp in moe_forward) and each dp rank its own micro-batches; each
// pipeline stage its own layers. One sum over cp*dp, then one over pp.
static float moe_step_statistics(Model *model) {
    const Config *c = &model->cfg;
    ProcessGroupManager *pgm = model->pgm;
    MoeStats *st = &model->moe_stats;
    int E = c->num_experts, L = c->num_hidden_layers;
    size_t rows = (size_t)L * (E + 1);
    float aux = (float)st->aux;
    host_to_device(st->reduced, &aux, sizeof aux);
    host_to_device(st->reduced + 1, st->step, rows * sizeof(float));
    all_reduce(st->reduced, 1 + rows, REDUCE_SUM, &pgm->cp_dp);
    all_reduce(st->reduced, 1 + rows, REDUCE_SUM, &pgm->pp);
    device_to_host(&aux, st->reduced, sizeof aux);
    device_to_host(st->step, st->reduced + 1, rows * sizeof(float));
    for (int l = 0; l < L; l++) {
        float *row = st->step + (size_t)l * (E + 1);
        double *run = st->run + (size_t)l * (E + 2), total = 0, max = 0;
        for (int e = 0; e < E; e++) {
            double pairs = row[e] / pgm->cp_size; // the cp ranks counted the same pairs
            run[e] += pairs, total += pairs, max = fmax(max, pairs);
        }
        run[E] += row[E]; // dropped: each rank its own tokens'
        run[E + 1] += total > 0 ? max / (total / E) : 1.0;
    }
    st->steps++;
    st->aux = 0;
    for (size_t i = 0; i < rows; i++) st->step[i] = 0.0f;
    return aux / pgm->cp_dp.size; // each replica's aux is a mean over its micro-batches
}

float moe_step_aux_loss(Model *model) {
    return model->cfg.num_experts > 0 ? moe_step_statistics(model) : 0.0f;
}

void moe_report(const Model *model) {
    const Config *c = &model->cfg;
    const MoeStats *st = &model->moe_stats;
    int E = c->num_experts, K = c->num_experts_per_tok, steps = st->steps;
    if (E == 0 || steps == 0) return;
    double pairs = (double)c->micro_batch_size * c->seq_length * c->gradient_accumulation_steps *
                   c->dp_size * K; // (token, expert) pairs per layer and step
    printf("mixture of experts: %d experts, top-%d, %d steps; pairs routed to each expert per step "
           "(layer by layer), their max/mean (1: even), pairs dropped by the capacity\n",
           E, K, steps);
    double balance = 0, dropped = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const double *run = st->run + (size_t)l * (E + 2);
        printf("  layer %d:", l);
        for (int e = 0; e < E && e < 16; e++) printf(" %.1f", run[e] / steps);
        printf("%s | max/mean %.3f | dropped %.1f%%\n", E > 16 ? " ..." : "", run[E + 1] / steps,
               100.0 * run[E] / (steps * pairs));
        balance += run[E + 1] / steps, dropped += run[E] / steps;
    }
    printf("router balance: max/mean pairs per expert %.4f (mean over %d layers and %d steps); "
           "dropped %.2f%% of pairs\n",
           balance / c->num_hidden_layers, c->num_hidden_layers, steps,
           100.0 * dropped / (c->num_hidden_layers * pairs));
    const ExpertParallel *ep = &model->ep;
    if (ep->group) // this rank's: the dispatches, the combines and their backward's twins
        printf("expert parallelism: ep=%d, %d of %d experts on each rank; this rank's all-to-alls "
               "per step: %.1f, %.3f MB sent to the other ep ranks, %.2f ms (with the counts')\n",
               ep->group->size, ep->num_local, E, (double)ep->calls / steps,
               ep->bytes / steps / 1e6, 1e3 * ep->seconds / steps);
}
