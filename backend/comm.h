// Collectives over one process group (backend/cpu/comm_mpi.c; NCCL in backend/cuda/comm_nccl.cu).
// Buffers are device tensors of floats. In a group of one rank every collective is a no-op (or a
// copy), so model.c calls the same functions whatever the layout; send/recv to oneself is refused.
// Every wait goes through comm_wait(), which tests and yields the CPU: MPICH's blocking calls
// busy-poll, and with 8 ranks on 2 cores that makes a 1-float all-reduce 100x slower.
#pragma once
#include <stddef.h>
#include <mpi.h>

// which axis a group is, so comm_log.c counts each one's traffic apart (GROUP_OTHER until the
// process group manager names it)
typedef enum {
    GROUP_OTHER,
    GROUP_WORLD,
    GROUP_TP,
    GROUP_CP,
    GROUP_PP,
    GROUP_DP, // cp*dp: the replicas that average gradients (and those of the same experts)
    GROUP_EMBED,
    GROUP_EP, // expert parallelism: the ranks that exchange tokens for each other's experts
    GROUP_KINDS
} GroupKind;

typedef struct {
    int rank, size;
    GroupKind kind;
    MPI_Comm comm; // always present: MPI hands out NCCL ids and carries the "mpi" backend
    void *nccl;    // ncclComm_t in the GPU build with backend "nccl", else NULL
    void *stream;  // with nccl: the group's own cudaStream_t for the *_start calls, else NULL
    // CPU build, a tp pair on one node: its shared memory (comm_shared_pair.c), made at its first
    // all-reduce; NULL where none was made
    struct SharedPair *shared_pair;
    int shared_pair_tried;
} Group;

typedef enum { REDUCE_SUM, REDUCE_AVG, REDUCE_MAX } ReduceOp;
typedef enum {
    OP_NONE,
    OP_ALL_REDUCE,
    OP_SEND,
    OP_RECV,
    OP_SEND_RECV,
    OP_BARRIER,
    OP_REDUCE_SCATTER,
    OP_ALL_GATHER,
    OP_ALL_TO_ALL
} CommOp;

// a communication in flight; comm_wait() ends it
typedef struct {
    MPI_Request req[2];
    int count;      // requests in use
    float *avg_buf; // REDUCE_AVG: scaled by 1/size when the sum arrives
    size_t avg_n;
    int avg_size;
    float *move_to, *move_from; // CPU reduce-scatter: MPI leaves this rank's piece at the front
    size_t move_n;
    // CPU all-reduce in a group of two: the partner's copy lands in partner_copy, and comm_wait
    // adds it (or takes the max) into partner_into
    float *partner_into, *partner_copy;
    size_t partner_n;
    int partner_max;
    struct SharedPair *shared_pair; // or it is read from the pair's shared memory, written by
    long shared_exchange;           // the partner's exchange number shared_exchange
    int *mpi_layout; // MPI_Ialltoallv's counts and displacements: MPI reads them until it ends
    void *device_op; // GPU build: the op's CUDA event or host staging (comm_nccl.cu)
    // for comm_log.c: what travels, on which group, since when; OP_NONE: nothing (more) to record.
    // Once it has ended: when, and how long this rank waited for it (data_parallel.c reads them)
    CommOp op;
    GroupKind group;
    size_t bytes;
    double started, finished, waited;
} Handle;

// distributed.backend: "mpi", or "nccl" (the GPU build's default); before any group_init
void comm_set_backend(const char *name);
// distributed.timeout_s, the watchdog: a wait that goes on this long (a peer stopped, wedged or
// lost) ends the job with one line naming this rank, the group and the operation. Default 600.
void comm_set_timeout(double seconds);
void group_init(Group *g, MPI_Comm comm);
void group_free(Group *g);

void all_reduce(float *buf, size_t n, ReduceOp op, Group *g);
Handle all_reduce_start(float *buf, size_t n, ReduceOp op, Group *g);
// ZeRO-1's pair (data_parallel.c), in place on buf (n floats, n a multiple of g->size): piece r is
// buf[r*n/size, (r+1)*n/size). reduce_scatter: once waited for, this rank's piece holds the sum (or
// the mean) of that piece over the group; the other pieces are left undefined. all_gather: this
// rank's piece is sent, and once waited for every piece holds its owner's. Bytes sent, for
// comm_log.c: the whole buffer for the reduce-scatter (as an all-reduce's), this rank's piece for
// the gather.
Handle reduce_scatter_start(float *buf, size_t n, ReduceOp op, Group *g);
void reduce_scatter(float *buf, size_t n, ReduceOp op, Group *g);
Handle all_gather_start(float *buf, size_t n, Group *g);
void all_gather(float *buf, size_t n, Group *g);
// Expert parallelism's token dispatch and combine (MPI_Alltoallv; with NCCL, a grouped send and
// receive per peer, as Megatron-LM and DeepSpeed do): send_counts[r] floats go to rank r, taken
// one after another from sendbuf in rank order; recv_counts[r] floats arrive from rank r, placed
// one after another in recvbuf in rank order. Not in place. Counts are host arrays of g->size
// entries, and recv_counts[r] must equal rank r's send_counts[this rank]: exchange them first
// with all_to_all_host_counts. Bytes sent, for comm_log.c: the floats to the other ranks.
Handle all_to_all_start(float *recvbuf, const size_t *recv_counts, const float *sendbuf,
                        const size_t *send_counts, Group *g);
void all_to_all(float *recvbuf, const size_t *recv_counts, const float *sendbuf,
                const size_t *send_counts, Group *g);
void send(const float *buf, size_t n, int dst, Group *g);
void recv(float *buf, size_t n, int src, Group *g);
// send to dst and receive from src at once (pipeline neighbours, the context ring); a NULL
// sendbuf or recvbuf skips that half
void send_recv(const float *sendbuf, int dst, float *recvbuf, int src, size_t n, Group *g);
Handle send_recv_start(const float *sendbuf, int dst, float *recvbuf, int src, size_t n, Group *g);
void comm_wait(Handle *h); // the one place that waits: test, yield, repeat
// Never waits: finishes h and returns 1 if it has arrived, else 0. MPICH moves a non-blocking
// collective along only inside MPI calls, so code that computes between a start and its wait
// calls this now and then (data parallelism does after each layer's backward).
int comm_test(Handle *h);
void barrier(Group *g);
// Host values every rank must agree on (a stop flag, checksums), over MPI whatever the backend;
// waited for by comm_wait like every other wait
void all_reduce_host(void *buf, int count, MPI_Datatype type, MPI_Op op, Group *g);
// counts first, then the tokens: n counts per rank, recv_counts[r*n, r*n+n) becomes rank r's
// send_counts[this rank*n, ...+n) (host arrays of g->size * n entries), over MPI whatever the
// backend, waited for by comm_wait
void all_to_all_host_counts(size_t *recv_counts, const size_t *send_counts, int n, Group *g);
