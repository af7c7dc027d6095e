// Collectives of the GPU build (backend/comm.h) on device buffers, with two backends, chosen by
// distributed.backend, which train.c passes to comm_set_backend() before the process groups are
// made:
//   "nccl" (the default): one NCCL communicator per process group of more than one rank, its id
//          handed out by MPI, and one non-blocking stream. Blocking calls run on the compute
//          stream, in program order with the kernels; the *_start calls run on the group's own
//          stream, after an event that orders them behind the kernels already queued, and record
//          an event that comm_wait() polls. Own streams: one group's queued all-reduces (data
//          parallelism's buckets) never hold up another's (tensor parallelism's), and the order
//          of calls across groups cannot make ranks wait on each other in a cycle.
//   "mpi": the CPU build's MPI calls on host copies of the buffers (device -> host, MPI,
//          host -> device), so several ranks can share one GPU, which NCCL refuses.
// Every wait on the host tests and yields (sched_yield), as the CPU build does: MPICH's
// blocking calls busy-poll and starve the rank being waited for when ranks share cores.
// A group of one rank does no communication at all: each call is a copy or nothing; except with
// the test switch NCCL_GROUP_OF_ONE=1 (utils.h) and "nccl", which gives such a group an NCCL
// communicator of one rank and sends its all-reduces through NCCL (the group's stream and events
// for the *_start calls), so NCCL's loading and streams run on a machine with one GPU
// (tests/gpu/check.sh).
// A call that writes device buffers tells bf16_copies_stale first (common.h), when it is made:
// NCCL writes from then on, "mpi" at comm_wait (host_to_device, which tells it again).
// common.h first: it includes the C headers inside extern "C"
#include "backend/cuda/common.h"
#include "backend/comm_common.h"
#include <sched.h>

// What a communication in flight needs at comm_wait(), beyond the MPI requests in the Handle.
typedef struct {
    cudaEvent_t done; // "nccl": recorded on the group's stream after the op; NULL for "mpi"
    ncclComm_t nccl;  // "nccl": polled for errors while waiting (a dead peer never ends the op)
    float *host;      // "mpi": the host copy MPI sends from (or reduces in place)
    float *host_recv; // "mpi": the host buffer MPI receives into, when not `host`
    float *dst;       // "mpi": the device buffer the received floats land in at the end
    size_t dst_n;
} DeviceOp;

static int use_nccl = 1; // until comm_set_backend says otherwise

void comm_set_backend(const char *name) {
    if (strcmp(name, "nccl") == 0)
        use_nccl = 1;
    else if (strcmp(name, "mpi") == 0)
        use_nccl = 0;
    else
        user_error("distributed.backend = \"%s\" is not a communication backend: use \"nccl\" "
                   "or \"mpi\"",
                   name);
}

// NCCL refuses two ranks of one communicator on one GPU: say so in one line, before it does.
// GPUs are compared by PCI bus id, not by index: a launcher that gives each rank one GPU
// (CUDA_VISIBLE_DEVICES, Slurm's --gpus-per-task) shows every rank its GPU as device 0.
#define BUS_ID_LEN 32
static void check_one_gpu_per_rank(Group *g) {
    MPI_Comm node;
    int node_size, device, count;
    char bus_id[BUS_ID_LEN] = {0};
    mpiCheck(MPI_Comm_split_type(g->comm, MPI_COMM_TYPE_SHARED, g->rank, MPI_INFO_NULL, &node));
    mpiCheck(MPI_Comm_size(node, &node_size));
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaGetDeviceCount(&count));
    cudaCheck(cudaDeviceGetPCIBusId(bus_id, BUS_ID_LEN, device));
    char *bus_ids = (char *)xmalloc((size_t)node_size * BUS_ID_LEN);
    mpiCheck(MPI_Allgather(bus_id, BUS_ID_LEN, MPI_CHAR, bus_ids, BUS_ID_LEN, MPI_CHAR, node));
    int shared = 0;
    for (int r = 0; r < node_size; r++) shared += strcmp(bus_ids + r * BUS_ID_LEN, bus_id) == 0;
    free(bus_ids);
    mpiCheck(MPI_Comm_free(&node));
    if (shared > 1) {
        char msg[512];
        snprintf(msg, sizeof msg,
                 "distributed.backend = \"nccl\" needs one GPU per rank, but %d "
                 "ranks of one group share GPU %d (%s; this rank sees %d): set "
                 "distributed.backend to \"mpi\" or start one rank per GPU",
                 shared, device, bus_id, count);
        // user_error speaks from world rank 0 only, which may not be in this group
        if (g->rank == 0 && world_rank() != 0) fprintf(stderr, "%s\n", msg);
        user_error("%s", msg);
    }
}

