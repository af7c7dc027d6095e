// What one recorded span costs: trace_begin + trace_end, EVENTS times, with logging.trace off (the
// counters and the step window only) and on (the span kept too), on one rank. bench_trace.sh
// multiplies it by the events a real step records and divides by that step's time: a figure that
// does not drown in the noise of a loaded machine, beside the end-to-end on/off comparison.
// usage: build/bench/bench_trace_event [events]
#include <math.h>
#include <unistd.h>
#include "process_group_manager.h"
#include "trace.h"
#include "utils.h"

// the fastest of REPEATS rounds: on a busy machine the others measure the neighbours
#define REPEATS 5
static double ns_per_span(int events) {
    double best = INFINITY;
    for (int r = 0; r < REPEATS; r++) {
        trace_step_begin(1);
        double start = now_seconds();
        for (int i = 0; i < events / REPEATS; i++)
            trace_end(EV_LAYER_FORWARD, -1, i & 7, trace_begin());
        best = fmin(best, (now_seconds() - start) * 1e9 / (events / REPEATS));
        trace_step_end();
    }
    return best;
}

int main(int argc, char **argv) {
    mpiCheck(MPI_Init(&argc, &argv));
    user_errors_init();
    int events = argc > 1 ? atoi(argv[1]) : 200000;
    if (events < 1 || events > 250000)
        user_error("usage: bench_trace_event [events]: events = %s must be 1..250000 (the trace "
                   "keeps at most 262144 per rank)",
                   argv[1]);
    ProcessGroupManager pgm;
    process_group_manager_init(&pgm, 1, 1, 1, 1, 1);
    char path[] = "/tmp/picotron-bench-trace-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) FAIL("is /tmp writable?", "mkstemp failed");
    close(fd);
    trace_init("", 1, &pgm);
    double off = ns_per_span(events);
    trace_init(path, REPEATS, &pgm); // every round's spans are kept
    double on = ns_per_span(events);
    printf("one span (trace_begin + trace_end), fastest of %d rounds of %d: %.1f ns without "
           "logging.trace, %.1f ns with it\n",
           REPEATS, events / REPEATS, off, on);
    unlink(path);
    process_group_manager_free(&pgm);
    mpiCheck(MPI_Finalize());
    return 0;
}
