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
#include <math.h>
#include <string.h>
#include "backend/backend.h"
#include "backend/comm.h"
#include "backend/init_value.h"
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
    memset(ds, 0, sizeof *ds);
    snprintf(ds->path, sizeof ds->path, "dataset.domains (%d domains)", k);
    for (int i = 0; i < k; i++) {
        ds->num_tokens += mix->domains[i].ds.num_tokens;
        if (mix->domains[i].ds.vocab_size > ds->vocab_size)
            ds->vocab_size = mix->domains[i].ds.vocab_size;
    }
    ds->sample_window = sample_window;
    ds->mixture = mix;
}

char *domain_list_json(const char *spec) {
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
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "name", entry);
        cJSON_AddStringToObject(d, "path", eq + 1);
        cJSON_AddNumberToObject(d, "weight", weight);
        cJSON_AddItemToArray(list, d);
    }
    free(copy);
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

// ---------------------------------------------------------------------------------------------
// each domain's loss

// the model's loss hook: this micro-batch's token losses (N = B * T), row by row
static void add_token_losses(void *ctx, const float *losses, int N) {
    DomainLosses *dl = ctx;
    int B = dl->loader->micro_batch_size, T = N / B;
    device_to_host(dl->host, losses, (size_t)N * sizeof(float));
    for (int b = 0; b < B; b++) {
        int d = dl->loader->domains[b];
        for (int t = 0; t < T; t++) dl->sums[2 * d] += dl->host[b * T + t];
        dl->sums[2 * d + 1] += T;
    }
}

void domain_losses_init(DomainLosses *dl, Model *model, const DomainMixture *mix,
                        const MicroBatchDataLoader *loader) {
    int k = mix->k;
    *dl = (DomainLosses){.mix = mix,
                         .loader = loader,
                         .host = xmalloc((size_t)model->B * model->T * sizeof(float)),
                         .sums = xmalloc(2 * k * sizeof(double)),
                         .mean = xmalloc(k * sizeof(double)),
                         .first_mean = xmalloc(k * sizeof(double)),
                         .run = xmalloc(k * sizeof(double)),
                         .run_steps = xmalloc(k * sizeof(long))};
    memset(dl->sums, 0, 2 * k * sizeof(double));
    memset(dl->run, 0, k * sizeof(double));
    memset(dl->run_steps, 0, k * sizeof(long));
    for (int d = 0; d < k; d++) dl->first_mean[d] = NAN;
    model->on_loss = add_token_losses;
    model->loss_ctx = dl;
}

void domain_losses_free(DomainLosses *dl) {
    free(dl->host);
    free(dl->sums);
    free(dl->mean);
    free(dl->first_mean);
    free(dl->run);
    free(dl->run_steps);
}

void domain_losses_step(DomainLosses *dl, Group *cp_dp) {
    int k = dl->mix->k;
    // the stages before the last add zeros: the sums are the last stage's
    all_reduce_host(dl->sums, 2 * k, MPI_DOUBLE, MPI_SUM, cp_dp);
    for (int d = 0; d < k; d++) {
        dl->mean[d] = dl->sums[2 * d + 1] > 0 ? dl->sums[2 * d] / dl->sums[2 * d + 1] : NAN;
        if (isnan(dl->first_mean[d])) dl->first_mean[d] = dl->mean[d];
        if (!isnan(dl->mean[d])) dl->run[d] += dl->mean[d], dl->run_steps[d]++;
    }
    memset(dl->sums, 0, 2 * k * sizeof(double));
    dl->steps++;
}

void domain_losses_json(char *out, size_t size, const DomainLosses *dl) {
    size_t n = snprintf(out, size, "\"domain_loss\": {");
    for (int d = 0; d < dl->mix->k && n < size; d++) // a domain without rows this step: null
        n += isnan(dl->mean[d]) ? snprintf(out + n, size - n, "%s\"%s\": null", d ? ", " : "",
                                           dl->mix->domains[d].name)
                                : snprintf(out + n, size - n, "%s\"%s\": %.9g", d ? ", " : "",
                                           dl->mix->domains[d].name, dl->mean[d]);
    if (n < size) snprintf(out + n, size - n, "}");
}

void domain_losses_report(const DomainLosses *dl) {
    printf("domains: %d, each row drawn by its weight; per domain: weight, tokens in its file, "
           "its loss at the first step that drew it, its mean loss over the %d steps\n",
           dl->mix->k, dl->steps);
    for (int d = 0; d < dl->mix->k; d++) {
        const Domain *dom = &dl->mix->domains[d];
        printf("  %-16s %.4f %10ld  %.4f  %.4f\n", dom->name, dom->weight, dom->ds.num_tokens,
               dl->first_mean[d], dl->run_steps[d] ? dl->run[d] / dl->run_steps[d] : NAN);
    }
}
