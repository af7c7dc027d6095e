// Where a step's time goes, kernel by kernel (beyond picotron; bench/bench_vs_pytorch.sh prints
// it): each CPU kernel adds its seconds, and the work it did (FLOPs of the products, bytes it read
// and wrote), to its kind. Set PICOTRON_KERNEL_TIME=1 and rank 0 prints the table at the end of
// the run (trace.c). The GPU's kernels are asynchronous and not timed here.
#pragma once
#include <stdio.h>

typedef enum {
    KT_GEMM,        // the linear layers' products (backend/cpu/gemm.c)
    KT_ATTENTION,   // the attention blocks, forward and backward
    KT_ELEMENTWISE, // norms, RoPE, SwiGLU, embedding, residual adds, scales, fills
    KT_ADAMW,
    KT_LOSS, // cross-entropy's passes over the logits
    KT_WAIT, // waiting for a communication (comm_wait)
    KT_KINDS
} KernelKind;

typedef struct {
    KernelKind kind;
    double start, flops, bytes;
} KernelSpan;

// only kernels inside a training step count (trace_step_begin and trace_step_end say when)
void kernel_time_count(int on);
KernelSpan kernel_time_begin(KernelKind kind, double flops, double bytes);
void kernel_time_end(KernelSpan *span);
// the table: each kind's share of the step, ms a step, and its rate beside the limit given (the
// FMA peak of this rank's cores in FLOP/s, and the memory bandwidth in bytes/s, measured here)
void kernel_time_report(FILE *f, int steps, double step_seconds, double peak_flops);

// one line at the top of a kernel: the rest of the function is timed as `kind`
#define KERNEL_TIME(kind, flops, bytes)                                                            \
    KernelSpan kernel_span_ __attribute__((cleanup(kernel_time_end))) =                            \
        kernel_time_begin(kind, flops, bytes)
