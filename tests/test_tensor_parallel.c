// Every tensor-parallel layer of tensor_parallel.c, run sharded over tp = world size ranks, equals
// its unsharded twin computed whole on every rank with the plain backend kernels, within TOL
// relative to the largest |reference|: column-parallel linears (two sharing one input, async
// all-reduce off and on) and row-parallel linears forward and backward, the vocab-parallel
// embedding forward and backward, and the vocab-parallel cross-entropy (loss and dlogits) against
// a double-precision loss over the whole vocabulary. The loss is also checked to touch nothing but
// its (N, V/tp) shard: NaN guards after the logits and dlogits stay unread and unwritten.
// Sequence parallelism: the same layers with the input held as N/tp rows per rank give the rows of
// the unsharded results (the gathered input is the whole input; a row-parallel linear's and the
// embedding's output, and the column-parallel dinp, are this rank's rows of the whole; the
// row-parallel and embedding backward read only this rank's rows of dout). The norms' weight
// gradients under sequence parallelism are checked end to end by t_66.
// Run with mpirun -np 2 and -np 4.
#include <math.h>
#include <string.h>
#include "backend/backend.h"
#include "process_group_manager.h"
#include "sequence_parallel.h"
#include "tensor_parallel.h"
#include "utils.h"
#include "tests/test_util.h"

// float sums of up to a few hundred products, compared with the same sums in another order
#define TOL   1e-5
#define GUARD 64 // NaN floats after a sharded loss buffer

static int failures;

// tensor parallelism over tp; seq: with the stream's (N, C) rows split over it (sp's)
static TensorParallel tensor_parallel(Group *tp, int async, int seq, SequenceParallel *sp, int N,
                                      int C) {
    TensorParallel t = {.group = tp, .async = async};
    if (seq) sequence_parallel_split(sp, &t, N, C);
    return t;
}

static void free_split(const TensorParallel *t) {
    if (t->split) device_free(t->split->full);
}

// the columns [c0, c0 + cols) of a (rows, ld) matrix, as a (rows, cols) one
static float *columns(const float *x, int rows, int ld, int c0, int cols) {
    float *out = xmalloc((size_t)rows * cols * sizeof(float));
    for (int r = 0; r < rows; r++)
        memcpy(out + (size_t)r * cols, x + (size_t)r * ld + c0, cols * sizeof(float));
    return out;
}

// got: a device tensor; ref: host values. The worst rank's error is reported and judged.
static void check(const char *what, const float *got_dev, const float *ref, size_t n) {
    double worst = rel_to_max_all_ranks(got_dev, ref, n);
    int bad = !(worst <= TOL);
    failures += bad;
    if (world_rank() == 0)
        printf("%-4s %-52s max rel diff %.1e (tol %.0e)\n", bad ? "FAIL" : "ok", what, worst, TOL);
}

