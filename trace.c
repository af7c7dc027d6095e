// What each rank did, and when (trace.h): counters per process group, the pipeline's compute per
// step, and with logging.trace every span, merged at the end into trace.json and trace.svg.
// The clocks: each rank reads its own monotonic clock; trace_init measures every rank's offset to
// rank 0's by ping-pong (the exchange with the shortest round trip of a few, as NTP does), so the
// merged timeline and the pipeline's window are on one clock even across nodes.
#include "trace.h"
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "backend/backend.h"
#include "backend/comm_log.h"
#include "backend/kernel_time.h"
#include "nodes.h"
#include "svg.h"
#include "utils.h"

#define MAX_EVENTS   (1 << 18) // per rank (16 MB): a longer trace drops what comes after
#define CLOCK_ROUNDS 8
#define COMM_LANES   3 // rows of the SVG for communications in flight at the same time

typedef struct {
    double start, end;    // seconds on this rank's clock
    double bytes, waited; // communications only: sent, and the seconds this rank waited
    int step, micro, layer;
    short kind, group, op, pad;
} Event;

typedef CommCounters CommStats; // per group: sent by this rank, seconds it waited, calls

// per step, for the bubble: this rank's schedule window and the compute inside it
typedef struct {
    double begin, end, compute;
} StepWindow;

static struct {
    ProcessGroupManager *pgm;
    char path[512];
    int trace_steps, steps_begun, step, in_step, dropped;
    double clock_offset; // add to this rank's clock to read rank 0's
    Event *events;
    int num_events;
    CommStats at_step_begin[GROUP_KINDS], first[GROUP_KINDS], rest[GROUP_KINDS];
    int rest_steps, group_size[GROUP_KINDS];
    double step_seconds; // all steps, for the kernel timing's shares
    StepWindow *windows;
    int num_windows, windows_cap;
    NodeLayout nodes; // this rank's node, and which of its groups cross to another (nodes.c)
} tr;

static int recording(void) {
    return tr.events && tr.in_step && tr.steps_begun <= tr.trace_steps;
}

static void record(EventKind kind, double start, double end, int micro, int layer, GroupKind group,
                   CommOp op, double bytes, double waited) {
    if (!recording()) return;
    if (tr.num_events == MAX_EVENTS) {
        tr.dropped++;
        return;
    }
    tr.events[tr.num_events++] = (Event){.start = start,
                                         .end = end,
                                         .bytes = bytes,
                                         .waited = waited,
                                         .step = tr.step,
                                         .micro = micro,
                                         .layer = layer,
                                         .kind = (short)kind,
                                         .group = (short)group,
                                         .op = (short)op};
}

// the communications that ended since the last record, each in flight and, if this rank
// waited for it, its wait: recorded before the span that ends now, so events stay in the order
// they ended
static void record_comm_spans(void) {
    const CommSpan *c;
    int n = comm_log_take_spans(&c);
    for (int i = 0; i < n; i++) {
        double waited = c[i].end - c[i].wait_started;
        record(EV_IN_FLIGHT, c[i].start, c[i].end, -1, -1, c[i].group, c[i].op, c[i].bytes, waited);
        if (waited > 0)
            record(EV_WAIT, c[i].wait_started, c[i].end, -1, -1, c[i].group, c[i].op, 0, waited);
    }
}

// one double to or from `peer`, over MPI on the host whatever the backend, waited for as always
static void send_double(double value, int peer, Group *world) {
    Handle h = {.count = 1};
    mpiCheck(MPI_Isend(&value, 1, MPI_DOUBLE, peer, 0, world->comm, &h.req[0]));
    comm_wait(&h);
}
static double recv_double(int peer, Group *world) {
    double value;
    Handle h = {.count = 1};
    mpiCheck(MPI_Irecv(&value, 1, MPI_DOUBLE, peer, 0, world->comm, &h.req[0]));
    comm_wait(&h);
    return value;
}

