// The roofline of one training step on one GPU (dp = tp = pp = cp = 1, one micro-batch): every
// kernel, memset, copy and cuBLAS product the CUDA backend issues for it today (model.c's forward
// and backward, tensor_parallel.c's linears, context_parallel.c's ring of one, attention.cu,
// matmul.cu's casts, optimizer.c, train.c's zeroing), each with its FLOPs, its bytes to and from
// HBM, and its time on the roofline, max(FLOPs / peak, bytes / bandwidth); then the step's time,
// tokens/s and MFU by picotron's formula (utils.c's flops_per_token). The changes issue 19 plans
// switch on one by one (--flash, --bf16-activations, --fused-loss, --write-not-zero, --all), so
// each one's effect shows in its own summary line.
// An estimate, never a measurement: a kernel reaches its roofline at best. bench/gpu_bench.sh
// prints it beside the CUDA profiler's measured time, which shows the gap.
// Assumptions:
//  - every operand crosses HBM once: read once, written once, read and written when accumulated
//    (beta = 1, +=); nothing stays in cache between kernels, and a row kernel's passes over one row
//    of scores stay on chip
//  - fp32 and int 4 bytes, bf16 2
//  - linear products at --peak (bf16 tensor cores); attention's batched products, fp32 in and out,
//    at --tf32-peak (CUBLAS_COMPUTE_32F_FAST_TF32); with --dtype fp32 every product, and every
//    elementwise FLOP always, at --fp32-peak (CUDA cores); exp, sqrt and division count one FLOP
//  - launch gaps, host work, PCIe copies (tokens in, loss out) and the collectives of groups of
//    one (they return at once) cost nothing
// The planned changes, as modelled here:
//  --flash             attention in a forward and a backward kernel on the tensor cores: q, k,
//                      v, out (dout) and lse cross HBM once per pass, the 128 x 128 tiles wholly
//                      above the diagonal are skipped, the backward recomputes the scores; at
//                      cp = 1 no ring staging
//  --bf16-activations  the norms and SwiGLU write bf16 for the products, AdamW writes a bf16 copy
//                      of the weights, each dout is cast once; with --flash, q, k, v, att and
//                      d(att) are bf16 too
//  --fused-loss        the loss in two passes over the fp32 logits, the second writing dlogits in
//                      the products' type; dlogits is not zeroed
//  --write-not-zero    the buffers zeroed for a product (or swiglu_backward, or attention's dq,
//                      dk, dv) to add into are written instead (beta = 0); the gradients too, one
//                      micro-batch, but the norms' and an untied embedding's
// usage: build/bench/roofline [shape and device flags] [--flash] [--bf16-activations]
//        [--fused-loss] [--write-not-zero] [--all] [--csv]   (--help lists the flags)
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int layers, hidden, intermediate, heads, kv_heads, vocab, seq, mbs, tied, bf16;
    double peak, tf32_peak, fp32_peak, bandwidth; // FLOP/s of each kind of product; HBM bytes/s
} Setup;

typedef struct {
    int flash, a16, fused_loss, write; // a16: --bf16-activations; write: --write-not-zero
} Plan;

enum { ATTENTION, LINEAR, ELEMENTWISE, ZEROING, HEAD, GROUPS };
static const char *group_names[GROUPS] = {"attention", "linear GEMMs", "casts and elementwise",
                                          "AdamW and zeroing", "head/loss/embedding"};
// where the CUDA profiler (PICOTRON_PROFILE=1, backend/cuda/common.h) counts a row's time: a
// product's bf16 casts count as GEMM, since matmul_forward/backward launch them
enum { PROF_GEMM, PROF_ATTENTION, PROF_OTHER, PROFS };
static const char *prof_names[PROFS] = {"GEMM", "attention", "other kernels"};

typedef struct {
    char name[88];
    const char *kind; // gemm (cuBLAS, or a planned flash kernel), kernel, memset, copy
    int group, prof;
    double calls, flops, bytes, peak, ms; // per step; peak: the FLOP/s its FLOPs run at
} Row;

