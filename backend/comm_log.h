// What the collectives did, counted where they happen: every communication of the backend (and
// of comm_host.c) tells comm_log_started when it starts and comm_log_finished when its wait ends.
// The tracer (trace.c) reads the counters and takes the spans; the backend never calls the
// tracer, so the collectives stay below everything that reports on them.
#pragma once
#include <stddef.h>
#include "backend/comm.h"

// per group kind: bytes this rank sent, seconds it waited, communications started
typedef struct {
    double bytes, waited;
    long calls;
} CommCounters;

// one communication that has ended: in flight from start to end, waited for from wait_started
typedef struct {
    double start, end, wait_started, bytes;
    GroupKind group;
    CommOp op;
} CommSpan;

void comm_log_started(Handle *h, const Group *g, CommOp op, size_t bytes);
void comm_log_finished(Handle *h, double wait_started);
// the watchdog, called by comm_wait between two polls: once h has been waited for longer than
// comm_set_timeout's seconds (since wait_started), prints one line and ends the job
void comm_watchdog(const Handle *h, double wait_started);
// the same for a wait on the device (the GPU build): NCCL's blocking collectives are queued with
// the kernels, so a stopped peer shows as a device that never finishes; names the last
// communication started, the likeliest one it waits on
void comm_watchdog_device(double wait_started);
// "all_reduce", "send", ... and "tp", "dp", ..., as the trace and the watchdog name them
const char *comm_op_name(CommOp op);
const char *comm_group_name(GroupKind group);
// the counters since the start of the run, indexed by GroupKind
const CommCounters *comm_log_counters(void);
// keep = 1: each finished communication is also kept as a span until comm_log_take_spans
void comm_log_keep_spans(int keep);
// the spans kept since the last call, oldest first, in *spans (this file's memory, valid until
// the next call); returns how many
int comm_log_take_spans(const CommSpan **spans);