// rank 0 pings each rank in turn; the reply carries that rank's clock, read halfway through the
// round trip, give or take the asymmetry of the two messages (at most the shortest round trip)
static void align_clocks(Group *world) {
    for (int r = 1; r < world->size; r++) {
        if (world->rank == 0) {
            double best = INFINITY, offset = 0.0;
            for (int round = 0; round < CLOCK_ROUNDS; round++) {
                double t0 = now_seconds();
                send_double(t0, r, world);
                double theirs = recv_double(r, world), t1 = now_seconds();
                if (t1 - t0 < best) best = t1 - t0, offset = (t0 + t1) / 2 - theirs;
            }
            send_double(offset, r, world);
        } else if (world->rank == r) {
            for (int round = 0; round < CLOCK_ROUNDS; round++) {
                recv_double(0, world);
                send_double(now_seconds(), 0, world);
            }
            tr.clock_offset = recv_double(0, world);
        }
    }
}

// the picture's file beside the trace's: trace.json -> trace.svg, trace -> trace.svg
static void svg_path_of(char *out, size_t size, const char *path) {
    size_t len = strlen(path);
    int json = len > 5 && strcmp(path + len - 5, ".json") == 0;
    snprintf(out, size, "%.*s.svg", (int)(json ? len - 5 : len), path);
}

void trace_init(const char *path, int steps, ProcessGroupManager *pgm) {
    memset(&tr, 0, sizeof tr);
    tr.pgm = pgm;
    tr.trace_steps = steps;
    const Group *groups[] = {&pgm->world, &pgm->tp,    &pgm->cp, &pgm->pp,
                             &pgm->cp_dp, &pgm->embed, &pgm->ep};
    for (int i = 0; i < 7; i++) tr.group_size[groups[i]->kind] = groups[i]->size;
    if (path[0]) {
        // find out now, not after the run, that a file cannot be written: rank 0 creates both
        // (the trace and its picture), and every rank ends with its one line when one fails
        char folder[512], svg[520], why[1400] = "";
        snprintf(folder, sizeof folder, "%s", path);
        char *slash = strrchr(folder, '/');
        if (!slash)
            snprintf(folder, sizeof folder, ".");
        else
            slash[slash == folder] = '\0'; // "/trace.json" lies in "/"
        svg_path_of(svg, sizeof svg, path);
        const char *files[2] = {path, svg};
        for (int i = 0; i < 2 && pgm->global_rank == 0 && !why[0]; i++) {
            FILE *f = access(folder, W_OK) == 0 ? fopen(files[i], "w") : NULL;
            if (!f)
                snprintf(why, sizeof why,
                         "config error: logging.trace = \"%s\": %s cannot be written: %s (name a "
                         "file in a folder that exists)",
                         path, files[i], strerror(errno));
            if (f) fclose(f);
        }
        int failed = why[0] != '\0';
        Handle h = {.count = 1};
        mpiCheck(
            MPI_Iallreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, pgm->world.comm, &h.req[0]));
        comm_wait(&h);
        if (failed) user_error("%s", why); // rank 0 says why; every rank exits
        snprintf(tr.path, sizeof tr.path, "%s", path);
        tr.events = xmalloc(MAX_EVENTS * sizeof(Event));
    }
    if (pgm->world.size > 1) align_clocks(&pgm->world);
    node_layout_init(&tr.nodes, pgm);
}

void trace_step_begin(int step) {
    tr.step = step;
    tr.steps_begun++;
    tr.in_step = 1;
    kernel_time_count(1);
    memcpy(tr.at_step_begin, comm_log_counters(), sizeof tr.at_step_begin);
    const CommSpan *before;
    comm_log_take_spans(&before); // what ended between steps is not drawn
    comm_log_keep_spans(recording());
    if (tr.num_windows == tr.windows_cap) {
        tr.windows_cap = tr.windows_cap ? 2 * tr.windows_cap : 64;
        StepWindow *grown = xmalloc(tr.windows_cap * sizeof(StepWindow));
        if (tr.num_windows) memcpy(grown, tr.windows, tr.num_windows * sizeof(StepWindow));
        free(tr.windows);
        tr.windows = grown;
    }
    double t = now_seconds();
    tr.windows[tr.num_windows++] = (StepWindow){.begin = t, .end = t, .compute = 0.0};
}