#define MAX_ROWS 96
typedef struct {
    Setup s;
    Plan p;
    double N, e; // tokens; bytes of a linear product's operand (bf16 copies, or fp32)
    int n;
    Row rows[MAX_ROWS];
} Step;

static void add(Step *st, int group, int prof, const char *kind, const char *name, double calls,
                double flops, double bytes, double peak) {
    if (st->n == MAX_ROWS) {
        fprintf(stderr, "roofline: more than MAX_ROWS (%d) rows: raise it\n", MAX_ROWS);
        exit(1);
    }
    Row *r = &st->rows[st->n++];
    double ms = 1e3 * fmax(flops / peak, bytes / st->s.bandwidth);
    *r = (Row){"", kind, group, prof, calls, flops, bytes, peak, ms};
    snprintf(r->name, sizeof r->name, "%s", name);
}

static void kernel(Step *st, int group, int prof, const char *name, double calls, double flops,
                   double bytes) {
    add(st, group, prof, "kernel", name, calls, flops, bytes, st->s.fp32_peak);
}

static void zero(Step *st, const char *name, double calls, double bytes) {
    add(st, ZEROING, PROF_OTHER, "memset", name, calls, 0, bytes, st->s.fp32_peak);
}

// matmul.cu's to_bf16: n fp32 read, n bf16 written
static void cast(Step *st, const char *name, double calls, double n) {
    add(st, ELEMENTWISE, PROF_GEMM, "kernel", name, calls, 0, 6 * n, st->s.fp32_peak);
}

// `calls` products out (M, N) = a (M, K) @ b (K, N): a and b of e bytes, out of eo bytes and read
// as well when the product adds into it
static void gemm(Step *st, int group, int prof, const char *name, double calls, double M, double N,
                 double K, double eo, int accumulate, double peak) {
    double bytes = M * K * st->e + K * N * st->e + M * N * eo * (accumulate ? 2 : 1);
    add(st, group, prof, "gemm", name, calls, calls * 2 * M * N * K, calls * bytes, peak);
}

// One linear's three products (matmul.cu): out (N, OC) = inp (N, C) @ W^T, dinp (N, C) += dout @ W,
// dW (OC, C) += dout^T @ inp. eo, ed: bytes of out and dinp as written; first: the first product
// into its dinp buffer, which --write-not-zero writes with beta = 0 instead of adding to zeros.
static void linear(Step *st, int group, const char *name, double calls, double C, double OC,
                   double eo, double ed, int first) {
    double peak = st->s.bf16 ? st->s.peak : st->s.fp32_peak, N = st->N;
    char row[88];
    snprintf(row, sizeof row, "%s forward (matmul_forward)", name);
    gemm(st, group, PROF_GEMM, row, calls, N, OC, C, eo, 0, peak);
    snprintf(row, sizeof row, "%s dinp (matmul_backward)", name);
    gemm(st, group, PROF_GEMM, row, calls, N, C, OC, ed, !(st->p.write && first), peak);
    snprintf(row, sizeof row, "%s dweight (matmul_backward)", name);
    gemm(st, group, PROF_GEMM, row, calls, OC, C, N, 4, !st->p.write, peak);
}

// parameters as utils.c's flops_per_token counts them; matmul: those a GEMM reads (the head once)
static double num_params(const Setup *s, int matmul) {
    double C = s->hidden, HD = C, KVD = C / s->heads * s->kv_heads, I = s->intermediate;
    double layer = 2 * C * HD + 2 * C * KVD + 3 * C * I + (matmul ? 0 : 2 * C);
    double embeddings = (double)s->vocab * C * (matmul || s->tied ? 1 : 2);
    return s->layers * layer + embeddings + (matmul ? 0 : C);
}

static double flops_per_token(const Setup *s) {
    return 6 * num_params(s, 0) + 12.0 * s->layers * s->hidden * s->seq;
}

