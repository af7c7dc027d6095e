// Training on a mixture of domains: the data side of DoReMi (Xie et al. 2023, "DoReMi: Optimizing
// Data Mixtures Speeds Up Language Model Pretraining"; nanotron's examples/doremi).
//
// The sampler. Sample g of the global order (data.c: g = k * dp + dp_rank) comes from domain d
// with probability weight_d: the g-th uniform draw u_g of the stream keyed by training.seed picks
// the first d whose running sum of weights exceeds u_g. Within a domain, samples are taken in
// order (the n-th sample drawn from d is d's window n, wrapping at the end of its file), so a
// domain is read through before any window repeats. Both depend on g alone: every rank, in any
// layout, on a resumed run too, computes the same rows for the same step, and no rank needs to
// tell another anything. The count of earlier draws from d is kept as the sampler moves forward;
// a rank that asks for an earlier g (never, in training) recounts from 0.
#include "doremi.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <unistd.h>
#include <math.h>
#include <string.h>
#include "backend/backend.h"
#include "backend/comm.h"
#include "backend/init_value.h"
#include "checkpoint.h"
#include "files.h"
#include "utils.h"

#define DOMAINS_HINT "dataset.domains is a list of {\"name\", \"path\", \"weight\"}"

int domain_mixture_draw(long *index, DomainMixture *mix, long g) {
    if (g < mix->scanned) { // an earlier sample: count again from the start
        memset(mix->drawn, 0, mix->k * sizeof(long));
        mix->scanned = 0;
    }
    int d = 0;
    for (; mix->scanned <= g; mix->scanned++) {
        double u = uniform01(mix->key, (uint64_t)mix->scanned);
        for (d = 0; d < mix->k - 1 && u >= mix->cumulative[d]; d++) {
        }
        if (mix->scanned < g) mix->drawn[d]++;
    }
    *index = mix->drawn[d]++;
    return d;
}

// data.c's hook: the (seq_length + 1) tokens of global sample g, and its domain
static const int *sample_window(void *mixture, long g, int *domain) {
    DomainMixture *mix = mixture;
    long n;
    *domain = domain_mixture_draw(&n, mix, g);
    const Domain *d = &mix->domains[*domain];
    return d->ds.tokens + (n % d->samples) * mix->seq_length;
}

// ds as the loader sees a mixture: its samples come from sample_window, drawn by mix
static void mixture_dataset(Dataset *ds, DomainMixture *mix) {
    memset(ds, 0, sizeof *ds);
    snprintf(ds->path, sizeof ds->path, "dataset.domains (%d domains)", mix->k);
    ds->sample_window = sample_window;
    ds->mixture = mix;
}

static const char *string_of(const cJSON *item, const char *key, int i) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(item, key);
    if (!cJSON_IsString(s) || !s->valuestring[0])
        user_error("config error: dataset.domains[%d] has no \"%s\" string (" DOMAINS_HINT ")", i,
                   key);
    return s->valuestring;
}

// one domain's entry: its keys, its name (unique, short), its weight (1 when left out)
static void read_domain(Domain *d, const cJSON *item, int i, const DomainMixture *mix) {
    if (!cJSON_IsObject(item))
        user_error("config error: dataset.domains[%d] is not an object (" DOMAINS_HINT ")", i);
    for (const cJSON *key = item->child; key; key = key->next)
        if (strcmp(key->string, "name") && strcmp(key->string, "path") &&
            strcmp(key->string, "weight"))
            user_error("config error: dataset.domains[%d] has the unknown key \"%s\" (" DOMAINS_HINT
                       ")",
                       i, key->string);
    const char *name = string_of(item, "name", i);
    if (strlen(name) >= sizeof d->name)
        user_error("config error: dataset.domains[%d]: the name \"%.20s...\" is longer than %zu "
                   "characters",
                   i, name, sizeof d->name - 1);
    for (int j = 0; j < i; j++)
        if (strcmp(mix->domains[j].name, name) == 0)
            user_error("config error: dataset.domains[%d] and [%d] are both named \"%s\" (each "
                       "domain's loss is logged by its name)",
                       j, i, name);
    strcpy(d->name, name);
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(item, "weight");
    d->weight = w ? w->valuedouble : 1.0;
    if (w && (!cJSON_IsNumber(w) || !isfinite(w->valuedouble) || w->valuedouble <= 0))
        user_error("config error: dataset.domains[%d] (\"%s\"): weight must be a number > 0 (the "
                   "weights are normalised to sum to 1)",
                   i, name);
}