void group_init(Group *g, MPI_Comm comm) {
    g->comm = comm;
    g->kind = GROUP_OTHER;
    g->nccl = NULL;
    g->stream = NULL;
    mpiCheck(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
    mpiCheck(MPI_Comm_rank(comm, &g->rank));
    mpiCheck(MPI_Comm_size(comm, &g->size));
    const char *one = test_switch("NCCL_GROUP_OF_ONE");
    int nccl_for_one = one && strcmp(one, "1") == 0;
    if (!use_nccl || (g->size == 1 && !nccl_for_one)) return;
    if (!device_selected)
        FAIL("call backend_init(local_rank) before process_group_manager_init",
             "an NCCL communicator binds to the current GPU, and none was selected yet");
    check_one_gpu_per_rank(g);
    ncclUniqueId id;
    if (g->rank == 0) ncclCheck(ncclGetUniqueId(&id));
    mpiCheck(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, comm));
    ncclComm_t nccl;
    ncclCheck(ncclCommInitRank(&nccl, g->size, id, g->rank));
    g->nccl = nccl;
    cudaStream_t stream;
    cudaCheck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    g->stream = stream;
}

void group_free(Group *g) {
    if (g->nccl) ncclCheck(ncclCommDestroy((ncclComm_t)g->nccl));
    if (g->stream) cudaCheck(cudaStreamDestroy((cudaStream_t)g->stream));
    g->nccl = NULL;
    g->stream = NULL;
    if (g->comm != MPI_COMM_NULL && g->comm != MPI_COMM_WORLD && g->comm != MPI_COMM_SELF)
        mpiCheck(MPI_Comm_free(&g->comm));
    g->comm = MPI_COMM_NULL;
}

static DeviceOp *op_new(void) {
    return (DeviceOp *)xmalloc(sizeof(DeviceOp)); // zeroed
}

// "mpi": a host copy of n floats of a device buffer.
// cudaMemcpy waits for the kernels queued before it, so the copy holds their results.
static float *host_copy(const float *dev, size_t n) {
    float *host = (float *)xmalloc(n * sizeof(float));
    device_to_host(host, dev, n * sizeof(float));
    return host;
}