// attention at cp = 1: context_parallel.c's ring of one around attention.cu's block, or the
// planned flash kernels
static void attention_rows(Step *st) {
    const Setup *s = &st->s;
    Plan p = st->p;
    double L = s->layers, B = s->mbs, T = s->seq, H = s->heads, D = (double)s->hidden / H;
    double N = st->N, HD = H * D, KVD = s->kv_heads * D, f = 4;
    double rows = B * H * T, S = rows * T; // query rows (lse's size), score elements of a layer
    if (p.flash) {
        double eq = p.a16 ? 2 : 4, peak = s->bf16 ? s->peak : s->fp32_peak;
        // tiles of 128 queries x 128 keys: those wholly in the future are skipped, the diagonal's
        // computed whole
        double tiles = ceil(T / 128), causal = (tiles + 1) / (2 * tiles);
        double qkvo = (2 * N * HD + 2 * N * KVD) * eq; // q, k, v and out (or dout) once each
        add(st, ATTENTION, PROF_ATTENTION, "gemm", "flash forward: out and lse (planned)", L,
            L * 4 * S * D * causal, L * (qkvo + rows * f), peak);
        kernel(st, ATTENTION, PROF_ATTENTION, "attention_delta_kernel: rowsum(dout * out)", L,
               L * 2 * N * HD, L * (2 * N * HD * eq + rows * f));
        // dq, dk, dv in fp32, added to zeros as the ring needs, or written (--write-not-zero)
        add(st, ATTENTION, PROF_ATTENTION, "gemm",
            "flash backward: dq dk dv with the scores recomputed (planned)", L,
            L * 10 * S * D * causal,
            L * (qkvo + 2 * rows * f + (N * HD + 2 * N * KVD) * f * (p.write ? 1 : 2)), peak);
        return;
    }
    double peak = s->bf16 ? s->tf32_peak : s->fp32_peak;
    // a batched product reads each head's (T, D) rows of q, k, v, out or dout once per query head.
    // dq, dk, dv add into zeros; --write-not-zero writes them, but a kv head's dk and dv still
    // add up the group of query heads that share it after the first
    double head = rows * D * f, acc_q = p.write ? 1 : 2;
    double acc_kv = p.write ? 2 - (double)s->kv_heads / s->heads : 2;
    kernel(st, ATTENTION, PROF_OTHER, "fill: out and lse (ring_attention_forward)", 2 * L, 0,
           L * (N * HD + rows) * f);
    add(st, ATTENTION, PROF_ATTENTION, "gemm", "x_times_yt: s = q k^T / sqrt(D)", L, L * 2 * S * D,
        L * (2 * head + S * f), peak);
    kernel(st, ATTENTION, PROF_ATTENTION, "softmax_rows_kernel: causal mask and softmax", L,
           L * 5 * S, L * 2 * S * f);
    add(st, ATTENTION, PROF_ATTENTION, "gemm", "s_times_y: block_out = p v", L, L * 2 * S * D,
        L * (S * f + 2 * head), peak);
    kernel(st, ATTENTION, PROF_ATTENTION, "merge_out_kernel", L, L * 10 * N * HD,
           L * (3 * N * HD + 2 * rows) * f);
    kernel(st, ATTENTION, PROF_ATTENTION, "merge_lse_kernel", L, L * 8 * rows, L * 3 * rows * f);
    kernel(st, ATTENTION, PROF_ATTENTION, "attention_delta_kernel: rowsum(dout * out)", L,
           L * 2 * N * HD, L * (2 * N * HD + rows) * f);
    add(st, ATTENTION, PROF_OTHER, "copy", "device_copy: k and v into the ring's block", L, 0,
        L * 4 * N * KVD * f, s->fp32_peak);
    if (!p.write) zero(st, "device_zero: dk and dv of the ring's block", L, L * 2 * N * KVD * f);
    add(st, ATTENTION, PROF_ATTENTION, "gemm", "x_times_yt: s = q k^T / sqrt(D) again", L,
        L * 2 * S * D, L * (2 * head + S * f), peak);
    kernel(st, ATTENTION, PROF_ATTENTION, "probs_kernel: p = exp(s - lse) causal", L, L * 3 * S,
           L * 2 * S * f);
    add(st, ATTENTION, PROF_ATTENTION, "gemm", "st_times_x: dv += p^T dout", L, L * 2 * S * D,
        L * (S * f + head + head * acc_kv), peak);
    add(st, ATTENTION, PROF_ATTENTION, "gemm", "x_times_yt: dp = dout v^T", L, L * 2 * S * D,
        L * (2 * head + S * f), peak);
    kernel(st, ATTENTION, PROF_ATTENTION, "softmax_backward_kernel: ds = p (dp - delta)", L,
           L * 3 * S, L * 3 * S * f);
    add(st, ATTENTION, PROF_ATTENTION, "gemm", "s_times_y: dq += ds k", L, L * 2 * S * D,
        L * (S * f + head + head * acc_q), peak);
    add(st, ATTENTION, PROF_ATTENTION, "gemm", "st_times_x: dk += ds^T q", L, L * 2 * S * D,
        L * (S * f + head + head * acc_kv), peak);
    // without the zeroing, the add into dk and dv becomes a copy
    kernel(st, ATTENTION, PROF_OTHER, "add_inplace_kernel: dk and dv out of the ring's block", L,
           L * 2 * N * KVD, L * 2 * N * KVD * f * (p.write ? 2 : 3));
}

