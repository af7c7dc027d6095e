// Expert parallelism (DeepSpeed-MoE, Rajbhandari et al. 2022; GShard, Lepikhin et al. 2020): the
// experts of each mixture-of-experts layer are split over ep ranks, rank r holding experts
// [r*E/ep, (r+1)*E/ep). The ep ranks are data-parallel ranks: each routes its own tokens, and
// everything but the experts (attention, norms, the router, the embedding) stays replicated.
//
// One layer's forward, on each of the ep ranks (moe.c calls the three steps):
//   route:    every token picks its K experts among all E (the router is replicated), and the
//             (token, choice) pairs are sorted by expert; since a rank's experts are consecutive,
//             the sorted pairs are already grouped by the rank that holds their expert
//   counts:   each rank tells every other how many pairs it sends each of its experts, one
//             all-to-all of E counts per rank: the receivers size their buffers and learn where
//             each expert's rows start (expert_parallel_counts)
//   dispatch: the pairs' inputs travel in one all-to-all (expert_parallel_to_experts); a rank
//             receives, from each source rank in turn, the rows of each of its experts
//   experts:  each local expert runs on its rows from every source (moe.c: one product per
//             source and expert, no reordering)
//   combine:  the outputs travel back the same way reversed (expert_parallel_to_tokens), each
//             landing where its pair stood in the sender's sorted buffer, and are weighted there.
// The backward reverses the two exchanges: d out goes to the experts as the inputs did, d x comes
// back as the outputs did, with the same counts, saved per micro-batch (ExpertExchange).
//
// Gradients: an expert's gradient on its rank sums over the tokens of all ep ranks; its other
// replicas are the ranks with the same ep_rank in the other ep groups (process_group_manager's
// expert_dp). The experts' buckets (below, through data_parallel.c's BucketSync) are averaged
// over those and divided by ep, so every expert ends with the mean over all cp*dp replicas'
// tokens, as a dense weight does.
// The capacity (moe.c) is a limit per source rank: each rank keeps at most `capacity` pairs of its
// own micro-batch per expert, as one rank with that micro-batch would, so the dropped pairs are
// the same whatever ep is, and a rank receives at most ep * capacity rows per expert.
#include "expert_parallel.h"
#include "backend/backend.h"
#include "data_parallel.h"
#include "utils.h"

void expert_parallel_init(ExpertParallel *ep, Group *group, int num_experts) {
    int size = group ? group->size : 1, rank = group ? group->rank : 0;
    if (num_experts % size != 0)
        FAIL("distributed.ep_size must divide model.num_experts (config_validate checks)",
             "%d experts over %d ep ranks", num_experts, size);
    *ep = (ExpertParallel){.group = size > 1 ? group : NULL,
                           .first = rank * (num_experts / size),
                           .num_local = num_experts / size};
}

void expert_exchange_alloc(ExpertExchange *x, int ep, int num_local) {
    x->segments = xmalloc(((size_t)ep * num_local + 1) * sizeof(int));
    x->send = xmalloc((size_t)ep * sizeof(size_t));
    x->recv = xmalloc((size_t)ep * sizeof(size_t));
}

void expert_exchange_free(ExpertExchange *x) {
    free(x->segments);
    free(x->send);
    free(x->recv);
}

int expert_parallel_counts(ExpertExchange *x, const int *offsets, int C, ExpertParallel *ep) {
    int El = ep->num_local;
    if (!ep->group) { // every expert here: the sorted pairs are the experts' rows
        for (int e = 0; e <= El; e++) x->segments[e] = offsets[e];
        x->send[0] = x->recv[0] = (size_t)offsets[El] * C;
        return offsets[El];
    }
    int size = ep->group->size, S = size * El;
    size_t *pairs = xmalloc(2 * (size_t)S * sizeof(size_t)), *arriving = pairs + S;
    for (int e = 0; e < S; e++) pairs[e] = (size_t)(offsets[e + 1] - offsets[e]);
    double start = now_seconds();
    all_to_all_host_counts(arriving, pairs, El, ep->group);
    ep->seconds += now_seconds() - start;
    x->segments[0] = 0;
    for (int r = 0; r < size; r++) {
        size_t in = 0;
        for (int e = r * El; e < (r + 1) * El; e++) {
            in += arriving[e];
            x->segments[e + 1] = x->segments[e] + (int)arriving[e];
        }
        x->send[r] = (size_t)(offsets[(r + 1) * El] - offsets[r * El]) * C;
        x->recv[r] = in * C;
    }
    free(pairs);
    return x->segments[S];
}

// one all-to-all, timed and counted for the report (the trace counts it too, when on)
static void exchange(float *recv, const size_t *recv_counts, const float *send,
                     const size_t *send_counts, ExpertParallel *ep) {
    double start = now_seconds();
    all_to_all(recv, recv_counts, send, send_counts, ep->group);
    ep->seconds += now_seconds() - start;
    for (int r = 0; r < ep->group->size; r++)
        if (r != ep->group->rank) ep->bytes += (double)send_counts[r] * sizeof(float);
    ep->calls++;
}

void expert_parallel_to_experts(float *recv, const float *send, const ExpertExchange *x,
                                ExpertParallel *ep) {
    if (ep->group) exchange(recv, x->recv, send, x->send, ep);
}

void expert_parallel_to_tokens(float *recv, const float *send, const ExpertExchange *x,
                               ExpertParallel *ep) {
    if (ep->group) exchange(recv, x->send, send, x->recv, ep);
}

// a bucket holds experts' tensors only or none
static int begins_bucket(void *ctx, const ParamInfo *prev, const ParamInfo *t) {
    (void)ctx;
    return t->expert != prev->expert;
}

static Handle start_bucket(void *ctx, int b) {
    ExpertBuckets *eb = ctx;
    float *bucket = eb->dp->grads + eb->dp->start[b];
    size_t n = eb->dp->size[b];
    if (!eb->expert[b]) return all_reduce_start(bucket, n, REDUCE_AVG, eb->group);
    scale_inplace(bucket, 1.0f / eb->ep, n);
    return all_reduce_start(bucket, n, REDUCE_AVG, eb->expert_group);
}

void expert_parallel_buckets_init(ExpertBuckets *eb, DataParallel *dp, Model *model, Group *group,
                                  Group *expert_group, int ep) {
    *eb = (ExpertBuckets){.dp = dp, .group = group, .expert_group = expert_group, .ep = ep};
    BucketSync sync = {.begins_bucket = begins_bucket, .start = start_bucket, .ctx = eb};
    data_parallel_init(dp, model, group, &sync);
    eb->expert = xmalloc(dp->num_buckets * sizeof(int));
    for (int b = 0, i = 0; b < dp->num_buckets; b++) { // the tensor the bucket starts in
        while (i + 1 < model->num_tensors && model->table[i + 1].offset <= dp->start[b]) i++;
        eb->expert[b] = model->table[i].expert;
    }
}

void expert_parallel_buckets_free(ExpertBuckets *eb) {
    free(eb->expert);
}
