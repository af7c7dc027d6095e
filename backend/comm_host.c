// The collectives on host values every rank must agree on (comm.h: all_reduce_host,
// all_to_all_host_counts), over MPI whatever the backend, waited for as every wait is
#include <stdint.h>
#include <string.h>
#include "backend/comm.h"
#include "backend/comm_log.h"
#include "utils.h"

void all_reduce_host(void *buf, int count, MPI_Datatype type, MPI_Op op, Group *g) {
    if (g->size == 1) return; // a group of one reduces nothing
    Handle h = {.count = 1};
    int size;
    mpiCheck(MPI_Type_size(type, &size));
    mpiCheck(MPI_Iallreduce(MPI_IN_PLACE, buf, count, type, op, g->comm, &h.req[0]));
    comm_log_started(&h, g, OP_ALL_REDUCE, (size_t)count * size);
    comm_wait(&h);
}

void all_to_all_host_counts(size_t *recv_counts, const size_t *send_counts, int n, Group *g) {
    _Static_assert(sizeof(size_t) == sizeof(uint64_t), "counts travel as MPI_UINT64_T");
    if (g->size == 1) { // what this rank sends itself
        memcpy(recv_counts, send_counts, (size_t)n * sizeof(size_t));
        return;
    }
    Handle h = {.count = 1};
    mpiCheck(MPI_Ialltoall(send_counts, n, MPI_UINT64_T, recv_counts, n, MPI_UINT64_T, g->comm,
                           &h.req[0]));
    comm_log_started(&h, g, OP_ALL_TO_ALL, (size_t)(g->size - 1) * n * sizeof(uint64_t));
    comm_wait(&h);
}