// the decoder layers (model.c) and the final norm, their products and their elementwise kernels
static void layer_rows(Step *st) {
    const Setup *s = &st->s;
    Plan p = st->p;
    double L = s->layers, T = s->seq, N = st->N, C = s->hidden, D = C / s->heads;
    double HD = C, KVD = s->kv_heads * D, I = s->intermediate, f = 4;
    double el = p.a16 ? 2 : 4;            // ln1, ln2, lnf and act as their kernels write them
    double eq = p.flash && p.a16 ? 2 : 4; // q, k, v, att and d(att): what attention reads
    double norms = 2 * L + 1;             // ln1 and ln2 of every layer, and lnf
    linear(st, LINEAR, "q_proj", L, C, HD, eq, 4, 1);
    linear(st, LINEAR, "k_proj and v_proj", 2 * L, C, KVD, eq, 4, 0);
    linear(st, LINEAR, "o_proj", L, HD, C, 4, eq, 1);
    linear(st, LINEAR, "gate_proj", L, C, I, 4, 4, 1);
    linear(st, LINEAR, "up_proj", L, C, I, 4, 4, 0);
    linear(st, LINEAR, "down_proj", L, I, C, 4, 4, 1);
    kernel(st, ELEMENTWISE, PROF_OTHER, "rmsnorm_forward_kernel: ln1 ln2 lnf", norms,
           norms * 4 * N * C, norms * (N * C * (f + el) + N * f));
    kernel(st, ELEMENTWISE, PROF_OTHER, "rmsnorm_backward_dinp_kernel", norms, norms * 8 * N * C,
           norms * (4 * N * C + N) * f);
    kernel(st, ELEMENTWISE, PROF_OTHER, "rmsnorm_backward_dweight_kernel", norms, norms * 3 * N * C,
           norms * (2 * N * C + N + 2 * C) * f);
    // a launch also reads the (T, D/2) cos and sin tables
    kernel(st, ELEMENTWISE, PROF_OTHER, "rotate_kernel: q and k (rope_forward)", 2 * L,
           L * 3 * N * (HD + KVD), L * (2 * N * (HD + KVD) * eq + 2 * T * D * f));
    kernel(st, ELEMENTWISE, PROF_OTHER, "rotate_kernel: dq and dk (rope_backward)", 2 * L,
           L * 3 * N * (HD + KVD), L * (2 * N * (HD + KVD) + 2 * T * D) * f);
    kernel(st, ELEMENTWISE, PROF_OTHER, "add_inplace_kernel: the residual adds", 2 * L,
           2 * L * N * C, 2 * L * 3 * N * C * f);
    kernel(st, ELEMENTWISE, PROF_OTHER, "swiglu_forward_kernel", L, L * 5 * N * I,
           L * N * I * (2 * f + el));
    // reads dout, gate and up, and the zeroed dgate and dup unless it writes them
    kernel(st, ELEMENTWISE, PROF_OTHER, "swiglu_backward_kernel", L, L * 10 * N * I,
           L * N * I * f * (p.write ? 5 : 7));
}

