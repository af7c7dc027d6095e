// Collectives of the CPU build on MPI (backend/comm.h): buffers are host memory here.
// Every call is non-blocking underneath (MPI_I*) and ends in comm_wait(), which tests and yields.
// Why: MPICH busy-polls inside its blocking calls, so with 8 ranks on 2 cores a rank that waits
// steals the core from the rank it waits for, and a 1-float all-reduce gets 5-100x slower
// (bench/bench_wait.c measures it). MPI_Testall + wait_pause (comm_common.h: yield, then short
// naps) hands the core over instead.
// A group of one rank does no MPI at all: the call is a copy (or nothing) and the handle is done.
#include <math.h>
#include "backend/backend.h"
#include "backend/comm_common.h"
#include "backend/cpu/comm_shared_pair.h"
#include "backend/kernel_time.h"

// the pair all-reduce's messages: apart from send/recv's TAG, on a group that carries both
#define TAG_PAIR 1

void comm_set_backend(const char *name) {
    if (strcmp(name, "mpi") != 0)
        user_error("config error: distributed.backend = \"%s\": the CPU build communicates with "
                   "\"mpi\" (\"nccl\" needs `make GPU=1`)",
                   name);
}

void group_init(Group *g, MPI_Comm comm) {
    g->comm = comm;
    g->kind = GROUP_OTHER;
    g->nccl = NULL;
    g->stream = NULL;
    g->shared_pair = NULL;
    g->shared_pair_tried = 0;
    // errors come back to mpiCheck, which names the file and line, instead of MPICH's own abort
    mpiCheck(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
    mpiCheck(MPI_Comm_rank(comm, &g->rank));
    mpiCheck(MPI_Comm_size(comm, &g->size));
}

void group_free(Group *g) {
    shared_pair_free(g);
    // the predefined communicators belong to MPI, not to us
    if (g->comm != MPI_COMM_NULL && g->comm != MPI_COMM_WORLD && g->comm != MPI_COMM_SELF)
        mpiCheck(MPI_Comm_free(&g->comm));
    g->comm = MPI_COMM_NULL;
}

void comm_wait(Handle *h) {
    KERNEL_TIME(KT_WAIT, 0, 0);
    double wait_started = now_seconds();
    for (int polls = 0;; polls++) {
        int done = 0;
        MPI_Status status[2]; // not MPI_STATUSES_IGNORE: gcc mistakes it for a 0-byte array
        if (h->count == 0 && shared_pair_arrived(h)) break;
        if (h->count > 0) mpiCheck(MPI_Testall(h->count, h->req, &done, status));
        if (done) break;
        comm_watchdog(h, wait_started);
        wait_pause(polls); // let the rank we are waiting for run on this core
    }
    h->count = 0;
    comm_log_finished(h, wait_started);
    free(h->mpi_layout);
    h->mpi_layout = NULL;
    if (h->partner_copy) {
        float *y = h->partner_into;
        const float *x = h->partner_copy;
        if (h->partner_max)
            for (size_t i = 0; i < h->partner_n; i++) y[i] = fmaxf(y[i], x[i]);
        else
            add_inplace(y, x, h->partner_n); // a + b here, b + a there: the same floats
        if (h->shared_pair)
            shared_pair_read(h);
        else
            free(h->partner_copy);
        h->partner_copy = NULL;
    }
    if (h->move_to) {
        memmove(h->move_to, h->move_from, h->move_n * sizeof(float));
        h->move_to = NULL;
    }
    if (h->avg_buf) {
        // REDUCE_AVG travels as a sum; the mean is taken once it has arrived
        float s = 1.0f / (float)h->avg_size;
        for (size_t i = 0; i < h->avg_n; i++) h->avg_buf[i] *= s;
        h->avg_buf = NULL;
    }
}

int comm_test(Handle *h) {
    int done = 1;
    MPI_Status status[2];
    if (h->count > 0) mpiCheck(MPI_Testall(h->count, h->req, &done, status));
    done = done && shared_pair_arrived(h);
    if (done) comm_wait(h); // nothing left to wait for: only the sum or the mean to take
    return done;
}

Handle all_reduce_start(float *buf, size_t n, ReduceOp op, Group *g) {
    Handle h = handle_done();
    if (g->size == 1 || n == 0) return h; // the sum, mean and max of one copy is that copy
    int count = mpi_count(n, "all_reduce");
    if (g->size == 2) {
        // Two ranks swap their copies and each adds: one exchange. MPICH's all-reduce of a large
        // buffer takes two (reduce-scatter, then all-gather), and with 8 ranks on 2 cores each
        // exchange waits for the partner to get a core (bench/bench_ranks.sh measures it). A tp
        // pair on one node swaps through shared memory instead (comm_shared_pair.c).
        h.partner_into = buf;
        h.partner_n = n;
        h.partner_max = op == REDUCE_MAX;
        if (!shared_pair_start(&h, buf, n, g)) {
            h.partner_copy = (float *)xmalloc(n * sizeof(float));
            int partner = 1 - g->rank;
            mpiCheck(MPI_Irecv(h.partner_copy, count, MPI_FLOAT, partner, TAG_PAIR, g->comm,
                               &h.req[h.count++]));
            mpiCheck(
                MPI_Isend(buf, count, MPI_FLOAT, partner, TAG_PAIR, g->comm, &h.req[h.count++]));
        }
    } else {
        mpiCheck(MPI_Iallreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, mpi_reduce_op(op), g->comm,
                                &h.req[h.count++]));
    }
    comm_log_started(&h, g, OP_ALL_REDUCE, n * sizeof(float));
    average_when_done(&h, op, buf, n, g);
    return h;
}