void domain_mixture_open(DomainMixture *mix, Dataset *ds, const Config *cfg) {
    const char *text = cfg->dataset_domains;
    cJSON *list = json_parse(text, strlen(text), NULL, "config error: dataset.domains");
    int k = cJSON_GetArraySize(list);
    if (k < 1) user_error("config error: dataset.domains is empty (" DOMAINS_HINT ")");
    if (cfg->num_samples > 0)
        user_error("config error: training.num_samples = %ld caps one corpus; with "
                   "dataset.domains each domain is read whole: set it to 0",
                   cfg->num_samples);
    *mix = (DomainMixture){.k = k,
                           .domains = xmalloc(k * sizeof(Domain)),
                           .cumulative = xmalloc(k * sizeof(double)),
                           .drawn = xmalloc(k * sizeof(long)),
                           .key = mix64((uint64_t)cfg->seed ^ hash_string("dataset.domains")),
                           .seq_length = cfg->seq_length};
    memset(mix->drawn, 0, k * sizeof(long));
    double total = 0;
    for (int i = 0; i < k; i++) {
        Domain *d = &mix->domains[i];
        const cJSON *item = cJSON_GetArrayItem(list, i);
        read_domain(d, item, i, mix);
        dataset_load(&d->ds, string_of(item, "path", i), cfg);
        d->samples = dataset_num_samples(&d->ds, cfg->seq_length);
        total += d->weight;
    }
    cJSON_Delete(list);
    double sum = 0;
    for (int i = 0; i < k; i++) {
        mix->domains[i].weight /= total;
        sum += mix->domains[i].weight;
        mix->cumulative[i] = i == k - 1 ? 1.0 : sum;
    }
    // what the loader and the run's checks read of a dataset: the mixture's view
    mixture_dataset(ds, mix);
    for (int i = 0; i < k; i++) {
        ds->num_tokens += mix->domains[i].ds.num_tokens;
        if (mix->domains[i].ds.vocab_size > ds->vocab_size)
            ds->vocab_size = mix->domains[i].ds.vocab_size;
    }
}