// matmul.cu casts each product's fp32 operands to bf16 copies in "bfloat16": the weights once a
// step, the whole parameter buffer into the copy the products read (matmul_weights_changed); the
// input in matmul_forward and the dweight call; dout in each call of matmul_backward
// (tensor_parallel.c's column-parallel backward makes two, the row-parallel one)
static void cast_rows(Step *st) {
    const Setup *s = &st->s;
    Plan p = st->p;
    double L = s->layers, N = st->N, C = s->hidden, KVD = C / s->heads * s->kv_heads;
    double I = s->intermediate, V = s->vocab, douts = p.a16 ? 1 : 2;
    if (!s->bf16) return;
    if (!p.a16) { // --bf16-activations: AdamW writes a bf16 copy; the norms and SwiGLU write bf16
        cast(st, "to_bf16_kernel: the weights' copy (matmul_weights_changed)", 1, num_params(s, 0));
        cast(st, "to_bf16_kernel: ln1 ln2 lnf (forward and dweight)", 10 * L + 2,
             (10 * L + 2) * N * C);
        cast(st, "to_bf16_kernel: act (down_proj forward and dweight)", 2 * L, 2 * L * N * I);
    }
    if (!(p.a16 && p.flash)) // att stays fp32 unless the flash kernel writes it
        cast(st, "to_bf16_kernel: att (o_proj forward and dweight)", 2 * L, 2 * L * N * C);
    cast(st, "to_bf16_kernel: dout of q_proj", douts * L, douts * L * N * C);
    cast(st, "to_bf16_kernel: dout of k_proj and v_proj", douts * 2 * L, douts * 2 * L * N * KVD);
    cast(st, "to_bf16_kernel: dout of gate_proj and up_proj", douts * 2 * L, douts * 2 * L * N * I);
    cast(st, "to_bf16_kernel: dout of o_proj and down_proj (dresid)", 2 * L, 2 * L * N * C);
    if (!p.fused_loss) cast(st, "to_bf16_kernel: dlogits", douts, douts * N * V);
}

// the embedding, the head and the loss (model.c, tensor_parallel.c's vocab-parallel loss), the
// step's zeroing, the gradient norm and AdamW (train.c, optimizer.c)
static void step_rows(Step *st) {
    const Setup *s = &st->s;
    Plan p = st->p;
    double L = s->layers, N = st->N, C = s->hidden, KVD = C / s->heads * s->kv_heads;
    double I = s->intermediate, V = s->vocab, P = num_params(s, 0), f = 4;
    linear(st, HEAD, "lm_head", 1, C, V, 4, 4, 1);
    kernel(st, HEAD, PROF_OTHER, "embedding_forward_kernel", 1, 0, 2 * N * C * f + N * 4);
    if (p.fused_loss) { // two passes over the fp32 logits; dlogits bf16 (fp32 with --dtype fp32)
        kernel(st, HEAD, PROF_OTHER, "loss pass 1: max and sum of exp online (planned)", 1,
               4 * N * V, N * V * f);
        kernel(st, HEAD, PROF_OTHER, "loss pass 2: dlogits written once (planned)", 1, 5 * N * V,
               N * V * (f + st->e));
    } else {
        kernel(st, HEAD, PROF_OTHER, "cross_entropy_max_kernel", 1, N * V, N * V * f);
        kernel(st, HEAD, PROF_OTHER, "cross_entropy_sumexp_kernel", 1, 3 * N * V, N * V * f);
        kernel(st, HEAD, PROF_OTHER, "cross_entropy_backward_kernel", 1, 5 * N * V, 3 * N * V * f);
    }
    kernel(st, HEAD, PROF_OTHER, "cross_entropy_loss_kernel and sum_reduce's two", 3, 4 * N,
           5 * N * f);
    // one thread per column walks the tokens: a token's row of the gradient read and written
    kernel(st, HEAD, PROF_OTHER, "embedding_backward_kernel", 1, N * C, 3 * N * C * f + N * 4);

    // --write-not-zero: the dweight products write the gradients (one micro-batch); the norms'
    // and an untied embedding's, which kernels add into, stay zeroed
    double zeroed = p.write ? (2 * L + 1) * C + (s->tied ? 0 : V * C) : P;
    zero(st, "device_zero: model.grads (train.c)", p.write ? 2 * L + 2 - s->tied : 1, zeroed * f);
    if (!p.write) {
        zero(st, "device_zero: d(act) d(gate) d(up) d(ln2) (mlp_backward)", 3 * L,
             L * (3 * N * I + N * C) * f);
        zero(st, "device_zero: d(att) d(q) d(k) d(v) d(ln1) (attention_backward)", 4 * L,
             L * (3 * N * C + 2 * N * KVD) * f);
        zero(st, "device_zero: dlnf (model_backward)", 1, N * C * f);
    }
    zero(st, "device_zero: dresid (model_backward)", 1, N * C * f);
    if (!p.fused_loss) zero(st, "device_zero: dlogits (model_forward)", 1, N * V * f);
    zero(st, "device_zero: the loss's and the norm's sums", 3, (2 * N + 2) * f);
    double tensors = 9 * L + 2 + (s->tied ? 0 : 1);
    kernel(st, ZEROING, PROF_OTHER, "sum_squares per tensor (clip_grad_norm)", 2 * tensors, 2 * P,
           P * f);
    // reads params, grads, m, v; writes params, m, v (and the bf16 copy the products read)
    kernel(st, ZEROING, PROF_OTHER, "adamw_kernel", 1, 12 * P,
           7 * P * f + (p.a16 ? 2 * num_params(s, 1) : 0));
}

