// A tensor-parallel pair's all-reduce through shared memory (comm_shared_pair.c), for comm_mpi.c.
#pragma once
#include "backend/comm.h"

// Starts buf's exchange through the pair's shared memory, when g is a tp pair on one node and the
// buffer fits: h's partner_copy is then the partner's copy, to be read once it has arrived.
// Returns 0 where it must go over MPI instead (h untouched).
int shared_pair_start(Handle *h, float *buf, size_t n, Group *g);
// 1 once the partner's copy has arrived (or h has no shared exchange)
int shared_pair_arrived(const Handle *h);
// tells the partner that h's copy has been read: it may write the slot again
void shared_pair_read(Handle *h);
void shared_pair_free(Group *g);