static void check_column_parallel(Group *tp, int async, int seq) {
    enum { N = 24, C = 32, OC1 = 48, OC2 = 16 };
    int r = tp->rank, o1 = OC1 / tp->size, o2 = OC2 / tp->size;
    SequenceParallel sp;
    TensorParallel t = tensor_parallel(tp, async, seq, &sp, N, C);
    int rows = seq ? N / tp->size : N, row0 = seq ? r * rows : 0; // the input rows held
    float *x = random_host(N * C), *w1 = random_host(OC1 * C), *w2 = random_host(OC2 * C);
    float *dy1 = random_host(N * OC1), *dy2 = random_host(N * OC2);
    // the whole layer on every rank
    float *X = to_device(x, sizeof(float) * N * C), *W1 = to_device(w1, sizeof(float) * OC1 * C);
    float *W2 = to_device(w2, sizeof(float) * OC2 * C);
    float *DY1 = to_device(dy1, sizeof(float) * N * OC1);
    float *DY2 = to_device(dy2, sizeof(float) * N * OC2);
    float *Y1 = device_malloc(sizeof(float) * N * OC1), *DX = device_malloc(sizeof(float) * N * C);
    float *Y2 = device_malloc(sizeof(float) * N * OC2);
    float *DW1 = device_malloc(sizeof(float) * OC1 * C);
    float *DW2 = device_malloc(sizeof(float) * OC2 * C);
    matmul_forward(Y1, X, W1, N, C, OC1);
    matmul_forward(Y2, X, W2, N, C, OC2);
    matmul_backward(DX, DW1, DY1, X, W1, N, C, OC1);
    matmul_backward(DX, DW2, DY2, X, W2, N, C, OC2);
    float *y1 = to_host(Y1, N * OC1), *y2 = to_host(Y2, N * OC2), *dx = to_host(DX, N * C);
    float *dw1 = to_host(DW1, OC1 * C), *dw2 = to_host(DW2, OC2 * C);
    // this rank's weight rows = its output columns
    float *dy1_r = columns(dy1, N, OC1, r * o1, o1), *dy2_r = columns(dy2, N, OC2, r * o2, o2);
    float *y1_r = columns(y1, N, OC1, r * o1, o1), *y2_r = columns(y2, N, OC2, r * o2, o2);
    float *w1_r = to_device(w1 + (size_t)r * o1 * C, sizeof(float) * o1 * C);
    float *w2_r = to_device(w2 + (size_t)r * o2 * C, sizeof(float) * o2 * C);
    float *dout1 = to_device(dy1_r, sizeof(float) * N * o1);
    float *dout2 = to_device(dy2_r, sizeof(float) * N * o2);
    float *out1 = device_malloc(sizeof(float) * N * o1);
    float *out2 = device_malloc(sizeof(float) * N * o2);
    float *dinp = device_malloc(sizeof(float) * N * C);
    float *dw1_r = device_malloc(sizeof(float) * o1 * C);
    float *dw2_r = device_malloc(sizeof(float) * o2 * C);
    // the input this rank holds: all N rows, or its N/tp under sequence parallelism
    float *held = to_device(x + (size_t)row0 * C, sizeof(float) * rows * C);
    ColumnParallelOut outs[2] = {{out1, w1_r, o1}, {out2, w2_r, o2}};
    column_parallel_linear_forward(&t, outs, 2, held, N, C);
    ColumnParallelGrad lin[2] = {{dw1_r, w1_r, dout1, o1}, {dw2_r, w2_r, dout2, o2}};
    fill(dinp, NAN, (size_t)N * C); // written, not added to: what it held must not show
    const float *own = column_parallel_linear_backward(&t, dinp, lin, 2, held, N, C);
    char what[80];
    snprintf(what, sizeof what, "column-parallel forward 1 (async %d, sequence %d)", async, seq);
    check(what, out1, y1_r, N * o1);
    snprintf(what, sizeof what, "column-parallel forward 2 (async %d, sequence %d)", async, seq);
    check(what, out2, y2_r, N * o2);
    snprintf(what, sizeof what, "column-parallel dinp, 2 linears (async %d, seq %d)", async, seq);
    check(what, own, dx + (size_t)row0 * C, (size_t)rows * C);
    snprintf(what, sizeof what, "column-parallel dweight 1 (async %d, sequence %d)", async, seq);
    check(what, dw1_r, dw1 + (size_t)r * o1 * C, o1 * C);
    snprintf(what, sizeof what, "column-parallel dweight 2 (async %d, sequence %d)", async, seq);
    check(what, dw2_r, dw2 + (size_t)r * o2 * C, o2 * C);
    free_split(&t);
    float *dev[] = {X,    W1,   W2,    DY1,   DY2,  Y1,   Y2,   DX,    DW1,   DW2,
                    w1_r, w2_r, dout1, dout2, out1, out2, dinp, dw1_r, dw2_r, held};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) device_free(dev[i]);
    float *host[] = {x, w1, w2, dy1, dy2, y1, y2, dx, dw1, dw2, dy1_r, dy2_r, y1_r, y2_r};
    for (size_t i = 0; i < sizeof host / sizeof *host; i++) free(host[i]);
}