// the first step pays for first touches of memory: the report averages the others
void trace_step_end(void) {
    CommStats *sum = tr.steps_begun == 1 ? tr.first : tr.rest;
    const CommStats *now = comm_log_counters();
    for (int g = 0; g < GROUP_KINDS; g++) {
        sum[g].bytes += now[g].bytes - tr.at_step_begin[g].bytes;
        sum[g].waited += now[g].waited - tr.at_step_begin[g].waited;
        sum[g].calls += now[g].calls - tr.at_step_begin[g].calls;
    }
    record_comm_spans();
    if (tr.steps_begun > 1) tr.rest_steps++;
    double end = now_seconds();
    record(EV_STEP, tr.windows[tr.num_windows - 1].begin, end, -1, -1, GROUP_OTHER, OP_NONE, 0, 0);
    tr.step_seconds += end - tr.windows[tr.num_windows - 1].begin;
    kernel_time_count(0);
    tr.in_step = 0;
    comm_log_keep_spans(0);
}

double trace_begin(void) {
    return now_seconds();
}

double trace_compute_end(void) {
    return tr.num_windows ? tr.windows[tr.num_windows - 1].end : now_seconds();
}

void trace_end(EventKind kind, int micro, int layer, double start) {
    // a GPU queues its kernels: with a timeline to draw, the span ends when they have run
    if (tr.events) device_synchronize();
    double end = now_seconds();
    if (tr.in_step && (kind == EV_FORWARD || kind == EV_BACKWARD)) {
        StepWindow *w = &tr.windows[tr.num_windows - 1];
        w->compute += end - start;
        w->end = end;
    }
    record_comm_spans();
    record(kind, start, end, micro, layer, GROUP_OTHER, OP_NONE, 0, 0);
}

// What rank 0 gathers from each rank for the report
typedef struct {
    char name[96];
    double clock_offset;
    CommStats per_step[GROUP_KINDS];
    int group_size[GROUP_KINDS];
    double bubble; // mean over the measured steps; -1 without a pipeline
    double dp_overlap;
    RankMemory memory;
    int node, local_rank, num_nodes;
    double off_node[GROUP_KINDS];  // share of this rank's peers in each group on another node
    double run_bytes[GROUP_KINDS]; // sent over the whole run, every step and before the first
} RankReport;

// The pipeline's window of a step runs from the first stage's start to the last stage's end, on
// rank 0's clock: what a stage does not compute inside it is its bubble
static double measured_bubble(void) {
    Group *pp = &tr.pgm->pp;
    int n = tr.num_windows, first = n > 1; // the first step warms up
    if (pp->size == 1 || n == 0) return -1.0;
    // minus each window's begin, then its end: one all-reduce of the maximum gives every step's
    // earliest begin and latest end over the stages
    double *span = xmalloc(2 * n * sizeof(double)), sum = 0.0;
    for (int i = 0; i < n; i++) {
        span[i] = -(tr.windows[i].begin + tr.clock_offset);
        span[n + i] = tr.windows[i].end + tr.clock_offset;
    }
    all_reduce_host(span, 2 * n, MPI_DOUBLE, MPI_MAX, pp);
    for (int i = first; i < n; i++) sum += 1.0 - tr.windows[i].compute / (span[n + i] + span[i]);
    free(span);
    return sum / (n - first);
}

static RankReport this_rank_report(const RankMemory *memory, double dp_overlap) {
    RankReport r = {.clock_offset = tr.clock_offset,
                    .memory = *memory,
                    .dp_overlap = dp_overlap,
                    .node = tr.nodes.node,
                    .local_rank = tr.nodes.local_rank,
                    .num_nodes = tr.nodes.num_nodes};
    snprintf(r.name, sizeof r.name, "%s", tr.pgm->name);
    int steps = tr.rest_steps ? tr.rest_steps : 1;
    const CommStats *sum = tr.rest_steps ? tr.rest : tr.first;
    for (int g = 0; g < GROUP_KINDS; g++) {
        r.per_step[g] =
            (CommStats){sum[g].bytes / steps, sum[g].waited / steps, sum[g].calls / steps};
        r.group_size[g] = tr.group_size[g];
        r.off_node[g] = tr.nodes.off_node[g];
        r.run_bytes[g] = comm_log_counters()[g].bytes;
    }
    r.bubble = measured_bubble();
    return r;
}