void all_reduce(float *buf, size_t n, ReduceOp op, Group *g) {
    Handle h = all_reduce_start(buf, n, op, g);
    comm_wait(&h);
}

// MPI_IN_PLACE leaves this rank's reduced piece at the front of buf: comm_wait moves it home
Handle reduce_scatter_start(float *buf, size_t n, ReduceOp op, Group *g) {
    Handle h = handle_done();
    if (g->size == 1 || n == 0) return h; // one piece, the whole buffer, already reduced
    size_t piece = piece_of(n, "reduce_scatter", g);
    int count = mpi_count(piece, "reduce_scatter");
    mpiCheck(MPI_Ireduce_scatter_block(MPI_IN_PLACE, buf, count, MPI_FLOAT, mpi_reduce_op(op),
                                       g->comm, &h.req[0]));
    h.count = 1;
    comm_log_started(&h, g, OP_REDUCE_SCATTER, n * sizeof(float));
    float *mine = buf + (size_t)g->rank * piece;
    if (mine != buf) {
        h.move_to = mine;
        h.move_from = buf;
        h.move_n = piece;
    }
    average_when_done(&h, op, mine, piece, g);
    return h;
}

void reduce_scatter(float *buf, size_t n, ReduceOp op, Group *g) {
    Handle h = reduce_scatter_start(buf, n, op, g);
    comm_wait(&h);
}

// in place: MPI takes this rank's contribution from its own piece of buf
Handle all_gather_start(float *buf, size_t n, Group *g) {
    Handle h = handle_done();
    if (g->size == 1 || n == 0) return h; // this rank's piece is the whole buffer
    size_t piece = piece_of(n, "all_gather", g);
    int count = mpi_count(piece, "all_gather");
    mpiCheck(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, count, MPI_FLOAT, g->comm,
                            &h.req[0]));
    h.count = 1;
    comm_log_started(&h, g, OP_ALL_GATHER, piece * sizeof(float));
    return h;
}

void all_gather(float *buf, size_t n, Group *g) {
    Handle h = all_gather_start(buf, n, g);
    comm_wait(&h);
}

