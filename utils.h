// Errors, checks and timing shared by every file.
#pragma once
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <stdint.h>
#include "config.h"
#include "files.h"

// Ends the whole job: prints "[rank r] file:line message" and a hint, then MPI_Abort, so no rank
// is left waiting for one that died.
void fail_at(const char *file, int line, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 4, 5), noreturn));
#define FAIL(hint, ...) fail_at(__FILE__, __LINE__, hint, __VA_ARGS__)

// "[rank r] message" in one line, no file or hint (the message says both), then MPI_Abort
void fail_job(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

// one line naming what is wrong and how to fix it, then exit non-zero on every rank
void user_error(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
// after MPI_Init: lets the ranks that hit the same bad input agree that one of them reports it
void user_errors_init(void);

#define mpiCheck(call) mpi_check((call), #call, __FILE__, __LINE__)
void mpi_check(int err, const char *what, const char *file, int line);

// MPI_Finalize, ended with one line and exit status 1 should it not return within timeout_s
void mpi_finalize_watched(double timeout_s);

// calloc that never returns failure
void *xmalloc_at(size_t bytes, const char *file, int line);
#define xmalloc(bytes) xmalloc_at((bytes), __FILE__, __LINE__)

// Buffers laid out in one allocation: a first pass with base NULL counts the bytes, a second hands
// out the pieces, each aligned to 256 bytes (what cudaMalloc gives its allocations)
static inline void *layout_piece(char *base, size_t *offset, size_t bytes) {
    void *p = base ? base + *offset : NULL;
    *offset += (bytes + 255) / 256 * 256;
    return p;
}

double now_seconds(void);            // monotonic clock
int world_rank(void);                // this process's MPI rank, 0 before MPI_Init
uint64_t hash_string(const char *s); // FNV-1a, names -> init streams

// picotron's MFU numerator: FLOPs per token of a training step (forward and backward)
double flops_per_token(const Config *c);

// picotron's to_readable_format: 4100 -> "4.10K", 1.23e6 -> "1.23M"; returns buf
char *readable(char *buf, double x);

// Levenshtein distance of the first 63 characters, for "did you mean" messages
int edit_distance(const char *a, const char *b);

// Test-only switches, every one of them here: PICOTRON_TEST_<name> in the environment, which a
// real run never sets. They make a fault happen on purpose or turn an optimisation off, so that a
// test can compare:
//   KILL_RANK_IN_SAVE=r      checkpoint.c: rank r dies half-way through writing its part (t_59)
//   CAST_AT_EVERY_PRODUCT=1  backend/cuda: bf16 products cast every operand, keeping no copy (t_81)
//   NCCL_GROUP_OF_ONE=1      backend/cuda/comm_nccl.cu: one-rank groups use NCCL too (check.sh)
//   HANG_IN_FINALIZE=1       utils.c: MPI_Finalize never returns, as it sometimes does (t_47)
// Returns the value, or NULL when it is not set.
const char *test_switch(const char *name);

// OpenMP threads for one of ranks_on_node ranks: `wanted`, or fewer so that the node's cores are
// not oversubscribed (rank 0 says so). Ranks that outnumber the cores also switch to SCHED_BATCH,
// to take turns on them (utils.c)
int threads_per_rank(int wanted, int ranks_on_node);
// Slurm sends SIGTERM, or the signal its --signal asks for, ahead of a time limit: once caught,
// the ranks finish the step, agree, save and exit. stop_signal_caught: the signal, or 0.
void catch_stop_signals(void);
int stop_signal_caught(void);
