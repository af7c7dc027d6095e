// The collectives' counters and spans (comm_log.h)
#include "backend/comm_log.h"
#include <stdlib.h>
#include "utils.h"

static CommCounters counters[GROUP_KINDS];
static double timeout_s = 600; // torch.distributed's and NCCL's default
static CommOp last_op;         // the last communication started, for comm_watchdog_device
static GroupKind last_group;

static const char *group_names[GROUP_KINDS] = {"other", "world", "tp",    "cp",
                                               "pp",    "dp",    "embed", "ep"};
static const char *op_names[] = {"",          "all_reduce", "send",           "recv",
                                 "send_recv", "barrier",    "reduce_scatter", "all_gather",
                                 "all_to_all"};

void comm_watchdog_device(double wait_started) {
    double waited = now_seconds() - wait_started;
    if (waited < timeout_s) return;
    if (last_op == OP_NONE)
        fail_job("timeout: waited %.0f s for the device (distributed.timeout_s = %g): a kernel "
                 "never ends",
                 waited, timeout_s);
    fail_job("timeout: waited %.0f s for the device, its last communication %s on %s "
             "(distributed.timeout_s = %g): a rank of that group has stopped or is far behind, "
             "or a kernel never ends",
             waited, op_names[last_op], group_names[last_group], timeout_s);
}

const char *comm_op_name(CommOp op) {
    return op_names[op];
}

const char *comm_group_name(GroupKind group) {
    return group_names[group];
}

void comm_set_timeout(double seconds) {
    timeout_s = seconds;
}

// A stopped peer never answers and MPI never gives up, so the job would hang until its time limit.
// The wait names what it waits on (read before comm_log_finished clears h->op); fail_job ends
// every rank, the stopped one too (MPI_Abort kills it).
void comm_watchdog(const Handle *h, double wait_started) {
    double waited = now_seconds() - wait_started;
    if (waited < timeout_s) return;
    fail_job("timeout: waited %.0f s for %s on %s (distributed.timeout_s = %g): a rank of that "
             "group has stopped or is far behind",
             waited, h->op == OP_NONE ? "a communication" : op_names[h->op], group_names[h->group],
             timeout_s);
}
static int keeping;
static CommSpan *spans;
static int num_spans, spans_cap, taken;

void comm_log_started(Handle *h, const Group *g, CommOp op, size_t bytes) {
    h->op = op;
    h->group = g->kind;
    h->bytes = bytes;
    h->started = now_seconds();
    last_op = op;
    last_group = g->kind;
    counters[g->kind].bytes += (double)bytes;
    counters[g->kind].calls++;
}

void comm_log_finished(Handle *h, double wait_started) {
    if (h->op == OP_NONE) return; // nothing started, or already counted
    h->finished = now_seconds();
    h->waited = h->finished - wait_started;
    counters[h->group].waited += h->waited;
    if (keeping) {
        if (taken) num_spans = 0, taken = 0; // the taker has read them
        if (num_spans == spans_cap) {
            spans_cap = spans_cap ? 2 * spans_cap : 256;
            CommSpan *grown = xmalloc(spans_cap * sizeof(CommSpan));
            for (int i = 0; i < num_spans; i++) grown[i] = spans[i];
            free(spans);
            spans = grown;
        }
        spans[num_spans++] = (CommSpan){.start = h->started,
                                        .end = h->finished,
                                        .wait_started = wait_started,
                                        .bytes = (double)h->bytes,
                                        .group = h->group,
                                        .op = h->op};
    }
    h->op = OP_NONE;
}

const CommCounters *comm_log_counters(void) {
    return counters;
}

void comm_log_keep_spans(int keep) {
    keeping = keep;
}

int comm_log_take_spans(const CommSpan **out) {
    int n = taken ? 0 : num_spans;
    *out = spans;
    taken = 1;
    return n;
}