// MPI_Igather (the same bytes from every rank) or MPI_Igatherv to world rank 0,
// waited for as every wait; out, counts and displs matter on rank 0 only
static void gather_bytes(void *out, const void *in, int bytes, int *counts, int *displs,
                         int varying) {
    Group *world = &tr.pgm->world;
    Handle h = {.count = 1};
    if (!varying) {
        mpiCheck(MPI_Igather(in, bytes, MPI_BYTE, out, bytes, MPI_BYTE, 0, world->comm, &h.req[0]));
    } else {
        mpiCheck(MPI_Igatherv(in, bytes, MPI_BYTE, out, counts, displs, MPI_BYTE, 0, world->comm,
                              &h.req[0]));
    }
    comm_wait(&h);
}

// one table, a row per rank: per group, bytes sent (exact) or milliseconds waited (this machine's)
static void print_group_table(FILE *f, const RankReport *r, int ranks, const int *shown,
                              int bytes) {
    const GroupKind order[] = {GROUP_DP, GROUP_TP,    GROUP_PP,   GROUP_CP,
                               GROUP_EP, GROUP_EMBED, GROUP_WORLD};
    int nodes = r[0].num_nodes > 1; // then each rank's node and its place there
    fprintf(f, "  rank  layout                          %s", nodes ? "  node:local" : "");
    for (int k = 0; k < 7; k++)
        if (shown[order[k]]) fprintf(f, " %12s", comm_group_name(order[k]));
    fprintf(f, "\n");
    for (int i = 0; i < ranks; i++) {
        fprintf(f, "  %4d  %-32s", i, r[i].name);
        if (nodes) fprintf(f, "  %6d:%-4d", r[i].node, r[i].local_rank);
        for (int k = 0; k < 7; k++) {
            const CommStats *c = &r[i].per_step[order[k]];
            if (shown[order[k]])
                fprintf(f, bytes ? " %12.0f" : " %12.3f", bytes ? c->bytes : 1e3 * c->waited);
        }
        fprintf(f, "\n");
    }
}

// Across nodes: per group, whether it crosses (some rank has a peer in it on another node) and
// the bytes that crossed per step, all ranks together, then the whole run's (what the link's own
// counters can be held against: every communication of the run, not only the steps' mean)
static void print_crossing(FILE *f, const RankReport *r, int ranks, const int *shown) {
    const GroupKind order[] = {GROUP_DP, GROUP_TP,    GROUP_PP,   GROUP_CP,
                               GROUP_EP, GROUP_EMBED, GROUP_WORLD};
    double step[GROUP_KINDS] = {0}, run = 0.0;
    int crosses[GROUP_KINDS] = {0};
    for (int i = 0; i < ranks; i++)
        for (int g = 0; g < GROUP_KINDS; g++) {
            step[g] += r[i].per_step[g].bytes * r[i].off_node[g];
            run += r[i].run_bytes[g] * r[i].off_node[g];
            crosses[g] |= r[i].off_node[g] > 0;
        }
    fprintf(f,
            "across %d nodes: bytes that crossed nodes per step, all ranks (a group's bytes "
            "times its share of peers on other nodes):\n ",
            r[0].num_nodes);
    for (int k = 0; k < 7; k++) {
        GroupKind g = order[k];
        if (!shown[g]) continue;
        if (crosses[g])
            fprintf(f, " %s crosses nodes: %.0f;", comm_group_name(g), step[g]);
        else
            fprintf(f, " %s stays inside a node;", comm_group_name(g));
    }
    fprintf(f, "\n  over the whole run %.0f bytes crossed nodes\n", run);
}

