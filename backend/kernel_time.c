// Kernel timing by kind (backend/kernel_time.h): a few clock reads per kernel, each kernel a
// millisecond or more at the sizes that matter, so it is always on and printed only when asked.
#include "backend/kernel_time.h"
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "utils.h"

static struct { double seconds, flops, bytes; } total[KT_KINDS];
static int depth;    // a kernel calling another is timed once, as the outer one
static int counting; // inside a step

void kernel_time_count(int on) {
    counting = on;
}

KernelSpan kernel_time_begin(KernelKind kind, double flops, double bytes) {
    return (KernelSpan){
        .kind = kind, .start = depth++ ? -1.0 : now_seconds(), .flops = flops, .bytes = bytes};
}

void kernel_time_end(KernelSpan *span) {
    depth--;
    if (span->start < 0 || !counting) return;
    total[span->kind].seconds += now_seconds() - span->start;
    total[span->kind].flops += span->flops;
    total[span->kind].bytes += span->bytes;
}

// bytes/s of a large copy on this rank's threads: the limit the passes that only stream memory have
static double copy_bandwidth(void) {
    size_t n = 64u << 20;
    char *a = xmalloc(n), *b = xmalloc(n);
    memset(a, 1, n), memset(b, 2, n);
    double best = 0;
    int threads = omp_get_max_threads();
    size_t piece = n / threads;
    for (int i = 0; i < 3; i++) {
        double t = now_seconds();
#pragma omp parallel for
        for (int k = 0; k < threads; k++) memcpy(b + k * piece, a + k * piece, piece);
        t = now_seconds() - t;
        if (t > 0 && 2.0 * n / t > best) best = 2.0 * n / t; // read and write
    }
    free(a), free(b);
    return best;
}

void kernel_time_report(FILE *f, int steps, double step_seconds, double peak_flops) {
    if (!getenv("PICOTRON_KERNEL_TIME") || steps <= 0 || step_seconds <= 0) return;
    static const char *names[KT_KINDS] = {"GEMM",  "attention", "norms, elementwise",
                                          "AdamW", "loss",      "waiting (comm)"};
    double bandwidth = copy_bandwidth(), timed = 0;
    fprintf(f,
            "where rank 0's step goes (%.1f ms a step over %d steps; limits: FMA peak %.1f "
            "GFLOP/s, copy %.1f GB/s):\n",
            1e3 * step_seconds / steps, steps, peak_flops / 1e9, bandwidth / 1e9);
    fprintf(f, "  kind                  share  ms/step   GFLOP/s  of peak     GB/s  of copy\n");
    for (int k = 0; k < KT_KINDS; k++) {
        double s = total[k].seconds;
        timed += s;
        fprintf(f, "  %-20s %5.1f%%  %7.2f", names[k], 100 * s / step_seconds, 1e3 * s / steps);
        if (total[k].flops > 0 && s > 0)
            fprintf(f, "  %8.1f   %5.1f%%", total[k].flops / s / 1e9,
                    peak_flops > 0 ? 100 * total[k].flops / s / peak_flops : 0.0);
        else
            fprintf(f, "  %8s   %6s", "", "");
        if (total[k].bytes > 0 && s > 0)
            fprintf(f, "  %7.1f   %5.1f%%", total[k].bytes / s / 1e9,
                    100 * total[k].bytes / s / bandwidth);
        fprintf(f, "\n");
    }
    fprintf(f, "  %-20s %5.1f%%  %7.2f\n", "the rest (untimed)",
            100 * (step_seconds - timed) / step_seconds, 1e3 * (step_seconds - timed) / steps);
}