char *domain_list_json(const char *spec, const char *weights_file) {
    cJSON *weights = NULL;
    if (weights_file) {
        size_t size = 0;
        char *text = read_whole_file(weights_file, &size);
        if (!text) user_error("create_config: --domain_weights %s %s", weights_file, file_error());
        weights = json_parse(text, size, NULL, "create_config: --domain_weights");
        free(text);
        if (!cJSON_IsObject(weights))
            user_error("create_config: --domain_weights %s is not a JSON object of weights by "
                       "domain name (a DoReMi proxy's domain_weights.json)",
                       weights_file);
    }
    cJSON *list = cJSON_CreateArray();
    char *copy = strdup(spec), *save = NULL;
    if (!copy) FAIL("out of memory?", "strdup of %zu bytes", strlen(spec));
    for (char *entry = strtok_r(copy, ",", &save); entry; entry = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(entry, '='), *colon = strrchr(entry, ':'), *end = NULL;
        double weight = 1.0;
        if (colon && colon > eq) { // a path may hold ':' itself: only a number after the last
            weight = strtod(colon + 1, &end);
            if (end != colon + 1 && *end == '\0')
                *colon = '\0';
            else
                weight = 1.0;
        }
        if (!eq || eq == entry || !eq[1])
            user_error("create_config: --domains entry \"%s\" is not name=path[:weight] (e.g. "
                       "--domains books=data/austen.txt:3,code=data/code.tok:1)",
                       entry);
        *eq = '\0';
        if (weights) { // the proxy's weight of this name, and no other
            const cJSON *w = cJSON_GetObjectItemCaseSensitive(weights, entry);
            if (!cJSON_IsNumber(w) || !(w->valuedouble > 0))
                user_error("create_config: --domain_weights %s has no weight > 0 for domain \"%s\"",
                           weights_file, entry);
            weight = w->valuedouble;
        }
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "name", entry);
        cJSON_AddStringToObject(d, "path", eq + 1);
        cJSON_AddNumberToObject(d, "weight", weight);
        cJSON_AddItemToArray(list, d);
    }
    free(copy);
    if (weights && cJSON_GetArraySize(weights) != cJSON_GetArraySize(list))
        user_error("create_config: --domain_weights %s has %d domains, --domains %d: the same "
                   "domains, by name",
                   weights_file, cJSON_GetArraySize(weights), cJSON_GetArraySize(list));
    cJSON_Delete(weights);
    char *text = cJSON_PrintUnformatted(list);
    cJSON_Delete(list);
    return text;
}

void domain_mixture_free(DomainMixture *mix) {
    for (int i = 0; i < mix->k; i++) dataset_free(&mix->domains[i].ds);
    free(mix->domains);
    free(mix->cumulative);
    free(mix->drawn);
}

void domain_mixture_view(DomainMixture *view, Dataset *ds, const DomainMixture *mix) {
    *view = *mix;
    view->scanned = 0;
    view->drawn = xmalloc(mix->k * sizeof(long));
    memset(view->drawn, 0, mix->k * sizeof(long));
    mixture_dataset(ds, view);
}

void domain_mixture_view_free(DomainMixture *view) {
    free(view->drawn);
}

// ---------------------------------------------------------------------------------------------
// each domain's loss, and DoReMi
//
// DoReMi (Xie et al. 2023, Algorithm 1), step t of the proxy:
//   lambda_i = mean over domain i's tokens of max(loss_proxy - loss_reference, 0)
//   alpha_t  = (1 - c) softmax(log alpha_{t-1} + eta * lambda) + c / k     (alpha_0 = 1/k)
//   the proxy minimises sum_i alpha_i * (its mean loss on domain i's tokens of the step)
// lambda needs every forward of the step, and 1F1B starts backwards before the last forward, so
// step t trains with alpha_{t-1} and its own excess losses make alpha_t. The loss's gradient is
// the plain loss's with each token's weight times R * alpha_i / R_i (R rows in the global batch,
// R_i of them from domain i): scale_rows on dlogits, which the forward already computed. Nothing
// flows into alpha: it is a number on the host. The final weights are the mean of alpha_t.

// the model's loss hook, on the last stage after each micro-batch's forward
static void add_token_losses(Model *model, Activations *a) {
    DomainLosses *dl = model->loss_ctx;
    DoReMi *dr = dl->doremi;
    int B = dl->loader->micro_batch_size, N = model->B * model->T, T = N / B;
    device_to_host(dl->host, model->loss_buffers.losses, (size_t)N * sizeof(float));
    const float *ref = dr ? dr->ref_losses + (size_t)dr->micro * N : NULL;
    for (int b = 0; b < B; b++) {
        int d = dl->loader->domains[b];
        double loss = 0, excess = 0;
        for (int t = 0; t < T; t++) {
            loss += dl->host[b * T + t];
            if (ref) excess += fmax(dl->host[b * T + t] - ref[b * T + t], 0.0);
        }
        dl->sums[3 * d] += loss, dl->sums[3 * d + 1] += T, dl->sums[3 * d + 2] += excess;
    }
    if (!dr) return;
    long R = 0;
    for (int d = 0; d < dl->mix->k; d++) R += dr->rows[d];
    for (int b = 0; b < B; b++) {
        int d = dl->loader->domains[b];
        for (int t = 0; t < T; t++)
            dr->scale_host[b * T + t] = (float)(dr->alpha[d] * R / dr->rows[d]);
    }
    host_to_device(dr->scale, dr->scale_host, (size_t)N * sizeof(float));
    scale_rows(a->dlogits, dr->scale, N, model->V);
    dr->micro++;
}