// The table adds up what each part should take; the line after it says how much of what the
// allocator really handed out (its peak) the table accounts for: the rest is small buffers (RoPE
// tables, the ring's and the pipeline's) and the allocator's rounding
static void print_memory_table(FILE *f, const RankReport *r, int ranks) {
    int zero = 0; // ZeRO-2 and 3's column, only where they ran
    for (int i = 0; i < ranks; i++) zero |= r[i].memory.gathered > 0;
    fprintf(f,
            "memory per rank, MB (fp32 weights, gradients and AdamW moments; activations at "
            "their peak):\n  rank  parameters   gradients   optimizer  activations%s\n",
            zero ? "     units" : "");
    double least = INFINITY, most = 0.0;
    for (int i = 0; i < ranks; i++) {
        const RankMemory *m = &r[i].memory;
        fprintf(f, "  %4d  %10.3f  %10.3f  %10.3f  %11.3f", i, m->params / 1e6, m->grads / 1e6,
                m->optimizer / 1e6, m->activations_peak / 1e6);
        if (zero) fprintf(f, "  %8.3f", m->gathered / 1e6);
        fprintf(f, "\n");
        double table = m->params + m->grads + m->optimizer + m->activations_peak + m->gathered;
        least = fmin(least, table / m->allocated_peak);
        most = fmax(most, table / m->allocated_peak);
    }
    fprintf(f, "the allocator's own peak, MB:");
    for (int i = 0; i < ranks; i++) fprintf(f, " %.3f", r[i].memory.allocated_peak / 1e6);
    fprintf(f, "; the table accounts for %.1f%% to %.1f%% of it\n", 100 * least, 100 * most);
}

// What a learner compares between layouts. The deterministic figures come first on each line,
// the measured ones after them, so that a tutorial can show the former and elide the latter.
static void print_report(FILE *f, const RankReport *r, int ranks, const char *dp_mode, int grad_acc,
                         const char *pp_engine, int virtual_stages) {
    int shown[GROUP_KINDS] = {0}, steps = tr.rest_steps ? tr.rest_steps : 1;
    if (ranks == 1) { // nothing travels: what one rank holds, to compare the layouts with
        print_memory_table(f, r, ranks);
        return;
    }
    for (int i = 0; i < ranks; i++) // the groups that exist and carried something
        for (int g = 0; g < GROUP_KINDS; g++)
            shown[g] |= r[i].group_size[g] > 1 && r[i].per_step[g].calls > 0;
    fprintf(f, "bytes sent per step and group (an all-reduce counts its buffer once%s):\n",
            r[0].group_size[GROUP_CP] > 1 ? "; dp is the cp*dp group that averages gradients" : "");
    print_group_table(f, r, ranks, shown, 1);
    if (r[0].num_nodes > 1) print_crossing(f, r, ranks, shown);
    fprintf(
        f,
        "milliseconds waited per step and group, mean of steps %d-%d (depends on the machine):\n",
        tr.steps_begun - steps + 1, tr.steps_begun);
    print_group_table(f, r, ranks, shown, 0);
    print_memory_table(f, r, ranks);
    int p = r[0].group_size[GROUP_PP],
        below = r[0].group_size[GROUP_TP] * r[0].group_size[GROUP_CP];
    if (p > 1) {
        double mean = 0.0, stage[p];
        memset(stage, 0, sizeof stage);
        for (int i = 0; i < ranks; i++) {
            mean += r[i].bubble / ranks;
            stage[i / below % p] += r[i].bubble * p / ranks; // ranks / p of them per stage
        }
        // the step in chunk forwards: the fill's p-1, then V*m (interleaved, a chunk is 1/V stage)
        int chunks = virtual_stages, length = chunks * grad_acc + p - 1;
        char v[16] = "";
        if (chunks > 1) snprintf(v, sizeof v, ", V=%d", chunks);
        fprintf(f,
                "pipeline bubble (%s%s, pp=%d%s, grad_acc=%d): formula (p-1)/(%sm+p-1) = %d/%d = "
                "%.3f; measured %.3f of the step (stages",
                chunks > 1 ? "interleaved " : "", pp_engine, p, v, grad_acc, chunks > 1 ? "V*" : "",
                p - 1, length, (double)(p - 1) / length, mean);
        for (int s = 0; s < p; s++) fprintf(f, " %.3f", stage[s]);
        fprintf(f, ")\n");
    }
    if (r[0].group_size[GROUP_DP] > 1) {
        double mean = 0.0;
        for (int i = 0; i < ranks; i++) mean += r[i].dp_overlap / ranks;
        fprintf(f,
                "data parallel (%s): of the gradient reductions' time in flight, %.0f%% "
                "overlapped the backward\n",
                dp_mode, 100.0 * mean);
    }
}