// the part to oneself travels through MPI with the rest, except in a group of one: a copy
Handle all_to_all_start(float *recvbuf, const size_t *recv_counts, const float *sendbuf,
                        const size_t *send_counts, Group *g) {
    Handle h = handle_done();
    size_t send_at, recv_at, send_n;
    size_t self_n = all_to_all_self(&send_at, &recv_at, recv_counts, send_counts, g);
    if (g->size == 1) {
        if (self_n > 0) memcpy(recvbuf, sendbuf, self_n * sizeof(float));
        return h;
    }
    mpi_all_to_all_layout(&h, &send_n, recv_counts, send_counts, g);
    int *l = h.mpi_layout, size = g->size;
    mpiCheck(MPI_Ialltoallv(sendbuf, l, l + size, MPI_FLOAT, recvbuf, l + 2 * size, l + 3 * size,
                            MPI_FLOAT, g->comm, &h.req[0]));
    h.count = 1;
    comm_log_started(&h, g, OP_ALL_TO_ALL, all_to_all_bytes(send_counts, g));
    return h;
}

void all_to_all(float *recvbuf, const size_t *recv_counts, const float *sendbuf,
                const size_t *send_counts, Group *g) {
    Handle h = all_to_all_start(recvbuf, recv_counts, sendbuf, send_counts, g);
    comm_wait(&h);
}

void send(const float *buf, size_t n, int dst, Group *g) {
    check_peer(dst, 0, "send", g);
    int count = mpi_count(n, "send");
    Handle h = handle_done();
    mpiCheck(MPI_Isend(buf, count, MPI_FLOAT, dst, TAG, g->comm, &h.req[0]));
    h.count = 1;
    comm_log_started(&h, g, OP_SEND, n * sizeof(float));
    comm_wait(&h);
}

void recv(float *buf, size_t n, int src, Group *g) {
    check_peer(src, 0, "recv", g);
    int count = mpi_count(n, "recv");
    Handle h = handle_done();
    mpiCheck(MPI_Irecv(buf, count, MPI_FLOAT, src, TAG, g->comm, &h.req[0]));
    h.count = 1;
    comm_log_started(&h, g, OP_RECV, 0); // nothing sent
    comm_wait(&h);
}

// The receive is posted before the send so that a ring of ranks that all send at once never
// waits on itself. In a group of one (a context ring of one) the block comes straight back.
// A NULL buffer skips its half (the interleaved pipeline's exchanges).
Handle send_recv_start(const float *sendbuf, int dst, float *recvbuf, int src, size_t n, Group *g) {
    Handle h = handle_done();
    if (g->size == 1 && dst == 0 && src == 0) {
        if (recvbuf != sendbuf) memcpy(recvbuf, sendbuf, n * sizeof(float));
        return h;
    }
    if (!sendbuf && !recvbuf) return h;
    if (sendbuf) check_peer(dst, 1, "send_recv destination", g);
    if (recvbuf) check_peer(src, 1, "send_recv source", g);
    int count = mpi_count(n, "send_recv");
    if (recvbuf)
        mpiCheck(MPI_Irecv(recvbuf, count, MPI_FLOAT, src, TAG, g->comm, &h.req[h.count++]));
    if (sendbuf)
        mpiCheck(MPI_Isend(sendbuf, count, MPI_FLOAT, dst, TAG, g->comm, &h.req[h.count++]));
    comm_log_started(&h, g, p2p_op(sendbuf, recvbuf), sendbuf ? n * sizeof(float) : 0);
    return h;
}

void send_recv(const float *sendbuf, int dst, float *recvbuf, int src, size_t n, Group *g) {
    Handle h = send_recv_start(sendbuf, dst, recvbuf, src, n, g);
    comm_wait(&h);
}

void barrier(Group *g) {
    if (g->size == 1) return;
    Handle h = handle_done();
    mpiCheck(MPI_Ibarrier(g->comm, &h.req[0]));
    h.count = 1;
    comm_log_started(&h, g, OP_BARRIER, 0);
    comm_wait(&h);
}
