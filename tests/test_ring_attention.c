// Ring attention (context_parallel.c) over cp = world size ranks equals plain causal attention
// over the whole sequence computed on one rank (one attention_forward_block with positions
// 0..S-1, and its backward): out, lse, dq, dk and dv at every rank's positions agree within TOL
// relative to the largest |reference|, with the contiguous split and with zig-zag. Without
// zig-zag rank r computes r + 1 blocks (the causal imbalance: rank 0 one, rank cp-1 all cp);
// with zig-zag every rank computes the same number. Run with mpirun -np 2 and -np 4.
#include <math.h>
#include <string.h>
#include "backend/backend.h"
#include "context_parallel.h"
#include "process_group_manager.h"
#include "utils.h"
#include "tests/test_util.h"

// the ring merges cp partial softmaxes in float where the reference does one pass
#define TOL 1e-5
enum { B = 2, S = 32, H = 4, KV = 2, D = 8 };

static int failures;

// (B, T, W) = the rows at pos (T) of x (B, S, W)
static float *rows_at(const float *x, const int *pos, int T, int W) {
    float *out = xmalloc((size_t)B * T * W * sizeof(float));
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            memcpy(out + ((size_t)b * T + t) * W, x + ((size_t)b * S + pos[t]) * W,
                   W * sizeof(float));
    return out;
}

static void check(const char *what, int zigzag, const float *got_dev, const float *ref, size_t n) {
    double worst = rel_to_max_all_ranks(got_dev, ref, n);
    int bad = !(worst <= TOL);
    failures += bad;
    if (world_rank() == 0)
        printf("%-4s zigzag %d %-4s max rel diff %.1e (tol %.0e)\n", bad ? "FAIL" : "ok", zigzag,
               what, worst, TOL);
}

// reference on the whole sequence, host copies: out, dout (B,S,H,D), lse (B,H,S), dq, dk, dv
typedef struct {
    float *q, *k, *v, *dout, *out, *lse, *dq, *dk, *dv;
} Reference;

static Reference reference(void) {
    Reference ref;
    size_t nq = (size_t)B * S * H * D, nk = (size_t)B * S * KV * D, nl = (size_t)B * H * S;
    ref.q = random_host(nq), ref.k = random_host(nk), ref.v = random_host(nk);
    ref.dout = random_host(nq);
    int pos[S];
    for (int i = 0; i < S; i++) pos[i] = i;
    int *P = to_device(pos, sizeof pos);
    float *Q = to_device(ref.q, nq * 4), *K = to_device(ref.k, nk * 4);
    float *V = to_device(ref.v, nk * 4), *DOUT = to_device(ref.dout, nq * 4);
    float *OUT = device_malloc(nq * 4), *LSE = device_malloc(nl * 4);
    float *DELTA = device_malloc(nl * 4), *DQ = device_malloc(nq * 4);
    float *DK = device_malloc(nk * 4), *DV = device_malloc(nk * 4);
    fill(OUT, 0.0f, nq);
    fill(LSE, -INFINITY, nl);
    attention_forward_block(OUT, LSE, Q, K, V, P, P, B, S, S, H, KV, D);
    attention_backward_delta(DELTA, DOUT, OUT, B, S, H, D);
    attention_backward_block(DQ, DK, DV, DOUT, Q, K, V, LSE, DELTA, P, P, B, S, S, H, KV, D);
    ref.out = to_host(OUT, nq), ref.lse = to_host(LSE, nl), ref.dq = to_host(DQ, nq);
    ref.dk = to_host(DK, nk), ref.dv = to_host(DV, nk);
    void *dev[] = {P, Q, K, V, DOUT, OUT, LSE, DELTA, DQ, DK, DV};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) device_free(dev[i]);
    return ref;
}