// "nccl", *_start: the group's stream, after the kernels queued so far on the compute stream
static cudaStream_t stream_after_compute(Group *g) {
    cudaEvent_t ready;
    cudaCheck(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    cudaCheck(cudaEventRecord(ready, 0));
    cudaCheck(cudaStreamWaitEvent((cudaStream_t)g->stream, ready, 0));
    cudaCheck(cudaEventDestroy(ready)); // released once the wait is satisfied
    return (cudaStream_t)g->stream;
}

static void record_done(Handle *h, Group *g) {
    DeviceOp *op = op_new();
    cudaCheck(cudaEventCreateWithFlags(&op->done, cudaEventDisableTiming));
    cudaCheck(cudaEventRecord(op->done, (cudaStream_t)g->stream));
    op->nccl = (ncclComm_t)g->nccl;
    h->device_op = op;
}

// has the op's event fired? A peer that died never fires it: NCCL reports that asynchronously
static int nccl_op_done(DeviceOp *op) {
    cudaError_t st = cudaEventQuery(op->done);
    if (st == cudaSuccess) return 1;
    if (st != cudaErrorNotReady) cudaCheck(st);
    ncclResult_t async_error;
    ncclCheck(ncclCommGetAsyncError(op->nccl, &async_error));
    if (async_error != ncclSuccess) {
        ncclCommAbort(op->nccl); // the communicator is unusable; its kernels must stop
        ncclCheck(async_error);
    }
    return 0;
}

void comm_wait(Handle *h) {
    PROFILE(PROFILE_COMM);
    double wait_started = now_seconds();
    DeviceOp *op = (DeviceOp *)h->device_op;
    if (op && op->done) {
        while (!nccl_op_done(op)) {
            comm_watchdog(h, wait_started);
            sched_yield();
        }
        cudaCheck(cudaEventDestroy(op->done));
    }
    for (int polls = 0;; polls++) {
        int done = 0;
        MPI_Status status[2];
        if (h->count == 0) break;
        mpiCheck(MPI_Testall(h->count, h->req, &done, status));
        if (done) break;
        comm_watchdog(h, wait_started);
        wait_pause(polls); // let the rank we are waiting for run on this core
    }
    h->count = 0;
    comm_log_finished(h, wait_started);
    free(h->mpi_layout);
    h->mpi_layout = NULL;
    if (op) {
        if (op->dst)
            host_to_device(op->dst, op->host_recv ? op->host_recv : op->host,
                           op->dst_n * sizeof(float));
        free(op->host);
        free(op->host_recv);
        free(op);
        h->device_op = NULL;
    }
    if (h->avg_buf) {
        // REDUCE_AVG travels as a sum; the mean is taken once it has arrived, as on the CPU
        scale_inplace(h->avg_buf, 1.0f / (float)h->avg_size, h->avg_n);
        h->avg_buf = NULL;
    }
}

int comm_test(Handle *h) {
    DeviceOp *op = (DeviceOp *)h->device_op;
    if (op && op->done && !nccl_op_done(op)) return 0;
    int done = 1;
    MPI_Status status[2];
    if (h->count > 0) mpiCheck(MPI_Testall(h->count, h->req, &done, status));
    if (done) comm_wait(h); // nothing left to wait for: only the copies and the mean
    return done;
}

static ncclRedOp_t nccl_op(ReduceOp op) {
    return op == REDUCE_MAX ? ncclMax : ncclSum;
}

static Handle all_reduce_any(float *buf, size_t n, ReduceOp op, Group *g, int async) {
    Handle h = handle_done();
    // the sum, mean and max of one copy is that copy (through NCCL all the same if it has a
    // communicator: the test switch NCCL_GROUP_OF_ONE)
    if (n == 0 || (g->size == 1 && !g->nccl)) return h;
    bf16_copies_stale(buf, n * sizeof(float));
    comm_log_started(&h, g, OP_ALL_REDUCE, n * sizeof(float));
    average_when_done(&h, op, buf, n, g);
    if (g->nccl) {
        cudaStream_t stream = async ? stream_after_compute(g) : 0;
        ncclCheck(ncclAllReduce(buf, buf, n, ncclFloat, nccl_op(op), (ncclComm_t)g->nccl, stream));
        if (async) record_done(&h, g);
        return h;
    }
    int count = mpi_count(n, "all_reduce");
    DeviceOp *op_state = op_new();
    op_state->host = host_copy(buf, n);
    op_state->dst = buf;
    op_state->dst_n = n;
    h.device_op = op_state;
    mpiCheck(
        MPI_Iallreduce(MPI_IN_PLACE, op_state->host, count, MPI_FLOAT, mpi_reduce_op(op), g->comm, &h.req[0]));
    h.count = 1;
    return h;
}

Handle all_reduce_start(float *buf, size_t n, ReduceOp op, Group *g) {
    PROFILE(PROFILE_COMM);
    return all_reduce_any(buf, n, op, g, 1);
}

void all_reduce(float *buf, size_t n, ReduceOp op, Group *g) {
    PROFILE(PROFILE_COMM);
    Handle h = all_reduce_any(buf, n, op, g, 0);
    comm_wait(&h); // "nccl": nothing to wait for on the host, only the mean to take
}


// ZeRO-1's reduce-scatter, in place: NCCL writes this rank's piece where it lies in buf; "mpi"
// reduces a host copy, whose front MPI_IN_PLACE leaves the piece at, and copies that piece home
static Handle reduce_scatter_any(float *buf, size_t n, ReduceOp op, Group *g, int async) {
    Handle h = handle_done();
    if (n == 0 || (g->size == 1 && !g->nccl)) return h; // one piece: the whole buffer, reduced
    size_t piece = piece_of(n, "reduce_scatter", g);
    float *mine = buf + (size_t)g->rank * piece;
    bf16_copies_stale(mine, piece * sizeof(float));
    comm_log_started(&h, g, OP_REDUCE_SCATTER, n * sizeof(float));
    average_when_done(&h, op, mine, piece, g);
    if (g->nccl) {
        cudaStream_t stream = async ? stream_after_compute(g) : 0;
        ncclCheck(ncclReduceScatter(buf, mine, piece, ncclFloat, nccl_op(op), (ncclComm_t)g->nccl,
                                    stream));
        if (async) record_done(&h, g);
        return h;
    }
    int count = mpi_count(piece, "reduce_scatter");
    DeviceOp *op_state = op_new();
    op_state->host = host_copy(buf, n);
    op_state->dst = mine;
    op_state->dst_n = piece;
    h.device_op = op_state;
    mpiCheck(MPI_Ireduce_scatter_block(MPI_IN_PLACE, op_state->host, count, MPI_FLOAT, mpi_reduce_op(op),
                                       g->comm, &h.req[0]));
    h.count = 1;
    return h;
}

Handle reduce_scatter_start(float *buf, size_t n, ReduceOp op, Group *g) {
    PROFILE(PROFILE_COMM);
    return reduce_scatter_any(buf, n, op, g, 1);
}

void reduce_scatter(float *buf, size_t n, ReduceOp op, Group *g) {
    PROFILE(PROFILE_COMM);
    Handle h = reduce_scatter_any(buf, n, op, g, 0);
    comm_wait(&h);
}

// ZeRO-1's all-gather, in place: this rank's piece of buf goes to every rank of the group
static Handle all_gather_any(float *buf, size_t n, Group *g, int async) {
    Handle h = handle_done();
    if (n == 0 || (g->size == 1 && !g->nccl)) return h; // this rank's piece is the whole buffer
    size_t piece = piece_of(n, "all_gather", g);
    bf16_copies_stale(buf, n * sizeof(float));
    comm_log_started(&h, g, OP_ALL_GATHER, piece * sizeof(float));
    if (g->nccl) {
        cudaStream_t stream = async ? stream_after_compute(g) : 0;
        ncclCheck(ncclAllGather(buf + (size_t)g->rank * piece, buf, piece, ncclFloat,
                                (ncclComm_t)g->nccl, stream));
        if (async) record_done(&h, g);
        return h;
    }
    int count = mpi_count(piece, "all_gather");
    DeviceOp *op_state = op_new();
    op_state->host = host_copy(buf, n); // MPI_IN_PLACE sends this rank's piece from here
    op_state->dst = buf;
    op_state->dst_n = n;
    h.device_op = op_state;
    mpiCheck(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, op_state->host, count, MPI_FLOAT,
                            g->comm, &h.req[0]));
    h.count = 1;
    return h;
}