// A resumed proxy carries on with the weights of the run it resumes: the steps before first_step
// of the domain_weights.jsonl beside its checkpoint (in the save_dir that load_path names, or
// holds), each written to 17 digits, so alpha and their sum come back exactly. This run's own
// domain_weights.jsonl starts with those lines (returned).
static char *resume_weights(DoReMi *dr, const Config *cfg, const DomainMixture *mix,
                            int first_step) {
    char dir[600], path[700], state[700];
    snprintf(dir, sizeof dir, "%s", cfg->load_path);
    snprintf(state, sizeof state, "%s/state.json", dir);
    if (access(state, F_OK) == 0 && strrchr(dir, '/')) *strrchr(dir, '/') = '\0'; // a step folder
    snprintf(path, sizeof path, "%s/domain_weights.jsonl", dir);
    char *text = read_whole_file(path, NULL);
    if (!text)
        user_error("doremi: resuming a proxy run needs its weights, %s: %s", path, file_error());
    int steps = 0;
    char *kept = text;
    for (char *line = text, *end; *line; line = end + 1) {
        if (!(end = strchr(line, '\n'))) break;
        *end = '\0';
        cJSON *row = json_parse(line, end - line, NULL, "doremi: domain_weights.jsonl");
        const cJSON *step = cJSON_GetObjectItemCaseSensitive(row, "step");
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(row, "weights");
        if (!cJSON_IsNumber(step) || step->valuedouble != steps + 1 || !cJSON_IsObject(w))
            user_error("doremi: %s: line %d is not step %d's weights", path, steps + 1, steps + 1);
        if (step->valueint >= first_step) {
            cJSON_Delete(row);
            break;
        }
        for (int d = 0; d < mix->k; d++) {
            const cJSON *x = cJSON_GetObjectItemCaseSensitive(w, mix->domains[d].name);
            if (!cJSON_IsNumber(x) || !(x->valuedouble > 0))
                user_error("doremi: %s: step %d has no weight > 0 for domain \"%s\"", path,
                           steps + 1, mix->domains[d].name);
            dr->alpha[d] = x->valuedouble;
            dr->alpha_sum[d] += x->valuedouble;
        }
        *end = '\n'; // kept: this run's file starts with it
        cJSON_Delete(row);
        steps++;
        kept = end + 1;
    }
    *kept = '\0';
    if (steps != first_step - 1)
        user_error("doremi: %s holds the weights of %d steps, the checkpoint is at step %d (the "
                   "proxy's own save_dir's file, up to its checkpoint, is what a resume reads)",
                   path, steps, first_step - 1);
    dr->steps_before = steps;
    return text;
}

