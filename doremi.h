// Training on a mixture of domains (dataset.domains), the data side of DoReMi (Xie et al. 2023):
// each sample of the global order is drawn from a domain by the domains' weights, with a
// counter-based generator keyed by the seed, so the rows of a step follow from the step alone
// and every layout reads the same ones, as with one corpus (data.c).
#pragma once
#include <stdio.h>
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
// (allocated); weights_file (NULL: none), a domain_weights.json, gives every domain's weight.
// A malformed spec or file is one line naming the entry
char *domain_list_json(const char *spec, const char *weights_file);
// the domain global sample g is drawn from, and which of that domain's samples it is
int domain_mixture_draw(long *index, DomainMixture *mix, long g);

// another sampler over mix's domains (its own count of draws), and ds its view for a loader:
// DoReMi's reference reads the step's rows again, and counts each domain's rows ahead
void domain_mixture_view(DomainMixture *view, Dataset *ds, const DomainMixture *mix);
void domain_mixture_view_free(DomainMixture *view);

// DoReMi's proxy run (doremi.reference_checkpoint set): the domain weights alpha, learned by an
// exponentiated-gradient step on each domain's excess loss over a reference model, which runs
// beside the proxy (this rank's shard of it, forward only) on the same rows.
typedef struct {
    double eta, c;
    double *alpha;     // (k): the weights step t's loss uses, alpha_{t-1} (alpha_0 uniform)
    double *used;      // (k): the weights the last step trained with, for its metrics line
    double *alpha_sum; // (k): the sum of alpha_t over the steps so far, for their average
    double *excess;    // (k): lambda_t, the last step's excess loss of each domain
    long *rows;        // (k): each domain's rows in this step's global batch
    Model ref;
    MicroBatchDataLoader ref_loader;
    Dataset ref_ds, count_ds;
    DomainMixture ref_mix, count_mix;
    float *ref_losses; // (grad_acc, N): the reference's token losses of this step's micro-batches
    float *scale_host; // (N): a micro-batch's loss weight of each token
    float *scale;      // (N) device
    int micro;         // this step's micro-batches seen by the loss hook
    int steps_before;  // the steps of the run this one resumed, in alpha_sum
    FILE *log;         // save_dir/domain_weights.jsonl, on the logging rank
} DoReMi;

// Each domain's loss, logged every step, DoReMi or not: the mean token loss of the step's rows
// from that domain, over all cp x dp replicas. The model's loss hook hands it each micro-batch's
// token losses on the last stage, where the loader holds that micro-batch's rows' domains.
typedef struct {
    const DomainMixture *mix;
    const MicroBatchDataLoader *loader;
    float *host;     // (N): a micro-batch's token losses, copied from the device
    double *sums;    // (3k): this step's loss sum, token count and excess-loss sum of each domain
    double *mean;    // (k): the last step's mean loss of each domain (NAN: no rows)
    double *first;   // (k): each domain's first mean (NAN until a step draws it)
    double *run;     // (k): the sum of its means over the steps that drew it
    long *run_steps; // (k): those steps
    ProcessGroupManager *pgm;
    int steps, logger;
    DoReMi *doremi; // NULL: no DoReMi
} DomainLosses;

// logger: this rank writes the run's report and domain_weights files. With
// cfg->doremi_reference, the reference is built on shard and loaded (verified as ./train does)
void domain_losses_init(DomainLosses *dl, Model *model, const DomainMixture *mix,
                        const MicroBatchDataLoader *loader, const ModelShard *shard, int logger,
                        int first_step);
void domain_losses_free(DomainLosses *dl);
// before step `step` (from 0): DoReMi's reference forward over the step's micro-batches, and
// each domain's rows in the step, for the proxy's loss weights
void domain_losses_begin(DomainLosses *dl, int step);
// after the step's forwards, on every rank: the means into dl->mean and, with DoReMi, the new
// weights (identical on every rank: the sums are reduced over cp x dp, then over pp)
void domain_losses_step(DomainLosses *dl, int step);
// the metrics line's members: "domain_loss": {"name": mean, ...} and, with DoReMi,
// "domain_weight": {...} (the weights the step trained with) and "doremi_loss"
void domain_losses_json(char *out, size_t size, const DomainLosses *dl);
// the run's summary: each domain's share, tokens, first and mean loss; with DoReMi, the learned
// weights, also written to save_dir/domain_weights.json
void domain_losses_report(const DomainLosses *dl, const char *save_dir);