static void build(Step *st, Setup s, Plan p) {
    memset(st, 0, sizeof *st);
    st->s = s;
    st->p = p;
    st->N = (double)s.mbs * s.seq;
    st->e = s.bf16 ? 2 : 4;
    attention_rows(st);
    layer_rows(st);
    cast_rows(st);
    step_rows(st);
}

static double step_ms(const Step *st) {
    double ms = 0;
    for (int i = 0; i < st->n; i++) ms += st->rows[i].ms;
    return ms;
}

static void print_line(const char *name, const char *calls, double flops, double bytes, double ms,
                       double total) {
    printf("  %-64s %6s %9.1f %8.2f %8.2f %5.1f%%\n", name, calls, flops / 1e9, bytes / 1e9, ms,
           100 * ms / total);
}

static void print_table(const Step *st, const char *config) {
    double total = step_ms(st), prof[PROFS] = {0};
    printf("\n%s: one training step, roofline estimate (not measured)\n", config);
    printf("  %-64s %6s %9s %8s %8s %6s\n", "kernel or product", "calls", "GFLOP", "GB", "ms",
           "share");
    for (int g = 0; g < GROUPS; g++) {
        double flops = 0, bytes = 0, ms = 0;
        printf(" %s\n", group_names[g]);
        for (int i = 0; i < st->n; i++) {
            const Row *r = &st->rows[i];
            if (r->group != g) continue;
            char calls[16];
            snprintf(calls, sizeof calls, "%.0f", r->calls);
            print_line(r->name, calls, r->flops, r->bytes, r->ms, total);
            flops += r->flops;
            bytes += r->bytes;
            ms += r->ms;
            prof[r->prof] += r->ms;
        }
        print_line("subtotal", "", flops, bytes, ms, total);
    }
    printf("  by the profiler's categories: %s %.1f ms, %s %.1f ms, %s %.1f ms, communication 0\n",
           prof_names[0], prof[0], prof_names[1], prof[1], prof_names[2], prof[2]);
}

static void summary(const Step *st, const char *config) {
    double ms = step_ms(st), tokens_per_s = st->N / (ms / 1e3);
    printf("roofline: %s: step %.2f ms, %.0f tokens/s, MFU %.1f%%\n", config, ms, tokens_per_s,
           100 * tokens_per_s * flops_per_token(&st->s) / st->s.peak);
}