static void doremi_init(DoReMi *dr, const Model *model, const DomainMixture *mix,
                        const ModelShard *shard, int logger, int first_step) {
    const Config *cfg = &model->cfg;
    int k = mix->k, N = model->B * model->T;
    *dr = (DoReMi){.eta = cfg->doremi_step_size,
                   .c = cfg->doremi_smoothing,
                   .alpha = xmalloc(k * sizeof(double)),
                   .used = xmalloc(k * sizeof(double)),
                   .alpha_sum = xmalloc(k * sizeof(double)),
                   .excess = xmalloc(k * sizeof(double)),
                   .rows = xmalloc(k * sizeof(long)),
                   .ref_losses =
                       xmalloc((size_t)cfg->gradient_accumulation_steps * N * sizeof(float)),
                   .scale_host = xmalloc((size_t)N * sizeof(float)),
                   .scale = device_malloc((size_t)N * sizeof(float))};
    for (int d = 0; d < k; d++) dr->alpha[d] = 1.0 / k, dr->alpha_sum[d] = 0;
    // the reference: this rank's shard of it, one activation slot, weights from its checkpoint
    model_init(&dr->ref, cfg, model->pgm, shard, 1);
    if (checkpoint_load(&dr->ref, NULL, cfg->doremi_reference) == 0)
        user_error("doremi.reference_checkpoint %s holds no checkpoint", cfg->doremi_reference);
    domain_mixture_view(&dr->ref_mix, &dr->ref_ds, mix);
    domain_mixture_view(&dr->count_mix, &dr->count_ds, mix);
    const ProcessGroupManager *pgm = model->pgm;
    micro_batch_loader_init(&dr->ref_loader, &dr->ref_ds, cfg, pgm->dp_rank, pgm->dp_size,
                            shard->positions, model->T);
    char *kept = first_step > 1 ? resume_weights(dr, cfg, mix, first_step) : NULL;
    if (logger) { // through a temporary file, as metrics.c: a crash here loses no step's line
        char path[600], tmp[610];
        snprintf(path, sizeof path, "%s/domain_weights.jsonl", cfg->save_dir);
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        dr->log = fopen(tmp, "w");
        if (!dr->log || (kept && fputs(kept, dr->log) < 0) || fflush(dr->log) != 0 ||
            rename(tmp, path) != 0)
            user_error("doremi: cannot write %s: %s (checkpoint.save_dir must be writable)", path,
                       strerror(errno));
    }
    free(kept);
}

// the reference's forward over the step's micro-batches, pipelined as the proxy's (forward only:
// each stage receives, runs its layers, sends on); the last stage keeps the token losses
static void reference_forward(DoReMi *dr, int step) {
    Model *ref = &dr->ref;
    ProcessGroupManager *pgm = ref->pgm;
    int grad_acc = ref->cfg.gradient_accumulation_steps, N = ref->B * ref->T;
    size_t activation = (size_t)ref->Ns * ref->C;
    for (int micro = 0; micro < grad_acc; micro++) {
        load_micro_batch(&dr->ref_loader, step, micro);
        model_set_batch(ref, 0, dr->ref_loader.input_ids, dr->ref_loader.target_ids);
        if (!pgm->pp_is_first) recv(model_stage_input(ref, 0), activation, pgm->pp_prev, &pgm->pp);
        model_forward(ref, 0, 1.0f);
        if (!pgm->pp_is_last) send(model_stage_output(ref, 0), activation, pgm->pp_next, &pgm->pp);
        if (pgm->pp_is_last)
            device_to_host(dr->ref_losses + (size_t)micro * N, ref->loss_buffers.losses,
                           (size_t)N * sizeof(float));
    }
}

