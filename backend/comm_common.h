// What the two builds' collectives share: the MPI side of every call (the CPU build's only side,
// the GPU build's "mpi" backend). Included by backend/cpu/comm_mpi.c and backend/cuda/comm_nccl.cu.
#pragma once
#include <limits.h>
#include <string.h>
#include "backend/comm.h"
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