static void print_csv(const Step *st, const char *config) {
    for (int i = 0; i < st->n; i++) {
        const Row *r = &st->rows[i];
        printf("%s,%s,%s,%s,%s,%.0f,%.17g,%.17g,%.17g,%.17g\n", config, group_names[r->group],
               prof_names[r->prof], r->kind, r->name, r->calls, r->flops, r->bytes, r->peak, r->ms);
    }
}

static void flag_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("roofline: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs("\n", stderr);
    va_end(ap);
    exit(1);
}

static const char *usage =
    "usage: roofline [--layers 24] [--hidden 2048] [--intermediate 8192] [--heads 32]\n"
    "  [--kv-heads 32] [--vocab 49152] [--seq 2048] [--mbs 4] [--tied 1] [--dtype bf16|fp32]\n"
    "  [--peak 989.5e12] [--tf32-peak PEAK/2] [--fp32-peak 67e12] [--bandwidth 4.8e12]\n"
    "  [--flash] [--bf16-activations] [--fused-loss] [--write-not-zero] [--all] [--csv]\n"
    "defaults: SmolLM-1.7B's shape on one H200 (FLOP/s of bf16, TF32, fp32 products; HBM B/s)\n";

// returns 1 for --csv
static int parse_flags(int argc, char **argv, Setup *s, Plan *p) {
    int csv = 0;
    struct {
        const char *flag;
        int *on;
    } switches[] = {{"--flash", &p->flash},
                    {"--bf16-activations", &p->a16},
                    {"--fused-loss", &p->fused_loss},
                    {"--write-not-zero", &p->write},
                    {"--csv", &csv}};
    // a whole number (int *) from min to max, or a rate per second (double *), e.g. `example`
    struct {
        const char *flag;
        int *whole;
        double *rate, min, max;
        const char *example;
    } values[] = {{"--layers", &s->layers, 0, 1, 1 << 20, "24"},
                  {"--hidden", &s->hidden, 0, 1, 1 << 20, "2048"},
                  {"--intermediate", &s->intermediate, 0, 1, 1 << 24, "8192"},
                  {"--heads", &s->heads, 0, 1, 1 << 20, "32"},
                  {"--kv-heads", &s->kv_heads, 0, 1, 1 << 20, "32"},
                  {"--vocab", &s->vocab, 0, 1, 1 << 30, "49152"},
                  {"--seq", &s->seq, 0, 1, 1 << 30, "2048"},
                  {"--mbs", &s->mbs, 0, 1, 1 << 20, "4"},
                  {"--tied", &s->tied, 0, 0, 1, "1"},
                  {"--peak", 0, &s->peak, 1, INFINITY, "989.5e12"},
                  {"--tf32-peak", 0, &s->tf32_peak, 1, INFINITY, "494.7e12"},
                  {"--fp32-peak", 0, &s->fp32_peak, 1, INFINITY, "67e12"},
                  {"--bandwidth", 0, &s->bandwidth, 1, INFINITY, "4.8e12"}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int known = 0;
        if (!strcmp(a, "--help")) {
            fputs(usage, stdout);
            exit(0);
        }
        if (!strcmp(a, "--all")) {
            *p = (Plan){1, 1, 1, 1};
            continue;
        }
        for (size_t k = 0; k < sizeof switches / sizeof switches[0]; k++)
            if (!strcmp(a, switches[k].flag)) *switches[k].on = known = 1;
        if (known) continue;
        if (!strcmp(a, "--dtype")) {
            if (!v || (strcmp(v, "bf16") && strcmp(v, "fp32")))
                flag_error("--dtype needs bf16 or fp32 (the products' type, model.dtype), got '%s'",
                           v ? v : "nothing");
            s->bf16 = !strcmp(v, "bf16");
            i++;
            continue;
        }
        for (size_t k = 0; k < sizeof values / sizeof values[0] && !known; k++) {
            if (strcmp(a, values[k].flag)) continue;
            char *end = NULL;
            double x = v ? strtod(v, &end) : NAN;
            char need[64] = "a positive rate per second";
            if (values[k].whole)
                snprintf(need, sizeof need, "a whole number from %.0f to %.0f", values[k].min,
                         values[k].max);
            if (!v || *end || end == v || !(x >= values[k].min && x <= values[k].max) ||
                (values[k].whole && x != floor(x)))
                flag_error("%s needs %s (e.g. %s %s), got '%s'", a, need, a, values[k].example,
                           v ? v : "nothing");
            if (values[k].whole)
                *values[k].whole = (int)x;
            else
                *values[k].rate = x;
            i++;
            known = 1;
        }
        if (!known) flag_error("unknown flag '%s' (roofline --help lists the flags)", a);
    }
    if (s->hidden % s->heads || (s->hidden / s->heads) % 2)
        flag_error("--heads %d must divide --hidden %d into an even head size (RoPE's pairs)",
                   s->heads, s->hidden);
    if (s->heads % s->kv_heads)
        flag_error("--kv-heads %d must divide --heads %d", s->kv_heads, s->heads);
    if (p->a16 && !s->bf16) flag_error("--bf16-activations (or --all) needs --dtype bf16");
    return csv;
}