// the exponentiated-gradient step on the excess losses (sums: loss, tokens, excess per domain)
static void doremi_update(DoReMi *dr, const double *sums, int k, int step,
                          const DomainMixture *mix) {
    double logits[k], top = -INFINITY, total = 0;
    for (int d = 0; d < k; d++) {
        dr->used[d] = dr->alpha[d];
        dr->excess[d] = sums[3 * d + 1] > 0 ? sums[3 * d + 2] / sums[3 * d + 1] : 0.0;
        logits[d] = log(dr->alpha[d]) + dr->eta * dr->excess[d];
        top = fmax(top, logits[d]);
    }
    for (int d = 0; d < k; d++) total += exp(logits[d] - top);
    for (int d = 0; d < k; d++) {
        dr->alpha[d] = (1 - dr->c) * exp(logits[d] - top) / total + dr->c / k;
        dr->alpha_sum[d] += dr->alpha[d];
    }
    if (!dr->log) return;
    int failed = fprintf(dr->log, "{\"step\": %d, \"excess_loss\": {", step) < 0;
    for (int d = 0; d < k; d++)
        failed |= fprintf(dr->log, "%s\"%s\": %.17g", d ? ", " : "", mix->domains[d].name,
                          dr->excess[d]) < 0;
    failed |= fprintf(dr->log, "}, \"weights\": {") < 0;
    for (int d = 0; d < k; d++)
        failed |= fprintf(dr->log, "%s\"%s\": %.17g", d ? ", " : "", mix->domains[d].name,
                          dr->alpha[d]) < 0;
    if (failed || fprintf(dr->log, "}}\n") < 0 || fflush(dr->log) != 0)
        FAIL("is the disk full?", "doremi: writing domain_weights.jsonl failed: %s",
             strerror(errno));
}

void domain_losses_init(DomainLosses *dl, Model *model, const DomainMixture *mix,
                        const MicroBatchDataLoader *loader, const ModelShard *shard, int logger,
                        int first_step) {
    int k = mix->k;
    *dl = (DomainLosses){.mix = mix,
                         .loader = loader,
                         .host = xmalloc((size_t)model->B * model->T * sizeof(float)),
                         .sums = xmalloc(3 * k * sizeof(double)),
                         .mean = xmalloc(k * sizeof(double)),
                         .first = xmalloc(k * sizeof(double)),
                         .run = xmalloc(k * sizeof(double)),
                         .run_steps = xmalloc(k * sizeof(long)),
                         .pgm = model->pgm,
                         .logger = logger};
    memset(dl->sums, 0, 3 * k * sizeof(double));
    memset(dl->run, 0, k * sizeof(double));
    memset(dl->run_steps, 0, k * sizeof(long));
    for (int d = 0; d < k; d++) dl->first[d] = NAN;
    if (model->cfg.doremi_reference[0]) {
        dl->doremi = xmalloc(sizeof(DoReMi));
        doremi_init(dl->doremi, model, mix, shard, logger, first_step);
    }
    model->on_loss = add_token_losses;
    model->loss_ctx = dl;
}

void domain_losses_begin(DomainLosses *dl, int step) {
    DoReMi *dr = dl->doremi;
    if (!dr) return;
    const Config *cfg = &dr->ref.cfg;
    long R = (long)cfg->micro_batch_size * cfg->gradient_accumulation_steps * cfg->dp_size, n;
    memset(dr->rows, 0, dl->mix->k * sizeof(long));
    for (long g = step * R; g < (step + 1) * R; g++)
        dr->rows[domain_mixture_draw(&n, &dr->count_mix, g)]++;
    reference_forward(dr, step);
    dr->micro = 0;
}

void domain_losses_step(DomainLosses *dl, int step) {
    int k = dl->mix->k;
    // over the replicas, then from the last stage to the others (their sums are zeros), so every
    // rank holds the same numbers and computes the same weights
    all_reduce_host(dl->sums, 3 * k, MPI_DOUBLE, MPI_SUM, &dl->pgm->cp_dp);
    all_reduce_host(dl->sums, 3 * k, MPI_DOUBLE, MPI_SUM, &dl->pgm->pp);
    for (int d = 0; d < k; d++) {
        double tokens = dl->sums[3 * d + 1];
        dl->mean[d] = tokens > 0 ? dl->sums[3 * d] / tokens : NAN;
        if (isnan(dl->first[d])) dl->first[d] = dl->mean[d];
        if (!isnan(dl->mean[d])) dl->run[d] += dl->mean[d], dl->run_steps[d]++;
    }
    if (dl->doremi) doremi_update(dl->doremi, dl->sums, k, step, dl->mix);
    memset(dl->sums, 0, 3 * k * sizeof(double));
    dl->steps++;
}