static const char *event_name(char *buf, size_t size, const Event *e) {
    switch (e->kind) {
    case EV_FORWARD: // F<micro-batch>, and .<chunk> under an interleaved pipeline
    case EV_BACKWARD:
        snprintf(buf, size, e->layer >= 0 ? "%c%d.%d" : "%c%d", e->kind == EV_FORWARD ? 'F' : 'B',
                 e->micro, e->layer);
        break;
    case EV_LAYER_FORWARD:
    case EV_LAYER_BACKWARD:
        snprintf(buf, size, "layer %d", e->layer);
        break;
    case EV_OPTIMIZER:
        snprintf(buf, size, "optimizer");
        break;
    case EV_STEP:
        snprintf(buf, size, "step %d", e->step);
        break;
    case EV_WAIT:
        snprintf(buf, size, "wait %s %s", comm_op_name(e->op), comm_group_name(e->group));
        break;
    default:
        snprintf(buf, size, "%s %s", comm_op_name(e->op), comm_group_name(e->group));
    }
    return buf;
}

static const char *event_category(const Event *e) {
    static const char *cats[EV_KINDS] = {"forward",   "backward", "forward",       "backward",
                                         "optimizer", "wait",     "communication", "step"};
    return cats[e->kind];
}

// every record but the first starts with the comma that separates it from the one before
static void next_record(FILE *f, long *records) {
    fputs(*records ? ",\n" : "\n", f);
    ++*records;
}

