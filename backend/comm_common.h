// What the two builds' collectives share: the MPI side of every call (the CPU build's only side,
// the GPU build's "mpi" backend). Included by backend/cpu/comm_mpi.c and backend/cuda/comm_nccl.cu.
#pragma once
#include <limits.h>
#include <sched.h>
#include <string.h>
#include <time.h>
#include "backend/comm.h"
#include "backend/comm_log.h"
#include "utils.h"

// one tag for every point-to-point message: MPI then keeps them in order between two ranks, so a
// send() on one side matches the receive half of a send_recv() on the other
#define TAG 0

static inline int mpi_count(size_t n, const char *what) {
    if (n > INT_MAX)
        FAIL("split the buffer: one MPI call moves at most 2^31-1 floats",
             "%s of %zu floats exceeds INT_MAX", what, n);
    return (int)n;
}

// What a wait does between two polls. The first polls yield the core: the rank waited for may be
// ready to run on it, and a short wait (an all-reduce among busy peers) ends soonest this way. A
// wait that goes on (a pipeline stage waiting for its neighbour's whole forward) naps, doubling up
// to NAP_MAX_US: with more ranks than cores, ranks that only poll would otherwise take turns on
// the cores with the ranks that compute.
#define YIELD_POLLS 64
#define NAP_MAX_US  200
static inline void wait_pause(int polls) {
    if (polls < YIELD_POLLS) {
        sched_yield();
        return;
    }
    int doublings = polls - YIELD_POLLS; // 1, 2, 4, ... 128 us, then NAP_MAX_US
    struct timespec nap = {0, (doublings < 8 ? 1L << doublings : NAP_MAX_US) * 1000L};
    nanosleep(&nap, NULL);
}

// REDUCE_AVG travels as a sum: comm_wait divides buf[0, n) by the group's size once it arrives
static inline void average_when_done(Handle *h, ReduceOp op, float *buf, size_t n, Group *g) {
    if (op != REDUCE_AVG) return;
    h->avg_buf = buf;
    h->avg_n = n;
    h->avg_size = g->size;
}

// the MPI reduction of a ReduceOp: REDUCE_AVG travels as a sum (average_when_done divides)
static inline MPI_Op mpi_reduce_op(ReduceOp op) {
    return op == REDUCE_MAX ? MPI_MAX : MPI_SUM;
}

// reduce_scatter and all_gather: n must be a multiple of the group's size, since NCCL's pieces
// are all alike (and so are MPI's *_block ones); returns the piece
static inline size_t piece_of(size_t n, const char *what, Group *g) {
    if (n % g->size != 0)
        FAIL("pad the buffer to a multiple of the group size (data_parallel.c does)",
             "%s of %zu floats over %d ranks", what, n, g->size);
    return n / g->size;
}

// all_to_all: the floats that come back to this rank from itself (a copy, never on the wire),
// which both count arrays must agree on; and where that part starts in sendbuf and recvbuf
static inline size_t all_to_all_self(size_t *send_at, size_t *recv_at, const size_t *recv_counts,
                                     const size_t *send_counts, Group *g) {
    if (recv_counts[g->rank] != send_counts[g->rank])
        FAIL("recv_counts[r] must equal rank r's send_counts[this rank]: exchange the counts "
             "first with all_to_all_host_counts",
             "all_to_all on rank %d sends itself %zu floats but expects %zu", g->rank,
             send_counts[g->rank], recv_counts[g->rank]);
    *send_at = *recv_at = 0;
    for (int r = 0; r < g->rank; r++) {
        *send_at += send_counts[r];
        *recv_at += recv_counts[r];
    }
    return send_counts[g->rank];
}

// all_to_all's bytes sent, for comm_log.c: what goes to the other ranks, not to itself
static inline size_t all_to_all_bytes(const size_t *send_counts, Group *g) {
    size_t n = 0;
    for (int r = 0; r < g->size; r++)
        if (r != g->rank) n += send_counts[r];
    return n * sizeof(float);
}

// MPI_Ialltoallv's int arrays, laid out send counts, send displacements, receive counts, receive
// displacements (g->size each); kept in h until the call ends, since MPI reads them until then.
// Returns the floats sent (*send_n) and received in all.
static inline size_t mpi_all_to_all_layout(Handle *h, size_t *send_n, const size_t *recv_counts,
                                           const size_t *send_counts, Group *g) {
    int size = g->size;
    int *layout = (int *)xmalloc(4 * (size_t)size * sizeof(int));
    size_t at[2] = {0, 0};
    for (int r = 0; r < size; r++) {
        const size_t *counts[2] = {send_counts, recv_counts};
        for (int side = 0; side < 2; side++) {
            layout[(2 * side) * size + r] = mpi_count(counts[side][r], "all_to_all count");
            layout[(2 * side + 1) * size + r] = mpi_count(at[side], "all_to_all displacement");
            at[side] += counts[side][r];
        }
    }
    h->mpi_layout = layout;
    *send_n = at[0];
    return at[1];
}

// what comm_log.c calls a send_recv with one half skipped (a NULL buffer)
static inline CommOp p2p_op(const float *sendbuf, const float *recvbuf) {
    return !recvbuf ? OP_SEND : !sendbuf ? OP_RECV : OP_SEND_RECV;
}

// a handle with nothing in flight: comm_wait() on it returns at once
static inline Handle handle_done(void) {
    Handle h;
    memset(&h, 0, sizeof h);
    h.req[0] = h.req[1] = MPI_REQUEST_NULL;
    return h;
}

// A lone send or recv needs another rank of the group at the other end: to itself, or in a group
// of one, it would wait forever. send_recv may name itself: its receive is already posted.
static inline void check_peer(int peer, int allow_self, const char *what, Group *g) {
    if (peer < 0 || peer >= g->size || (peer == g->rank && !allow_self))
        FAIL("point-to-point peers are ranks of the same group (pp_prev/pp_next, the cp ring); "
             "skip the call when the axis has size 1",
             "%s peer %d from rank %d in a group of %d", what, peer, g->rank, g->size);
}