static void check_row_parallel(Group *tp, int seq) {
    enum { N = 24, I = 64, C = 32 };
    int r = tp->rank, i_r = I / tp->size;
    SequenceParallel sp;
    TensorParallel t = tensor_parallel(tp, 0, seq, &sp, N, C);
    int rows = seq ? N / tp->size : N, row0 = seq ? r * rows : 0; // the output rows held
    float *x = random_host(N * I), *w = random_host(C * I), *dy = random_host(N * C);
    float *X = to_device(x, sizeof(float) * N * I), *W = to_device(w, sizeof(float) * C * I);
    float *DY = to_device(dy, sizeof(float) * N * C), *Y = device_malloc(sizeof(float) * N * C);
    float *DX = device_malloc(sizeof(float) * N * I), *DW = device_malloc(sizeof(float) * C * I);
    matmul_forward(Y, X, W, N, I, C);
    matmul_backward(DX, DW, DY, X, W, N, I, C);
    float *y = to_host(Y, N * C), *dx = to_host(DX, N * I), *dw = to_host(DW, C * I);
    // this rank's input features: columns of the input and of the weight
    float *x_r = columns(x, N, I, r * i_r, i_r), *w_r = columns(w, C, I, r * i_r, i_r);
    float *dx_r = columns(dx, N, I, r * i_r, i_r), *dw_r = columns(dw, C, I, r * i_r, i_r);
    float *inp = to_device(x_r, sizeof(float) * N * i_r);
    float *weight = to_device(w_r, sizeof(float) * C * i_r);
    float *out = device_malloc(sizeof(float) * N * C);
    float *dinp = device_malloc(sizeof(float) * N * i_r);
    float *dweight = device_malloc(sizeof(float) * C * i_r);
    row_parallel_linear_forward(&t, out, inp, weight, N, i_r, C);
    // the backward's dout: the rows held, which sequence parallelism gathers
    float *dy_held = to_device(dy + (size_t)row0 * C, sizeof(float) * rows * C);
    fill(dinp, NAN, (size_t)N * i_r); // written, not added to
    row_parallel_linear_backward(&t, dinp, dweight, dy_held, inp, weight, N, i_r, C);
    check(seq ? "row-parallel forward (reduce-scattered: this rank's rows)"
              : "row-parallel forward (all-reduced)",
          out, y + (size_t)row0 * C, (size_t)rows * C);
    check(seq ? "row-parallel dinp (sequence parallel)" : "row-parallel dinp", dinp, dx_r, N * i_r);
    check(seq ? "row-parallel dweight (sequence parallel)" : "row-parallel dweight", dweight, dw_r,
          C * i_r);
    device_free(dy_held);
    free_split(&t);
    float *dev[] = {X, W, DY, Y, DX, DW, inp, weight, out, dinp, dweight};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) device_free(dev[i]);
    float *host[] = {x, w, dy, y, dx, dw, x_r, w_r, dx_r, dw_r};
    for (size_t i = 0; i < sizeof host / sizeof *host; i++) free(host[i]);
}

static void check_embedding(Group *tp, int seq) {
    enum { N = 40, C = 16, V = 32 };
    int r = tp->rank, v_r = V / tp->size;
    SequenceParallel sp;
    TensorParallel t = tensor_parallel(tp, 0, seq, &sp, N, C);
    int rows = seq ? N / tp->size : N, row0 = seq ? r * rows : 0; // the output rows held
    float *wte = random_host(V * C), *dy = random_host(N * C);
    int tokens[N];
    for (int i = 0; i < N; i++) tokens[i] = (int)((uniform() + 1.0f) * 0.5f * V) % V;
    tokens[1] = tokens[0]; // a repeated token: its gradient rows must add up
    int *TOK = (int *)to_device(tokens, sizeof tokens);
    float *WTE = to_device(wte, sizeof(float) * V * C), *DY = to_device(dy, sizeof(float) * N * C);
    float *Y = device_malloc(sizeof(float) * N * C), *DWTE = device_malloc(sizeof(float) * V * C);
    embedding_forward(Y, TOK, WTE, N, C, 0, V);
    embedding_backward(DWTE, DY, TOK, N, C, 0, V);
    float *y = to_host(Y, N * C), *dwte = to_host(DWTE, V * C);
    float *wte_r = to_device(wte + (size_t)r * v_r * C, sizeof(float) * v_r * C);
    float *out = device_malloc(sizeof(float) * N * C);
    float *dwte_r = device_malloc(sizeof(float) * v_r * C);
    float *dy_held = to_device(dy + (size_t)row0 * C, sizeof(float) * rows * C);
    vocab_parallel_embedding_forward(&t, out, TOK, wte_r, N, C, r * v_r, v_r);
    vocab_parallel_embedding_backward(&t, dwte_r, dy_held, TOK, N, C, r * v_r, v_r);
    check(seq ? "vocab-parallel embedding forward (this rank's rows)"
              : "vocab-parallel embedding forward",
          out, y + (size_t)row0 * C, (size_t)rows * C);
    check(seq ? "vocab-parallel embedding dwte (vocab rows; sequence parallel)"
              : "vocab-parallel embedding dwte (this rank's vocab rows)",
          dwte_r, dwte + (size_t)r * v_r * C, v_r * C);
    device_free(dy_held);
    free_split(&t);
    float *dev[] = {(float *)TOK, WTE, DY, Y, DWTE, wte_r, out, dwte_r};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) device_free(dev[i]);
    free(wte), free(dy), free(y), free(dwte);
}