Handle all_gather_start(float *buf, size_t n, Group *g) {
    PROFILE(PROFILE_COMM);
    return all_gather_any(buf, n, g, 1);
}

void all_gather(float *buf, size_t n, Group *g) {
    PROFILE(PROFILE_COMM);
    Handle h = all_gather_any(buf, n, g, 0);
    comm_wait(&h);
}

// Expert parallelism's dispatch and combine. "nccl" has no all-to-all-v: one grouped ncclSend and
// ncclRecv per peer with floats to move (both ends agree on which), the part to oneself a device
// copy on the same stream. "mpi": MPI_Ialltoallv on host copies, the part to oneself included.
static Handle all_to_all_any(float *recvbuf, const size_t *recv_counts, const float *sendbuf,
                             const size_t *send_counts, Group *g, int async) {
    Handle h = handle_done();
    size_t send_at, recv_at, send_n;
    size_t self_n = all_to_all_self(&send_at, &recv_at, recv_counts, send_counts, g);
    if (g->size == 1 && !g->nccl) {
        if (self_n > 0) device_copy(recvbuf, sendbuf, self_n * sizeof(float));
        return h;
    }
    size_t received = 0;
    for (int r = 0; r < g->size; r++) received += recv_counts[r];
    bf16_copies_stale(recvbuf, received * sizeof(float));
    comm_log_started(&h, g, OP_ALL_TO_ALL, all_to_all_bytes(send_counts, g));
    if (g->nccl) {
        cudaStream_t stream = async ? stream_after_compute(g) : 0;
        if (self_n > 0)
            cudaCheck(cudaMemcpyAsync(recvbuf + recv_at, sendbuf + send_at, self_n * sizeof(float),
                                      cudaMemcpyDeviceToDevice, stream));
        ncclComm_t nccl = (ncclComm_t)g->nccl;
        size_t sent = 0, got = 0;
        ncclCheck(ncclGroupStart());
        for (int r = 0; r < g->size; r++) {
            if (r != g->rank && send_counts[r] > 0)
                ncclCheck(ncclSend(sendbuf + sent, send_counts[r], ncclFloat, r, nccl, stream));
            if (r != g->rank && recv_counts[r] > 0)
                ncclCheck(ncclRecv(recvbuf + got, recv_counts[r], ncclFloat, r, nccl, stream));
            sent += send_counts[r];
            got += recv_counts[r];
        }
        ncclCheck(ncclGroupEnd());
        if (async) record_done(&h, g);
        return h;
    }
    size_t recv_n = mpi_all_to_all_layout(&h, &send_n, recv_counts, send_counts, g);
    DeviceOp *op = op_new();
    op->host = host_copy(sendbuf, send_n);
    op->host_recv = (float *)xmalloc(recv_n * sizeof(float));
    op->dst = recv_n > 0 ? recvbuf : NULL;
    op->dst_n = recv_n;
    h.device_op = op;
    int *l = h.mpi_layout, size = g->size;
    mpiCheck(MPI_Ialltoallv(op->host, l, l + size, MPI_FLOAT, op->host_recv, l + 2 * size,
                            l + 3 * size, MPI_FLOAT, g->comm, &h.req[0]));
    h.count = 1;
    return h;
}