static void check_ring(const Reference *ref, Group *cp, int zigzag) {
    int T = S / cp->size, pos[S];
    context_parallel_positions(pos, cp->rank, cp->size, S, zigzag);
    size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * KV * D, nl = (size_t)B * H * T;
    float *q = rows_at(ref->q, pos, T, H * D), *dout = rows_at(ref->dout, pos, T, H * D);
    float *k = rows_at(ref->k, pos, T, KV * D), *v = rows_at(ref->v, pos, T, KV * D);
    float *out_ref = rows_at(ref->out, pos, T, H * D), *dq_ref = rows_at(ref->dq, pos, T, H * D);
    float *dk_ref = rows_at(ref->dk, pos, T, KV * D), *dv_ref = rows_at(ref->dv, pos, T, KV * D);
    float *lse_ref = xmalloc(nl * sizeof(float)); // (B, H, S) -> (B, H, T)
    for (int bh = 0; bh < B * H; bh++)
        for (int t = 0; t < T; t++) lse_ref[bh * T + t] = ref->lse[bh * S + pos[t]];
    float *kv = xmalloc(2 * nk * sizeof(float)); // (2, B, T, KV, D): k then v
    memcpy(kv, k, nk * sizeof(float));
    memcpy(kv + nk, v, nk * sizeof(float));
    float *Q = to_device(q, nq * 4), *KV_ = to_device(kv, 2 * nk * 4);
    float *DOUT = to_device(dout, nq * 4), *OUT = device_malloc(nq * 4);
    float *LSE = device_malloc(nl * 4), *DQ = device_malloc(nq * 4);
    float *DKV = device_malloc(2 * nk * 4);
    RingAttention ra;
    ring_attention_init(&ra, cp, B, S, H, KV, D, zigzag);
    ring_attention_forward(OUT, LSE, Q, KV_, &ra);
    long blocks = ra.blocks_computed;
    ring_attention_backward(DQ, DKV, DOUT, Q, KV_, OUT, LSE, &ra);
    check("out", zigzag, OUT, out_ref, nq);
    check("lse", zigzag, LSE, lse_ref, nl);
    check("dq", zigzag, DQ, dq_ref, nq);
    check("dk", zigzag, DKV, dk_ref, nk);
    check("dv", zigzag, DKV + nk, dv_ref, nk);

    long *all = xmalloc(cp->size * sizeof(long));
    mpiCheck(MPI_Allgather(&blocks, 1, MPI_LONG, all, 1, MPI_LONG, cp->comm));
    int bad = 0;
    for (int r = 0; r < cp->size; r++) bad |= all[r] != (zigzag ? all[0] : r + 1);
    if (!zigzag && cp->size > 1) bad |= all[0] == all[cp->size - 1];
    failures += bad;
    if (world_rank() == 0) {
        printf("%-4s zigzag %d blocks computed per rank (forward):", bad ? "FAIL" : "ok", zigzag);
        for (int r = 0; r < cp->size; r++) printf(" %ld", all[r]);
        printf(zigzag ? "  (expected all equal)\n" : "  (expected rank r: r + 1)\n");
    }
    ring_attention_free(&ra);
    void *dev[] = {Q, KV_, DOUT, OUT, LSE, DQ, DKV};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) device_free(dev[i]);
    float *host[] = {q, dout, k, v, out_ref, dq_ref, dk_ref, dv_ref, lse_ref, kv};
    for (size_t i = 0; i < sizeof host / sizeof *host; i++) free(host[i]);
    free(all);
}

int main(int argc, char **argv) {
    int world = mpi_test_init(&argc, &argv, 0x13198A2E03707344ull);
    ProcessGroupManager pgm;
    process_group_manager_init(&pgm, 1, world, 1, 1, 1);
    if (S % (2 * world))
        user_error("S = %d must divide by 2*cp: run with mpirun -np 1, 2, 4 "
                   "or 8 (not %d)",
                   S, world);
    if (pgm.global_rank == 0)
        printf("ring attention, cp = %d, B=%d S=%d H=%d KV=%d D=%d\n", world, B, S, H, KV, D);
    Reference ref = reference();
    check_ring(&ref, &pgm.cp, 0);
    check_ring(&ref, &pgm.cp, 1);
    if (pgm.global_rank == 0) printf("%d check(s) failed\n", failures);
    float *host[] = {ref.q, ref.k, ref.v, ref.dout, ref.out, ref.lse, ref.dq, ref.dk, ref.dv};
    for (size_t i = 0; i < sizeof host / sizeof *host; i++) free(host[i]);
    process_group_manager_free(&pgm);
    mpiCheck(MPI_Finalize());
    return failures ? 1 : 0;
}