static void check_cross_entropy(Group *tp) {
    enum { N = 24, V = 64 };
    int r = tp->rank, v_r = V / tp->size;
    float *logits = random_host(N * V);
    for (int i = 0; i < N * V; i++) logits[i] *= 8.0f; // a peaked softmax
    int targets[N];
    for (int i = 0; i < N; i++) targets[i] = (int)((uniform() + 1.0f) * 0.5f * V) % V;
    float loss_scale = 1.0f / N;
    // reference in double over the whole vocabulary
    float *dref = xmalloc(sizeof(float) * N * V);
    double loss_ref = 0;
    for (int n = 0; n < N; n++) {
        const float *l = logits + (size_t)n * V;
        double m = -INFINITY, s = 0;
        for (int j = 0; j < V; j++) m = fmax(m, l[j]);
        for (int j = 0; j < V; j++) s += exp(l[j] - m);
        loss_ref += log(s) + m - l[targets[n]];
        for (int j = 0; j < V; j++)
            dref[n * V + j] = loss_scale * (exp(l[j] - m) / s - (j == targets[n]));
    }
    loss_ref /= N;
    // the shard, followed by NaN guards: a read past it poisons the loss, a write shows
    float *shard = columns(logits, N, V, r * v_r, v_r), *dshard = columns(dref, N, V, r * v_r, v_r);
    size_t n_r = (size_t)N * v_r;
    float *host = xmalloc((n_r + GUARD) * sizeof(float));
    memcpy(host, shard, n_r * sizeof(float));
    for (int i = 0; i < GUARD; i++) host[n_r + i] = NAN;
    float *LOG = to_device(host, (n_r + GUARD) * sizeof(float));
    for (size_t i = 0; i < n_r; i++) host[i] = 0.0f;
    float *DLOG = to_device(host, (n_r + GUARD) * sizeof(float));
    int *TGT = (int *)to_device(targets, sizeof targets);
    VocabParallelLossBuffers buf = {
        device_malloc(N * sizeof(float)), device_malloc(2 * N * sizeof(float)),
        device_malloc(N * sizeof(float)), device_malloc(sizeof(float)), 0}; // no vocabulary padding
    float loss =
        vocab_parallel_cross_entropy(DLOG, LOG, TGT, loss_scale, N, v_r, r * v_r, &buf, tp);
    float loss_dev = loss;
    float *LOSS = to_device(&loss_dev, sizeof(float));
    float ref = (float)loss_ref;
    check("vocab-parallel cross-entropy loss", LOSS, &ref, 1);
    check("vocab-parallel cross-entropy dlogits (this shard)", DLOG, dshard, n_r);
    float *back = to_host(DLOG, n_r + GUARD);
    int written = 0;
    for (int i = 0; i < GUARD; i++) written += !isnan(back[n_r + i]);
    int any_written;
    mpiCheck(MPI_Allreduce(&written, &any_written, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    failures += any_written > 0;
    if (world_rank() == 0) {
        printf("%-4s loss buffers: largest is N x V/tp = %d x %d floats = %zu bytes per rank "
               "(unsharded N x V: %zu bytes); %d guard floats past it written\n",
               any_written ? "FAIL" : "ok", N, v_r, n_r * sizeof(float),
               (size_t)N * V * sizeof(float), any_written);
        printf("     loss %.7f, reference %.7f\n", loss, loss_ref);
    }
    float *dev[] = {LOG, DLOG, (float *)TGT, buf.maxes, buf.stats, buf.losses, buf.loss_sum, LOSS};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) device_free(dev[i]);
    free(logits), free(dref), free(shard), free(dshard), free(host), free(back);
}

int main(int argc, char **argv) {
    int world = mpi_test_init(&argc, &argv, 0x243F6A8885A308D3ull);
    ProcessGroupManager pgm;
    process_group_manager_init(&pgm, world, 1, 1, 1, 1);
    if (48 % world || 16 % world || 64 % world || 32 % world)
        user_error("tp = %d must divide 16: run with mpirun -np 1, 2, 4, 8 or 16", world);
    if (pgm.global_rank == 0) printf("tensor parallel, tp = %d\n", world);
    for (int seq = 0; seq <= 1; seq++) {
        check_column_parallel(&pgm.tp, 0, seq);
        check_column_parallel(&pgm.tp, 1, seq);
        check_row_parallel(&pgm.tp, seq);
        check_embedding(&pgm.tp, seq);
    }
    check_cross_entropy(&pgm.tp);
    if (pgm.global_rank == 0) printf("%d check(s) failed\n", failures);
    process_group_manager_free(&pgm);
    mpiCheck(MPI_Finalize());
    return failures ? 1 : 0;
}
