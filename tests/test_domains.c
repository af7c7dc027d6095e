// The domain sampler (doremi.c) against what it promises, on token files whose every token names
// its domain and position (token = domain * SPAN + position), so a row says where it came from:
//  1. the domain counts over many samples match the weights: Pearson's chi-square below the
//     0.001 quantile of its distribution, and far above it against the wrong weights;
//  2. each domain is read in order, its n-th draw being its window n, wrapping at its end;
//  3. every dp x grad_acc x mbs layout with the same global batch reads the same rows, each rank
//     with its own sampler (as each rank of a run has);
//  4. a sampler that starts at a later step (a resumed run) reads what one that ran through does.
// Tolerance: none but the chi-square bound; rows are compared exactly.
//
// usage: test_domains DIR   (scratch files in DIR)
#include "doremi.h"
#include "test_util.h"
#include "utils.h"
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define SPAN    1000000 // token = domain * SPAN + position
#define SEQ     8
#define SAMPLES 60000 // draws for the chi-square
// chi-square quantiles at 0.999, by degrees of freedom (1 to 3): a correct sampler exceeds it
// once in a thousand seeds
static const double CHI2_999[] = {10.83, 13.82, 16.27};
#define K 3
static const double WEIGHTS[K] = {5, 3, 2}; // as the config gives them: normalised to 0.5, 0.3, 0.2
static const int LENGTHS[K] = {4001, 801, 81}; // tokens: 500, 100 and 10 windows


static Config config_for(const char *dir) {
    Config cfg;
    config_defaults(&cfg);
    cfg.seq_length = SEQ;
    cfg.vocab_size = INT_MAX; // the tokens name positions, not words
    static char list[4096];
    int n = snprintf(list, sizeof list, "[");
    for (int d = 0; d < K; d++)
        n += snprintf(list + n, sizeof list - n,
                      "%s{\"name\": \"d%d\", \"path\": \"%s/d%d.tok\", "
                      "\"weight\": %g}",
                      d ? ", " : "", d, dir, d, WEIGHTS[d]);
    snprintf(list + n, sizeof list - n, "]");
    cfg.dataset_domains = list;
    return cfg;
}

static double chi_square(const long *counts, const double *p, long n) {
    double x2 = 0;
    for (int d = 0; d < K; d++) x2 += pow(counts[d] - n * p[d], 2) / (n * p[d]);
    return x2;
}

// 1 and 2: the domains' shares, and each domain read in order
static void check_draws(const Config *cfg) {
    DomainMixture mix;
    Dataset ds;
    domain_mixture_open(&mix, &ds, cfg);
    long counts[K] = {0}, order_errors = 0;
    int in[SEQ], tg[SEQ], domain;
    for (long g = 0; g < SAMPLES; g++) {
        dataset_get_batch(in, tg, &domain, &ds, (int)g, 0, 1, 1, SEQ, 0, 1, 0);
        long n = counts[domain]++; // this domain's n-th draw: its window n mod its windows
        long want = (long)domain * SPAN + (n % mix.domains[domain].samples) * SEQ;
        for (int t = 0; t < SEQ; t++) order_errors += in[t] != want + t || tg[t] != want + t + 1;
    }
    double p[K], uniform[K], x2, wrong;
    for (int d = 0; d < K; d++) p[d] = mix.domains[d].weight, uniform[d] = 1.0 / K;
    x2 = chi_square(counts, p, SAMPLES), wrong = chi_square(counts, uniform, SAMPLES);
    printf("%d samples: domains drawn %ld %ld %ld times for weights %.2f %.2f %.2f; chi-square "
           "%.2f (bound %.2f at 0.999, 2 degrees of freedom); against uniform weights %.0f\n",
           SAMPLES, counts[0], counts[1], counts[2], p[0], p[1], p[2], x2, CHI2_999[K - 2], wrong);
    CHECK(x2 < CHI2_999[K - 2], "chi-square %.2f above %.2f", x2, CHI2_999[K - 2]);
    CHECK(wrong > 100 * CHI2_999[K - 2], "the wrong weights' chi-square %.0f is not far above",
          wrong);
    CHECK(fabs(p[0] - 0.5) < 1e-15 && fabs(p[1] - 0.3) < 1e-15 && fabs(p[2] - 0.2) < 1e-15,
          "weights 5 3 2 normalise to %.17g %.17g %.17g", p[0], p[1], p[2]);
    printf("every row is its domain's next window (domain d2's 10 windows wrapped %ld times): "
           "%ld tokens differ\n",
           counts[2] / 10, order_errors);
    CHECK(order_errors == 0, "%ld tokens are not their domain's next window", order_errors);
    domain_mixture_free(&mix);
}

