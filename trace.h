// What each rank did, and when: the timeline of logging.trace, and the figures every multi-rank
// run prints at its end (trace_report): bytes sent and time waited per process group, the
// pipeline bubble measured from the compute spans, the share of data-parallel communication that
// the backward hid, and each rank's memory; across nodes, each rank's node and the bytes that
// crossed from node to node (nodes.c).
//
// Always on, because they are cheap: per-group counters (two clock reads per communication) and
// per step this rank's compute time and schedule window. With logging.trace, every span is also
// kept (forward and backward of each micro-batch and layer, each communication in flight and
// each wait, the optimizer step) for the first logging.trace_steps steps; at the end the ranks'
// spans meet on rank 0, on rank 0's clock, in one Chrome trace-event file (Perfetto,
// chrome://tracing) and an SVG picture of the last traced step.
#pragma once
#include <stddef.h>
#include "backend/comm.h"
#include "process_group_manager.h"

typedef enum {
    EV_FORWARD,  // one micro-batch through this stage
    EV_BACKWARD, // and back
    EV_LAYER_FORWARD,
    EV_LAYER_BACKWARD,
    EV_OPTIMIZER, // clipping and AdamW
    EV_WAIT,      // this rank blocked on a communication (its compute row)
    EV_IN_FLIGHT, // a communication from its start to its end (the communication row)
    EV_STEP,      // a whole step, optimizer included
    EV_KINDS
} EventKind;

// path: logging.trace ("" records nothing but the counters); the first `steps` steps are traced
void trace_init(const char *path, int steps, ProcessGroupManager *pgm);
void trace_step_begin(int step);
void trace_step_end(void);
double trace_begin(void); // the start of a span: now
// when this step's last forward or backward on this rank ended (data parallelism's overlap)
double trace_compute_end(void);
// a span [start, now] of this rank; micro -1 and layer -1 when they do not apply. A forward or
// backward of one chunk of an interleaved pipeline passes the chunk as its layer.
void trace_end(EventKind kind, int micro, int layer, double start);

// What one rank holds, for the report
typedef struct {
    double params, grads, optimizer, activations_peak; // bytes
    double gathered; // ZeRO-2 and 3: the peak of the units' whole gradients and gathered weights
    double allocated_peak; // device_allocated_peak(): the allocator's count, to check the others
} RankMemory;

// At the end of the run, on every rank: the report (rank 0 prints it; on one rank only the
// memory) and, with logging.trace, the files. dp_overlap: the share of the data-parallel
// all-reduces' time in flight that overlapped the backward; dp_mode: "bucketed" or "naive";
// virtual_stages: distributed.pp_virtual_stages (the bubble's formula)
void trace_finish(const RankMemory *memory, double dp_overlap, const char *dp_mode, int grad_acc,
                  const char *pp_engine, int virtual_stages);
