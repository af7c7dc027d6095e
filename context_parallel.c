// Context parallelism: ring attention (Liu et al. 2023), as picotron's context_parallel.py.
//
// The sequence is split over the cp ranks; each holds T = S/cp tokens and their queries, keys
// and values. Attention needs every earlier key, so the key/value blocks travel round a ring:
// at step s a rank holds the block of rank (r - s) mod cp, computes its queries against it while
// the next block is already in flight, and merges the block's softmax into its running output
// with the log-sum-exp update, so the result equals attention over the whole sequence.
// Only the kv heads travel (grouped-query attention stays grouped).
// The backward sends the same blocks round again, each with its dk, dv accumulators: after cp
// steps every accumulator is home, holding the gradient of its own keys and values.
// Causal masking uses the global positions, so blocks wholly in the future are skipped. With
// zig-zag, rank r holds chunks r and 2cp-1-r of 2cp, so every rank does the same work.
// cp = 1 is a ring of one: the same code computes plain causal attention, and its backward
// skips the staging (nothing travels, so the gradients go straight to dk and dv).
#include "context_parallel.h"
#include <math.h>
#include "backend/backend.h"
#include "utils.h"

void context_parallel_positions(int *pos, int cp_rank, int cp, int S, int zigzag) {
    int T = S / cp;
    if (!zigzag) {
        for (int t = 0; t < T; t++) pos[t] = cp_rank * T + t;
        return;
    }
    int chunk = S / (2 * cp), late = 2 * cp - 1 - cp_rank;
    for (int t = 0; t < chunk; t++) {
        pos[t] = cp_rank * chunk + t;
        pos[chunk + t] = late * chunk + t;
    }
}

void ring_attention_init(RingAttention *ra, Group *cp, int B, int S, int H, int KV, int D,
                         int zigzag) {
    int T = S / cp->size;
    *ra = (RingAttention){.cp = cp, .B = B, .T = T, .H = H, .KV = KV, .D = D, .zigzag = zigzag};
    ra->positions_host = xmalloc((size_t)cp->size * T * sizeof(int));
    for (int r = 0; r < cp->size; r++)
        context_parallel_positions(ra->positions_host + r * T, r, cp->size, S, zigzag);
    int *positions = device_malloc((size_t)cp->size * T * sizeof(int));
    host_to_device(positions, ra->positions_host, (size_t)cp->size * T * sizeof(int));
    ra->positions = positions;
    size_t block = 4 * (size_t)B * T * KV * D; // k, v, dk, dv in flight (none on a ring of one)
    for (int i = 0; i < 2 && cp->size > 1; i++) ra->ring[i] = device_malloc(block * sizeof(float));
    ra->delta = device_malloc((size_t)B * H * T * sizeof(float));
}

void ring_attention_free(RingAttention *ra) {
    free(ra->positions_host);
    device_free((void *)ra->positions);
    device_free(ra->ring[0]);
    device_free(ra->ring[1]);
    device_free(ra->delta);
}

// a block is skipped when every key comes after every query
static int block_is_masked(const RingAttention *ra, int q_rank, int k_rank) {
    const int *qp = ra->positions_host + q_rank * ra->T, *kp = ra->positions_host + k_rank * ra->T;
    int q_max = qp[0], k_min = kp[0];
    for (int t = 1; t < ra->T; t++) {
        if (qp[t] > q_max) q_max = qp[t];
        if (kp[t] < k_min) k_min = kp[t];
    }
    return k_min > q_max;
}

void ring_attention_forward(float *out, float *lse, const float *q, const float *kv,
                            RingAttention *ra) {
    int B = ra->B, T = ra->T, H = ra->H, KV = ra->KV, D = ra->D;
    int rank = ra->cp->rank, cp = ra->cp->size;
    size_t kv_size = 2 * (size_t)B * T * KV * D, half = kv_size / 2;
    fill(out, 0.0f, (size_t)B * T * H * D);
    fill(lse, -INFINITY, (size_t)B * H * T);
    const float *block = kv;
    for (int step = 0; step < cp; step++) {
        int src = (rank - step + cp) % cp; // whose keys and values `block` holds
        Handle next;
        float *incoming = ra->ring[step % 2];
        if (step + 1 < cp)
            next = send_recv_start(block, (rank + 1) % cp, incoming, (rank - 1 + cp) % cp, kv_size,
                                   ra->cp);
        if (!block_is_masked(ra, rank, src)) {
            attention_forward_block(out, lse, q, block, block + half, ra->positions + rank * T,
                                    ra->positions + src * T, B, T, T, H, KV, D);
            ra->blocks_computed++;
        }
        if (step + 1 < cp) {
            comm_wait(&next);
            block = incoming;
        }
    }
}

void ring_attention_backward(float *dq, float *dkv, const float *dout, const float *q,
                             const float *kv, const float *out, const float *lse,
                             RingAttention *ra) {
    int B = ra->B, T = ra->T, H = ra->H, KV = ra->KV, D = ra->D;
    int rank = ra->cp->rank, cp = ra->cp->size;
    size_t half = (size_t)B * T * KV * D;
    // delta = rowsum(dout * out) is the same for every block: the softmax is over all keys
    attention_backward_delta(ra->delta, dout, out, B, T, H, D);
    if (cp == 1) { // a ring of one: the block is this rank's own, its gradients go straight home
        attention_backward_block(dq, dkv, dkv + half, dout, q, kv, kv + half, lse, ra->delta,
                                 ra->positions, ra->positions, B, T, T, H, KV, D);
        return;
    }
    float *block = ra->ring[0]; // k, v, dk, dv of the block this rank holds
    device_copy(block, kv, 2 * half * sizeof(float));
    device_zero(block + 2 * half, 2 * half * sizeof(float));
    for (int step = 0; step < cp; step++) {
        int src = (rank - step + cp) % cp;
        if (!block_is_masked(ra, rank, src))
            attention_backward_block(dq, block + 2 * half, block + 3 * half, dout, q, block,
                                     block + half, lse, ra->delta, ra->positions + rank * T,
                                     ra->positions + src * T, B, T, T, H, KV, D);
        // the accumulators travel on after their contribution, so they arrive home complete;
        // the last hop carries only them (k and v are home already)
        float *incoming = ra->ring[(step + 1) % 2];
        size_t skip = step == cp - 1 ? 2 * half : 0;
        send_recv(block + skip, (rank + 1) % cp, incoming + skip, (rank - 1 + cp) % cp,
                  4 * half - skip, ra->cp);
        block = incoming;
    }
    add_inplace(dkv, block + 2 * half, 2 * half);
}