Handle all_to_all_start(float *recvbuf, const size_t *recv_counts, const float *sendbuf,
                        const size_t *send_counts, Group *g) {
    PROFILE(PROFILE_COMM);
    return all_to_all_any(recvbuf, recv_counts, sendbuf, send_counts, g, 1);
}

void all_to_all(float *recvbuf, const size_t *recv_counts, const float *sendbuf,
                const size_t *send_counts, Group *g) {
    PROFILE(PROFILE_COMM);
    Handle h = all_to_all_any(recvbuf, recv_counts, sendbuf, send_counts, g, 0);
    comm_wait(&h); // "nccl": queued in order with the kernels, only the counters to update
}

void send(const float *buf, size_t n, int dst, Group *g) {
    PROFILE(PROFILE_COMM);
    check_peer(dst, 0, "send", g);
    Handle h = handle_done();
    comm_log_started(&h, g, OP_SEND, n * sizeof(float));
    if (g->nccl) {
        ncclCheck(ncclSend(buf, n, ncclFloat, dst, (ncclComm_t)g->nccl, 0));
        comm_wait(&h); // queued in order with the kernels: only the counters to update
        return;
    }
    int count = mpi_count(n, "send");
    DeviceOp *op = op_new();
    op->host = host_copy(buf, n);
    h.device_op = op;
    mpiCheck(MPI_Isend(op->host, count, MPI_FLOAT, dst, TAG, g->comm, &h.req[0]));
    h.count = 1;
    comm_wait(&h);
}

