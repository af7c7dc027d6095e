// Training on a mixture of domains (dataset.domains), the data side of DoReMi (Xie et al. 2023):
// each sample of the global order is drawn from a domain by the domains' weights, with a
// counter-based generator keyed by the seed, so the rows of a step follow from the step alone
// and every layout reads the same ones, as with one corpus (data.c).
#pragma once
#include "config.h"
#include "data.h"
#include "model.h"

typedef struct {
    char name[64];
    Dataset ds;
    double weight; // normalised: the weights sum to 1
    long samples;  // windows of seq_length + 1 tokens in its file
} Domain;

typedef struct {
    int k; // domains
    Domain *domains;
    double *cumulative; // (k): the weights' running sums, the last exactly 1
    uint64_t key;       // the sampler's stream, from training.seed
    int seq_length;
    // the draws so far: global samples [0, scanned) drawn, drawn[d] of them from domain d
    long scanned, *drawn;
} DomainMixture;

// Reads cfg->dataset_domains ([{"name", "path", "weight"}, ...]; weight > 0, 1 when left out),
// opens each domain's file as dataset.name would be, and makes ds the mixture's view for the
// loader. A malformed list, a duplicate name or a bad file: one line naming the domain, exit 1.
void domain_mixture_open(DomainMixture *mix, Dataset *ds, const Config *cfg);
void domain_mixture_free(DomainMixture *mix);
// create_config's --domains name=path[:weight],...: the dataset.domains list as JSON text
// (allocated); a malformed spec is one line naming the entry
char *domain_list_json(const char *spec);
// the domain global sample g is drawn from, and which of that domain's samples it is
int domain_mixture_draw(long *index, DomainMixture *mix, long g);

// Each domain's loss, logged every step, DoReMi or not: the mean token loss of the step's rows
// from that domain, over all cp x dp replicas. The model's loss hook hands it each micro-batch's
// token losses on the last stage, where the loader holds that micro-batch's rows' domains.
typedef struct {
    const DomainMixture *mix;
    const MicroBatchDataLoader *loader;
    float *host;  // (N): a micro-batch's token losses, copied from the device
    double *sums; // (2k): this step's loss sum and token count of each domain
    double *mean; // (k): the last step's mean loss of each domain (NAN: no rows)
    double *first_mean,
        *run; // (k): the first mean (NAN until a step draws it); the sums of the means, and counts
    long *run_steps;
    int steps;
} DomainLosses;

void domain_losses_init(DomainLosses *dl, Model *model, const DomainMixture *mix,
                        const MicroBatchDataLoader *loader);
void domain_losses_free(DomainLosses *dl);
// after the step's forwards, on every rank: the means over the cp x dp replicas into dl->mean
void domain_losses_step(DomainLosses *dl, Group *cp_dp);
// the metrics line's member: "domain_loss": {"name": mean, ...}
void domain_losses_json(char *out, size_t size, const DomainLosses *dl);
// the run's summary: each domain's share, tokens, first and mean loss
void domain_losses_report(const DomainLosses *dl);