// Chrome's trace-event format: one process per rank, thread 0 its compute (and the waits that
// interrupt it), thread 1 its communications in flight (async slices: they overlap), thread 2
// the steps. Times in microseconds from the first event.
static void write_chrome_trace(const Event *ev, const int *counts, const RankReport *r, int ranks,
                               double origin) {
    FILE *f = xfopen(tr.path, "w");
    const char *threads[] = {"compute", "communication", "steps"};
    char name[64];
    long records = 0;
    fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [");
    for (int i = 0; i < ranks; i++) {
        next_record(f, &records);
        fprintf(f,
                "{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": %d, "
                "\"args\": {\"name\": \"rank %d %s\"}}",
                i, i, r[i].name);
        next_record(f, &records);
        fprintf(f,
                "{\"ph\": \"M\", \"name\": \"process_sort_index\", \"pid\": %d, "
                "\"args\": {\"sort_index\": %d}}",
                i, i);
        for (int t = 0; t < 3; t++) {
            next_record(f, &records);
            fprintf(f,
                    "{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": %d, \"tid\": %d, "
                    "\"args\": {\"name\": \"%s\"}}",
                    i, t, threads[t]);
        }
    }
    for (int i = 0, k = 0; i < ranks; i++) {
        for (int j = 0; j < counts[i]; j++, k++) {
            const Event *e = &ev[k];
            double ts = 1e6 * (e->start + r[i].clock_offset - origin);
            double dur = 1e6 * (e->end - e->start);
            event_name(name, sizeof name, e);
            next_record(f, &records);
            if (e->kind == EV_IN_FLIGHT) { // a begin and an end with the same id
                const char *fmt = "{\"ph\": \"%c\", \"cat\": \"communication\", \"id\": %d, "
                                  "\"name\": \"%s\", \"pid\": %d, \"tid\": 1, \"ts\": %.3f";
                fprintf(f, fmt, 'b', k, name, i, ts);
                fprintf(f, ", \"args\": {\"step\": %d, \"bytes\": %.0f, \"waited_ms\": %.3f}}",
                        e->step, e->bytes, 1e3 * e->waited);
                next_record(f, &records);
                fprintf(f, fmt, 'e', k, name, i, ts + dur);
                fputc('}', f);
                continue;
            }
            fprintf(f,
                    "{\"ph\": \"X\", \"cat\": \"%s\", \"name\": \"%s\", \"pid\": %d, "
                    "\"tid\": %d, \"ts\": %.3f, \"dur\": %.3f, \"args\": {\"step\": %d",
                    event_category(e), name, i, e->kind == EV_STEP ? 2 : 0, ts, dur, e->step);
            if (e->micro >= 0) fprintf(f, ", \"micro_batch\": %d", e->micro);
            if (e->layer >= 0)
                fprintf(f, ", \"%s\": %d",
                        e->kind == EV_FORWARD || e->kind == EV_BACKWARD ? "chunk" : "layer",
                        e->layer);
            fputs("}}", f);
        }
    }
    fputs("\n]}\n", f);
    int err = ferror(f) ? EIO : 0;
    if (fclose(f) != 0) err = errno;
    if (err) // one line; the abort ends the other ranks, which are past their last collective
        fail_job("cannot write logging.trace %s: %s (is the disk full?)", tr.path, strerror(err));
}

// 1, 2 or 5 times a power of ten: about `target` ticks across `range`
static double nice_tick(double range, int target) {
    double raw = range / target, p = pow(10.0, floor(log10(raw)));
    return raw / p < 2 ? p : raw / p < 5 ? 2 * p : 5 * p;
}

// The picture of one step: a row per rank, its compute above (forward blue, backward orange,
// optimizer green, waits red on top of what they interrupt) and its communications in flight
// below; hover a box for its name and length
static void write_timeline_svg(const char *path, const Event *ev, const int *counts,
                               const RankReport *r, int ranks, int step) {
    double t0 = INFINITY, t1 = -INFINITY;
    for (int i = 0, k = 0; i < ranks; i++)
        for (int j = 0; j < counts[i]; j++, k++)
            if (ev[k].kind == EV_STEP && ev[k].step == step) {
                t0 = fmin(t0, ev[k].start + r[i].clock_offset);
                t1 = fmax(t1, ev[k].end + r[i].clock_offset);
            }
    if (!(t1 > t0)) return;
    const double left = 250, width = 1000, top = 46, row = 40;
    const char *fill[EV_KINDS] = {"#4e79a7", "#f28e2b", NULL,     NULL,
                                  "#59a14f", "#e15759", "#9c755f"};
    Svg svg;
    svg_open(&svg, path, left + width + 60, top + ranks * row + 70); // room for "node 1"
    svg_text(&svg, 10, 22, 14, "start", "#000",
             "step %d, %.1f ms: one row per rank, its compute above, its communications below",
             step, 1e3 * (t1 - t0));
    double ms = 1e3 * (t1 - t0), tick = nice_tick(ms, 10), scale = width / (t1 - t0);
    for (double t = 0; t <= ms; t += tick) {
        double x = left + t * 1e-3 * scale;
        svg_line(&svg, x, top - 6, x, top + ranks * row, "#ddd", 1);
        svg_text(&svg, x, top - 10, 10, "middle", "#555", "%g ms", t);
    }
    char name[64], title[128];
    // the waits last, so they show on top of the forward or backward they interrupt
    const EventKind layers[] = {EV_FORWARD, EV_BACKWARD, EV_OPTIMIZER, EV_WAIT, EV_IN_FLIGHT};
    for (int i = 0, first = 0; i < ranks; first += counts[i], i++) {
        double y = top + i * row, lane_end[COMM_LANES] = {0};
        if (i > 0 && r[i].node != r[i - 1].node) { // the slow link lies between these rows
            svg_line(&svg, 0, y, left + width, y, "#000", 2);
            svg_text(&svg, left + width + 4, y + 12, 10, "start", "#000", "node %d", r[i].node);
        }
        svg_text(&svg, 10, y + 19, 11, "start", "#000", "rank %d %s", i, r[i].name);
        // passes: the boxes in layer order, then the forward and backward labels on top
        for (int l = 0; l <= 5; l++) {
            for (int k = first; k < first + counts[i]; k++) {
                const Event *e = &ev[k];
                int label = l == 5 && (e->kind == EV_FORWARD || e->kind == EV_BACKWARD);
                if (e->step != step || (l < 5 ? e->kind != (short)layers[l] : !label)) continue;
                double x = left + (e->start + r[i].clock_offset - t0) * scale;
                double w = fmax((e->end - e->start) * scale, 0.5);
                event_name(name, sizeof name, e);
                if (label) {
                    if (w > 18) svg_text(&svg, x + w / 2, y + 18, 10, "middle", "#fff", "%s", name);
                    continue;
                }
                snprintf(title, sizeof title, "%s: %.3f ms", name, 1e3 * (e->end - e->start));
                if (e->kind != EV_IN_FLIGHT) {
                    svg_rect(&svg, x, y + 4, w, 20, fill[e->kind], title);
                    continue;
                }
                // communications in flight together take separate lanes (events come in the
                // order they ended, so a lane is free once its last box ends before this one)
                int lane = 0;
                while (lane < COMM_LANES - 1 && lane_end[lane] > x) lane++;
                lane_end[lane] = fmax(lane_end[lane], x + w);
                svg_rect(&svg, x, y + 26 + 3.5 * lane, w, 3, fill[e->kind], title);
            }
        }
    }
    const char *legend[] = {"forward", "backward", "optimizer", "waiting", "in flight"};
    for (int l = 0; l < 5; l++) {
        double x = left + l * 130, y = top + ranks * row + 20;
        svg_rect(&svg, x, y, 14, 14, fill[layers[l]], NULL);
        svg_text(&svg, x + 20, y + 12, 12, "start", "#000", "%s", legend[l]);
    }
    svg_close(&svg);
}

void trace_finish(const RankMemory *memory, double dp_overlap, const char *dp_mode, int grad_acc,
                  const char *pp_engine, int virtual_stages) {
    ProcessGroupManager *pgm = tr.pgm;
    fflush(stdout); // this rank's last lines go out before rank 0's report
    int ranks = pgm->world_size, me = pgm->global_rank;
    // a kernel runs on this rank's threads alone (ranks sharing a core take turns), so its limit
    // is their whole peak, not the rank's share that MFU counts
    if (me == 0 && getenv("PICOTRON_KERNEL_TIME")) // before the report's collectives
        kernel_time_report(stdout, tr.steps_begun, tr.step_seconds, device_peak_flops(1));
    RankReport mine = this_rank_report(memory, dp_overlap);
    RankReport *all = me == 0 ? xmalloc(ranks * sizeof(RankReport)) : NULL;
    gather_bytes(all, &mine, sizeof mine, NULL, NULL, 0);
    if (me == 0) {
        // one write: the other ranks' last lines cannot land inside the report's
        char *text = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&text, &size);
        if (!f) FAIL("out of memory?", "open_memstream failed");
        print_report(f, all, ranks, dp_mode, grad_acc, pp_engine, virtual_stages);
        fclose(f);
        fwrite(text, 1, size, stdout);
        fflush(stdout);
        free(text);
    }
    if (tr.events) {
        int *counts = me == 0 ? xmalloc(2 * ranks * sizeof(int)) : NULL;
        int *displs = counts ? counts + ranks : NULL, bytes = tr.num_events * (int)sizeof(Event);
        gather_bytes(counts, &bytes, sizeof bytes, NULL, NULL, 0);
        long total = 0;
        for (int i = 0; me == 0 && i < ranks; i++) displs[i] = (int)total, total += counts[i];
        Event *ev = me == 0 ? xmalloc(total ? total : 1) : NULL;
        gather_bytes(ev, tr.events, bytes, counts, displs, 1);
        if (me == 0) {
            double origin = INFINITY;
            for (int i = 0; i < ranks; i++) {
                counts[i] /= sizeof(Event);
                for (int j = displs[i] / (int)sizeof(Event), n = 0; n < counts[i]; j++, n++)
                    origin = fmin(origin, ev[j].start + all[i].clock_offset);
            }
            write_chrome_trace(ev, counts, all, ranks, origin);
            char svg[520];
            svg_path_of(svg, sizeof svg, tr.path);
            int last = tr.steps_begun < tr.trace_steps ? tr.steps_begun : tr.trace_steps;
            write_timeline_svg(svg, ev, counts, all, ranks, tr.step - tr.steps_begun + last);
            printf("trace: %s (open it in ui.perfetto.dev or chrome://tracing) and %s, %ld events "
                   "of the first %d steps%s\n",
                   tr.path, svg, total / (long)sizeof(Event), last,
                   tr.dropped ? " (the rest dropped: lower logging.trace_steps)" : "");
        }
        free(ev);
        free(counts);
        free(tr.events);
    }
    free(all);
    free(tr.windows);
}