// the planned changes that p switches on, as flags
static void plan_name(char *out, size_t size, Plan p) {
    snprintf(out, size, "%s%s%s%s", p.flash ? " --flash" : "", p.a16 ? " --bf16-activations" : "",
             p.fused_loss ? " --fused-loss" : "", p.write ? " --write-not-zero" : "");
    if (p.flash && p.a16 && p.fused_loss && p.write) snprintf(out, size, " --all");
    if (out[0]) memmove(out, out + 1, strlen(out)); // the leading space
}

static int finish(void) {
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "roofline: writing to stdout failed\n");
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    Setup s = {24, 2048, 8192, 32, 32, 49152, 2048, 4, 1, 1, 989.5e12, 0, 67e12, 4.8e12};
    Plan plan = {0}, today = {0};
    int csv = parse_flags(argc, argv, &s, &plan);
    if (s.tf32_peak == 0) s.tf32_peak = s.peak / 2; // the tensor cores' dense TF32 rate
    static Step before, after, alone;               // static: 20 kB each
    char name[96];
    build(&before, s, today);
    build(&after, s, plan);
    plan_name(name, sizeof name, plan);
    int changed = name[0] != '\0';
    if (csv) {
        printf("config,group,profiler,kind,name,calls,flops,bytes,peak,ms\n");
        print_csv(&before, "today");
        if (changed) print_csv(&after, name);
        return finish();
    }
    printf("roofline: %d layers, hidden %d, intermediate %d, %d heads, %d kv heads, vocab %d (%s), "
           "seq %d, micro-batch %d, %s products\n",
           s.layers, s.hidden, s.intermediate, s.heads, s.kv_heads, s.vocab,
           s.tied ? "tied" : "untied", s.seq, s.mbs, s.bf16 ? "bf16" : "fp32");
    printf("roofline: device %.1f TFLOP/s bf16, %.1f TF32, %.1f fp32, %.2f TB/s; every number "
           "below is an estimate\n",
           s.peak / 1e12, s.tf32_peak / 1e12, s.fp32_peak / 1e12, s.bandwidth / 1e12);
    print_table(&before, "today");
    if (changed) print_table(&after, name);
    summary(&before, "today");
    // with several changes, each alone too, so that its own effect shows
    Plan single[4] = {{1, 0, 0, 0}, {0, 1, 0, 0}, {0, 0, 1, 0}, {0, 0, 0, 1}};
    int wanted[4] = {plan.flash, plan.a16, plan.fused_loss, plan.write};
    for (int k = 0; k < 4 && wanted[0] + wanted[1] + wanted[2] + wanted[3] > 1; k++) {
        if (!wanted[k]) continue;
        char one[96];
        build(&alone, s, single[k]);
        plan_name(one, sizeof one, single[k]);
        summary(&alone, one);
    }
    if (changed) summary(&after, name);
    return finish();
}