void recv(float *buf, size_t n, int src, Group *g) {
    PROFILE(PROFILE_COMM);
    check_peer(src, 0, "recv", g);
    bf16_copies_stale(buf, n * sizeof(float));
    Handle h = handle_done();
    comm_log_started(&h, g, OP_RECV, 0); // nothing sent
    if (g->nccl) {
        ncclCheck(ncclRecv(buf, n, ncclFloat, src, (ncclComm_t)g->nccl, 0));
        comm_wait(&h); // queued in order with the kernels: only the counters to update
        return;
    }
    int count = mpi_count(n, "recv");
    DeviceOp *op = op_new();
    op->host = (float *)xmalloc(n * sizeof(float));
    op->dst = buf;
    op->dst_n = n;
    h.device_op = op;
    mpiCheck(MPI_Irecv(op->host, count, MPI_FLOAT, src, TAG, g->comm, &h.req[0]));
    h.count = 1;
    comm_wait(&h);
}

// A NULL buffer skips its half (the interleaved pipeline's exchanges)
static Handle send_recv_any(const float *sendbuf, int dst, float *recvbuf, int src, size_t n,
                            Group *g, int async) {
    Handle h = handle_done();
    if (g->size == 1 && dst == 0 && src == 0) { // a ring of one: the block comes straight back
        if (recvbuf != sendbuf) device_copy(recvbuf, sendbuf, n * sizeof(float));
        return h;
    }
    if (!sendbuf && !recvbuf) return h;
    if (sendbuf) check_peer(dst, 1, "send_recv destination", g);
    if (recvbuf) check_peer(src, 1, "send_recv source", g);
    if (recvbuf) bf16_copies_stale(recvbuf, n * sizeof(float));
    comm_log_started(&h, g, p2p_op(sendbuf, recvbuf), sendbuf ? n * sizeof(float) : 0);
    if (g->nccl) {
        cudaStream_t stream = async ? stream_after_compute(g) : 0;
        // grouped, so the ring's simultaneous sends and receives cannot wait on each other
        ncclCheck(ncclGroupStart());
        if (sendbuf) ncclCheck(ncclSend(sendbuf, n, ncclFloat, dst, (ncclComm_t)g->nccl, stream));
        if (recvbuf) ncclCheck(ncclRecv(recvbuf, n, ncclFloat, src, (ncclComm_t)g->nccl, stream));
        ncclCheck(ncclGroupEnd());
        if (async) record_done(&h, g);
        return h;
    }
    int count = mpi_count(n, "send_recv");
    DeviceOp *op = op_new();
    op->host = sendbuf ? host_copy(sendbuf, n) : NULL;
    op->host_recv = recvbuf ? (float *)xmalloc(n * sizeof(float)) : NULL;
    op->dst = recvbuf;
    op->dst_n = n;
    h.device_op = op;
    // the receive is posted before the send, so a ring that sends all at once never waits on itself
    if (recvbuf)
        mpiCheck(MPI_Irecv(op->host_recv, count, MPI_FLOAT, src, TAG, g->comm, &h.req[h.count++]));
    if (sendbuf)
        mpiCheck(MPI_Isend(op->host, count, MPI_FLOAT, dst, TAG, g->comm, &h.req[h.count++]));
    return h;
}

Handle send_recv_start(const float *sendbuf, int dst, float *recvbuf, int src, size_t n, Group *g) {
    PROFILE(PROFILE_COMM);
    return send_recv_any(sendbuf, dst, recvbuf, src, n, g, 1);
}

void send_recv(const float *sendbuf, int dst, float *recvbuf, int src, size_t n, Group *g) {
    PROFILE(PROFILE_COMM);
    Handle h = send_recv_any(sendbuf, dst, recvbuf, src, n, g, 0);
    comm_wait(&h);
}

// the kernels queued so far finish first, so a timer read after the barrier means what it says
void barrier(Group *g) {
    PROFILE(PROFILE_COMM);
    device_synchronize();
    if (g->size == 1) return;
    Handle h = handle_done();
    mpiCheck(MPI_Ibarrier(g->comm, &h.req[0]));
    h.count = 1;
    comm_log_started(&h, g, OP_BARRIER, 0);
    comm_wait(&h);
}