// 3 and 4: the rows of steps [0, STEPS) in several layouts, each rank with its own sampler
#define STEPS        12
#define GLOBAL_BATCH 8
static void check_layouts(const Config *cfg) {
    static int want[STEPS][GLOBAL_BATCH][SEQ], want_domain[STEPS][GLOBAL_BATCH];
    const int layouts[][3] = {{1, 1, 8}, {1, 4, 2}, {2, 2, 2}, {4, 1, 2}, {8, 1, 1}}; // dp ga mbs
    int in[GLOBAL_BATCH * SEQ], tg[GLOBAL_BATCH * SEQ], dom[GLOBAL_BATCH];
    long differ = 0;
    for (size_t l = 0; l < sizeof layouts / sizeof layouts[0]; l++) {
        int dp = layouts[l][0], ga = layouts[l][1], mbs = layouts[l][2];
        for (int r = 0; r < dp; r++) {
            DomainMixture mix;
            Dataset ds;
            domain_mixture_open(&mix, &ds, cfg);
            for (int step = 0; step < STEPS; step++)
                for (int m = 0; m < ga; m++) {
                    dataset_get_batch(in, tg, dom, &ds, step, m, ga, mbs, SEQ, r, dp, 0);
                    for (int b = 0; b < mbs; b++) {
                        int g = (m * mbs + b) * dp + r; // its place in the step's global batch
                        if (l == 0) {
                            memcpy(want[step][g], in + b * SEQ, sizeof want[step][g]);
                            want_domain[step][g] = dom[b];
                        } else {
                            differ +=
                                memcmp(want[step][g], in + b * SEQ, sizeof want[step][g]) != 0;
                            differ += want_domain[step][g] != dom[b];
                        }
                    }
                }
            domain_mixture_free(&mix);
        }
    }
    printf("dp x grad_acc x mbs = 1x1x8, 1x4x2, 2x2x2, 4x1x2, 8x1x1 over %d steps: %ld rows "
           "differ from 1x1x8's\n",
           STEPS, differ);
    CHECK(differ == 0, "%ld rows or domains differ between layouts", differ);
    // a resumed run: its sampler's first question is step 7's
    DomainMixture mix;
    Dataset ds;
    domain_mixture_open(&mix, &ds, cfg);
    differ = 0;
    for (int step = 7; step < STEPS; step++) {
        dataset_get_batch(in, tg, dom, &ds, step, 0, 1, GLOBAL_BATCH, SEQ, 0, 1, 0);
        for (int g = 0; g < GLOBAL_BATCH; g++)
            differ += memcmp(want[step][g], in + g * SEQ, sizeof want[step][g]) != 0 ||
                      want_domain[step][g] != dom[g];
    }
    printf("a sampler started at step 7 (a resumed run): %ld rows differ\n", differ);
    CHECK(differ == 0, "%ld rows differ after a resume", differ);
    domain_mixture_free(&mix);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    for (int d = 0; d < K; d++) {
        int *tokens = xmalloc(LENGTHS[d] * sizeof(int));
        for (int i = 0; i < LENGTHS[d]; i++) tokens[i] = d * SPAN + i;
        char path[1024];
        snprintf(path, sizeof path, "%s/d%d.tok", argv[1], d);
        tokens_write(path, tokens, LENGTHS[d], 0, 0);
        free(tokens);
    }
    Config cfg = config_for(argv[1]);
    check_draws(&cfg);
    check_layouts(&cfg);
    printf("%d failures\n", failures);
    return failures > 0;
}
