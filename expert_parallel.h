// Expert parallelism (expert_parallel.c): the experts of a mixture-of-experts layer split over the
// ep ranks, tokens sent to the ranks that hold their experts and their outputs sent back.
#pragma once
#include <stddef.h>
#include "backend/comm.h"

typedef struct {
    Group *group;          // the ep ranks (process_group_manager's ep); NULL: every expert here
    int first, num_local;  // this rank's experts: [first, first + num_local) of the layer's E
    double bytes, seconds; // the all-to-alls so far: bytes this rank sent others, time they took
    long calls;
} ExpertParallel;

// What one micro-batch's exchange needs again in its backward: host arrays, per slot
typedef struct {
    int *segments;       // (ep * El + 1): rows of the experts' buffer from source rank s for local
                         // expert e are [segments[s*El + e], segments[s*El + e + 1])
    size_t *send, *recv; // (ep): floats to and from each ep rank in the dispatch
} ExpertExchange;

// rank r holds experts [r * E/ep, (r+1) * E/ep); ep 1 (group NULL) holds all
void expert_parallel_init(ExpertParallel *ep, Group *group, int num_experts);
void expert_exchange_alloc(ExpertExchange *x, int ep, int num_local);
void expert_exchange_free(ExpertExchange *x);

// Counts first: from offsets (E + 1) of this rank's pairs sorted by global expert, what goes to
// each ep rank, and what comes back from each; fills x and returns the rows the experts receive
int expert_parallel_counts(ExpertExchange *x, const int *offsets, int C, ExpertParallel *ep);
// The dispatch: recv (rows, C), grouped by source rank then local expert, from send (pairs, C)
// grouped by global expert; the backward sends d out the same way
void expert_parallel_to_experts(float *recv, const float *send, const ExpertExchange *x,
                                ExpertParallel *ep);
// The combine: each pair's expert output back to the rank of its token, in send's order; the
// backward returns d x the same way
void expert_parallel_to_tokens(float *recv, const float *send, const ExpertExchange *x,
                               ExpertParallel *ep);

// The experts' gradient buckets: a rank's experts' gradients already sum the tokens of its ep
// group's ranks. Their replicas are the cp*dp/ep ranks with the same experts (expert_group), so
// the experts' tensors get buckets of their own, averaged over those ranks and divided by ep: the
// mean over all cp*dp replicas' tokens, as for every other weight (averaged over group).
typedef struct DataParallel DataParallel;
typedef struct Model Model;
typedef struct {
    DataParallel *dp;
    int *expert; // (num_buckets) 1: a bucket of experts' tensors
    Group *group, *expert_group;
    int ep;
} ExpertBuckets;
// data_parallel_init(dp, model, group) with the experts' buckets apart
void expert_parallel_buckets_init(ExpertBuckets *eb, DataParallel *dp, Model *model, Group *group,
                                  Group *expert_group, int ep);
void expert_parallel_buckets_free(ExpertBuckets *eb);