// {"name": x, ...} of one number per domain; NAN: null
static size_t per_domain_json(char *out, size_t size, const DomainMixture *mix, const double *x) {
    size_t n = snprintf(out, size, "{");
    for (int d = 0; d < mix->k && n < size; d++)
        n += isnan(x[d]) ? snprintf(out + n, size - n, "%s\"%s\": null", d ? ", " : "",
                                    mix->domains[d].name)
                         : snprintf(out + n, size - n, "%s\"%s\": %.9g", d ? ", " : "",
                                    mix->domains[d].name, x[d]);
    return n < size ? n + snprintf(out + n, size - n, "}") : n;
}

void domain_losses_json(char *out, size_t size, const DomainLosses *dl) {
    size_t n = snprintf(out, size, "\"domain_loss\": ");
    if (n < size) n += per_domain_json(out + n, size - n, dl->mix, dl->mean);
    const DoReMi *dr = dl->doremi;
    if (!dr || n >= size) return;
    double loss = 0; // the proxy's objective: the weighted mean of the domains' losses
    for (int d = 0; d < dl->mix->k; d++)
        if (!isnan(dl->mean[d])) loss += dr->used[d] * dl->mean[d];
    n += snprintf(out + n, size - n, ", \"doremi_loss\": %.9g, \"domain_weight\": ", loss);
    if (n < size) per_domain_json(out + n, size - n, dl->mix, dr->used);
}

void domain_losses_report(const DomainLosses *dl, const char *save_dir) {
    const DoReMi *dr = dl->doremi;
    int k = dl->mix->k;
    printf("domains: %d, each row drawn by its weight; per domain: weight, tokens in its file, "
           "its loss at the first step that drew it, its mean loss over the %d steps%s\n",
           k, dl->steps, dr ? ", DoReMi's learned weight (the mean of its weights)" : "");
    double learned[k];
    for (int d = 0; d < k; d++) {
        const Domain *dom = &dl->mix->domains[d];
        int steps = dl->steps + (dr ? dr->steps_before : 0);
        learned[d] = dr && steps ? dr->alpha_sum[d] / steps : NAN;
        printf("  %-16s %.4f %10ld  %.4f  %.4f", dom->name, dom->weight, dom->ds.num_tokens,
               dl->first[d], dl->run_steps[d] ? dl->run[d] / dl->run_steps[d] : NAN);
        if (dr) printf("  %.4f", learned[d]);
        printf("\n");
    }
    if (!dr) return;
    char path[600], text[8192];
    per_domain_json(text, sizeof text, dl->mix, learned);
    snprintf(path, sizeof path, "%s/domain_weights.json", save_dir);
    FILE *f = fopen(path, "w");
    if (!f || fprintf(f, "%s\n", text) < 0 || fclose(f) != 0)
        FAIL("is the disk full?", "doremi: cannot write %s: %s", path, strerror(errno));
    printf("DoReMi: the mean weights of %d steps written to %s (./create_config "
           "--domain_weights %s puts them into a config)\n",
           dl->steps + dr->steps_before, path, path);
}

void domain_losses_free(DomainLosses *dl) {
    DoReMi *dr = dl->doremi;
    if (dr) {
        model_free(&dr->ref);
        micro_batch_loader_free(&dr->ref_loader);
        domain_mixture_view_free(&dr->ref_mix);
        domain_mixture_view_free(&dr->count_mix);
        if (dr->log && fclose(dr->log) != 0)
            FAIL("is the disk full?", "doremi: closing domain_weights.jsonl failed");
        free(dr->alpha), free(dr->used), free(dr->alpha_sum), free(dr->excess), free(dr->rows);
        free(dr->ref_losses), free(dr->scale_host);
        device_free(dr->scale);
        free(dr);
    }
    free(dl->host);
    free(dl->sums);
    free(dl->mean);
    free(dl->first);
    free(dl->run);
    free(dl->run_steps);
}
