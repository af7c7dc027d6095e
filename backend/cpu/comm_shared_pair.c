// The all-reduce of a tensor-parallel pair on one node, through memory the two ranks share
// (beyond picotron, whose NCCL does the same inside a GPU node). Each rank copies its partial sum
// into its own slot of an MPI shared-memory window and raises a counter; the partner, seeing it,
// adds the slot straight into its own buffer. Over MPI (comm_mpi.c's pair exchange) each message
// takes a rendezvous: the receiver copies through the kernel (process_vm_readv) and answers, and
// the sender's request ends only when it hears back, so both ranks must get a core twice per
// exchange. Here each gets it once, and no copy goes through the kernel.
//
// Two slots a rank, used by turns: exchange s writes slot s % 2 once the partner has read
// exchange s - 2 from it. The tp pair's exchanges never overlap (a region's sum, or the input
// gradient's sum while the weight gradients are computed), and both ranks make them in the same
// order, so the counters are the only handshake.
#include <stdatomic.h>
#include "backend/comm_common.h"
#include "backend/cpu/comm_shared_pair.h"

typedef struct {
    _Atomic long written, read; // the last exchange copied into a slot; the last read from theirs
} Counters;

typedef struct SharedPair {
    MPI_Win win;
    MPI_Comm node; // the pair, as a communicator of the ranks that share memory
    Counters *mine, *theirs;
    float *my_slots, *their_slots; // two slots of `floats` each
    size_t floats;
    long exchanges;
} SharedPair;

#define HEADER 64 // the counters, on a cache line of their own

// Made at the pair's first all-reduce, as large as it or MIN_FLOATS (the first is the
// embedding's or o_proj's, as large as any activation of the pair); a larger one later goes over
// MPI. Both ranks see the same sizes in the same order, so both take the same way. NULL where the
// two ranks do not share a node.
#define MIN_FLOATS (1 << 16)
static SharedPair *shared_pair_make(Group *g, size_t n) {
    MPI_Comm node;
    int node_size;
    mpiCheck(MPI_Comm_split_type(g->comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    mpiCheck(MPI_Comm_size(node, &node_size));
    if (node_size != 2) {
        mpiCheck(MPI_Comm_free(&node));
        return NULL;
    }
    SharedPair *p = xmalloc(sizeof *p);
    p->node = node;
    p->floats = n > MIN_FLOATS ? n : MIN_FLOATS;
    p->exchanges = 0;
    char *mine, *theirs;
    MPI_Aint bytes = HEADER + 2 * (MPI_Aint)p->floats * (MPI_Aint)sizeof(float), their_bytes;
    int unit;
    mpiCheck(MPI_Win_allocate_shared(bytes, 1, MPI_INFO_NULL, node, &mine, &p->win));
    mpiCheck(MPI_Win_shared_query(p->win, 1 - g->rank, &their_bytes, &unit, &theirs));
    p->mine = (Counters *)mine;
    p->theirs = (Counters *)theirs;
    p->my_slots = (float *)(mine + HEADER);
    p->their_slots = (float *)(theirs + HEADER);
    atomic_store(&p->mine->written, 0);
    atomic_store(&p->mine->read, 0);
    mpiCheck(MPI_Barrier(node)); // both counters are zero before either rank reads the other's
    return p;
}

// waits, as comm_wait does, until the partner's counter reaches `at_least`
static void wait_for(_Atomic long *counter, long at_least, const Handle *h) {
    double wait_started = now_seconds();
    for (int polls = 0; atomic_load_explicit(counter, memory_order_acquire) < at_least; polls++) {
        comm_watchdog(h, wait_started);
        wait_pause(polls);
    }
}

int shared_pair_start(Handle *h, float *buf, size_t n, Group *g) {
    if (g->kind != GROUP_TP || g->size != 2) return 0;
    if (!g->shared_pair_tried) {
        g->shared_pair = shared_pair_make(g, n);
        g->shared_pair_tried = 1;
    }
    SharedPair *p = g->shared_pair;
    if (!p || n > p->floats) return 0;
    long s = ++p->exchanges;
    // a third exchange in flight would wait for the partner to read a slot it reads only after
    // its own third one: both ranks would wait for ever
    if (s - atomic_load(&p->mine->read) > 2)
        FAIL("end (comm_wait) a tp all-reduce before starting two more",
             "exchange %ld of the tp pair starts with %ld in flight", s,
             s - 1 - atomic_load(&p->mine->read));
    float *slot = p->my_slots + (s % 2) * p->floats;
    Handle named = {.op = OP_ALL_REDUCE, .group = g->kind}; // for the watchdog's line
    wait_for(&p->theirs->read, s - 2, &named); // the partner has read what this slot held
    memcpy(slot, buf, n * sizeof(float));
    atomic_store_explicit(&p->mine->written, s, memory_order_release);
    h->shared_pair = p;
    h->shared_exchange = s;
    h->partner_copy = p->their_slots + (s % 2) * p->floats; // read once it has arrived
    return 1;
}

int shared_pair_arrived(const Handle *h) {
    const SharedPair *p = h->shared_pair;
    return !p ||
           atomic_load_explicit(&p->theirs->written, memory_order_acquire) >= h->shared_exchange;
}

void shared_pair_read(Handle *h) {
    atomic_store_explicit(&h->shared_pair->mine->read, h->shared_exchange, memory_order_release);
    h->shared_pair = NULL;
}

void shared_pair_free(Group *g) {
    SharedPair *p = g->shared_pair;
    if (p) {
        mpiCheck(MPI_Win_free(&p->win));
        mpiCheck(MPI_Comm_free(&p->node));
        free(p);
    }
    g->shared_pair = NULL;
    g->shared_pair_tried = 0;
}
