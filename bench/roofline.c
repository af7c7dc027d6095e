// The roofline of one training step on one GPU (dp = tp = pp = cp = 1, one micro-batch, a dense
// model): every kernel launch, memset, device-to-device copy and cuBLAS product the CUDA backend
// issues for it, as the code stands (model.c's forward and backward, tensor_parallel.c's linears,
// context_parallel.c's ring of one, attention.cu and flash_attention.cu, matmul.cu's casts,
// vocab_parallel_cross_entropy, train.c's and optimizer.c's step), each with its FLOPs, its bytes
// to and from HBM, and its time on the roofline, max(FLOPs / peak, bytes / bandwidth); then the
// step's time, tokens/s and MFU by picotron's formula (utils.c's flops_per_token). The changes
// issue 19 still plans switch on one by one (--bf16-activations, --bf16-dlogits,
// --write-not-zero, --all), so each one's effect shows in its own summary line.
// An estimate, never a measurement: a kernel reaches its roofline at best. bench/gpu_bench.sh
// prints it beside the CUDA profiler's measured time, which shows the gap. The calls are not
// estimated: tests/t_83_roofline.sh counts the launches of one step of the GPU build on the CUDA
// emulator (PICOTRON_EMU_CENSUS) and holds every row's `call` column to them.
// Assumptions:
//  - every operand crosses HBM once: read once, written once, read and written when accumulated
//    (beta = 1, +=); nothing stays in cache between kernels, and a row kernel's passes over one row
//    (a flash tile's rows, a row of scores) stay on chip
//  - fp32 and int 4 bytes, bf16 2, a sort key 8
//  - linear products at --peak (bf16 tensor cores); flash attention's products at --flash-peak
//    (the bf16 peak unless given: WMMA's mma.sync reaches less of it than wgmma would); the GEMM
//    path's batched products, fp32 in and out, at --tf32-peak in bf16 (head dims over 128) and
//    --fp32-peak in fp32; every elementwise FLOP at --fp32-peak; exp, sqrt and division count one
//  - launch gaps, host work, PCIe copies (tokens in, loss out) and the collectives of groups of
//    one (they return at once) cost nothing
// The planned changes, as modelled here:
//  --bf16-activations  AdamW writes the bf16 copy of the weights, so they are not cast; flash
//                      attention reads q, k, v and dout in bf16 and writes att in bf16 for
//                      o_proj (the norms and SwiGLU write their products' copies already)
//  --bf16-dlogits      cross_entropy_backward writes dlogits in bf16 only (today fp32 and the
//                      products' bf16 copy): 4 bytes of the largest activation less to write
//  --write-not-zero    the attention backward writes dq, dk and dv instead of adding them to
//                      zeroed buffers (the linears write their input gradients already); the
//                      dweight products write the gradients (beta = 0, one micro-batch), but
//                      the norms' and an untied embedding's, which stay zeroed
// usage: build/bench/roofline [shape and device flags] [--bf16-activations] [--bf16-dlogits]
//        [--write-not-zero] [--all] [--csv]   (--help lists the flags)
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int layers, hidden, intermediate, heads, kv_heads, vocab, seq, mbs, tied, bf16;
    int scores_cap; // floats of scores per head set on attention.cu's GEMM path (SCORES_CAP)
    double peak, flash_peak, tf32_peak, fp32_peak, bandwidth; // FLOP/s; HBM bytes/s
} Setup;

typedef struct {
    int a16, dlogits16, write; // --bf16-activations, --bf16-dlogits, --write-not-zero
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
    char call[48]; // the kernel, cuBLAS call, cudaMemset or cudaMemcpyDeviceToDevice
    int group, prof;
    double calls, flops, bytes, peak, ms; // per step; peak: the FLOP/s its FLOPs run at
} Row;

#define MAX_ROWS 96
typedef struct {
    Setup s;
    Plan p;
    double N, e; // tokens; bytes of a linear product's operand (bf16 copies, or fp32)
    int flash;   // attention on flash_attention.cu's kernels (bf16, head dim up to 128)
    int n;
    Row rows[MAX_ROWS];
} Step;

static void add(Step *st, int group, int prof, const char *call, const char *name, double calls,
                double flops, double bytes, double peak) {
    if (st->n == MAX_ROWS) {
        fprintf(stderr, "roofline: more than MAX_ROWS (%d) rows: raise it\n", MAX_ROWS);
        exit(1);
    }
    Row *r = &st->rows[st->n++];
    double ms = 1e3 * fmax(flops / peak, bytes / st->s.bandwidth);
    *r = (Row){"", "", group, prof, calls, flops, bytes, peak, ms};
    snprintf(r->name, sizeof r->name, "%s", name);
    snprintf(r->call, sizeof r->call, "%.*s", (int)strcspn(call, ": "), call);
}

// a kernel of the backend, its name first in `name` (up to the first ':' or space)
static void kernel(Step *st, int group, int prof, const char *name, double calls, double flops,
                   double bytes) {
    add(st, group, prof, name, name, calls, flops, bytes, st->s.fp32_peak);
}

static void zero(Step *st, const char *name, double calls, double bytes) {
    add(st, ZEROING, PROF_OTHER, "cudaMemset", name, calls, 0, bytes, st->s.fp32_peak);
}

// device_copy of `bytes`: read and written
static void copy(Step *st, int group, const char *name, double calls, double bytes) {
    add(st, group, PROF_OTHER, "cudaMemcpyDeviceToDevice", name, calls, 0, 2 * bytes,
        st->s.fp32_peak);
}

// matmul.cu's to_bf16: n fp32 read, n bf16 written
static void cast(Step *st, const char *name, double calls, double n) {
    if (st->s.bf16)
        add(st, ELEMENTWISE, PROF_GEMM, "to_bf16_kernel", name, calls, 0, 6 * n, st->s.fp32_peak);
}

// `calls` products out (M, N) = a (M, K) @ b (K, N): a and b of e bytes, out of eo bytes and read
// as well when the product adds into it
static void gemm(Step *st, int group, int prof, const char *name, double calls, double M, double N,
                 double K, double eo, int accumulate, double peak) {
    double bytes = M * K * st->e + K * N * st->e + M * N * eo * (accumulate ? 2 : 1);
    add(st, group, prof, "cublasGemmEx", name, calls, calls * 2 * M * N * K, calls * bytes, peak);
}

// One linear's three products (matmul.cu): out (N, OC) = inp (N, C) @ W^T, dinp (N, C) = or +=
// dout @ W, dW (OC, C) += dout^T @ inp. first: the first product into its dinp buffer, which
// writes it (beta = 0, matmul_backward_write); the others add to it.
static void linear(Step *st, int group, const char *name, double calls, double C, double OC,
                   int first) {
    double peak = st->s.bf16 ? st->s.peak : st->s.fp32_peak, N = st->N;
    char row[88];
    snprintf(row, sizeof row, "%s forward (matmul_forward)", name);
    gemm(st, group, PROF_GEMM, row, calls, N, OC, C, 4, 0, peak);
    snprintf(row, sizeof row, "%s dinp (matmul_backward%s)", name, first ? "_write" : "");
    gemm(st, group, PROF_GEMM, row, calls, N, C, OC, 4, !first, peak);
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

// flash_attention.cu: 64-row tiles of queries and keys; the pairs wholly in the future skipped,
// the diagonal's computed whole; head dims padded to 16, 32, 64 or 128
static void flash_rows(Step *st) {
    const Setup *s = &st->s;
    Plan p = st->p;
    double L = s->layers, B = s->mbs, T = s->seq, H = s->heads, D = (double)s->hidden / H;
    double N = st->N, HD = H * D, KVD = s->kv_heads * D, f = 4, eq = p.a16 ? 2 : 4;
    double DP = D <= 16 ? 16 : D <= 32 ? 32 : D <= 64 ? 64 : 128, tiles = ceil(T / 64);
    double product = B * H * (tiles * (tiles + 1) / 2) * 2 * 64 * 64 * DP; // FLOPs, all tiles
    double rows = B * H * T, io = rows * f;                                // lse and delta
    add(st, ATTENTION, PROF_ATTENTION, "flash_forward_kernel",
        "flash_forward_kernel: s = q k^T, o += p v; out, lse merged", L, L * 2 * product,
        L * ((N * HD + 2 * N * KVD) * eq + 2 * N * HD * f + 2 * io), s->flash_peak);
    // dk and dv per key tile and kv head: s^T, dp^T, dv += p^T dout, dk += ds^T q
    add(st, ATTENTION, PROF_ATTENTION, "flash_dk_dv_kernel",
        "flash_dk_dv_kernel: s^T, dp^T, then a key tile's dv and dk", L, L * 4 * product,
        L * ((2 * N * HD + 2 * N * KVD) * eq + 2 * io + 2 * N * KVD * f * (p.write ? 1 : 2)),
        s->flash_peak);
    add(st, ATTENTION, PROF_ATTENTION, "flash_dq_kernel",
        "flash_dq_kernel: s, dp, then dq of a query tile", L, L * 3 * product,
        L * ((2 * N * HD + 2 * N * KVD) * eq + 2 * io + N * HD * f * (p.write ? 1 : 2)),
        s->flash_peak);
}

// `calls` strided-batched products, L layers' worth of `flops` and `bytes` (attention.cu)
static void batched(Step *st, const char *name, double calls, double L, double flops, double bytes,
                    double peak) {
    add(st, ATTENTION, PROF_ATTENTION, "cublasGemmStridedBatchedEx", name, calls, L * flops,
        L * bytes, peak);
}

// attention.cu's GEMM path, per head set: batched products over the (T, T) scores in fp32
static void gemm_attention_rows(Step *st) {
    const Setup *s = &st->s;
    double L = s->layers, B = s->mbs, T = s->seq, H = s->heads, KV = s->kv_heads, D = s->hidden / H;
    double rows = B * H * T, S = rows * T, f = 4, group = H / KV; // S: a layer's score elements
    double per_set = fmin(KV, fmax(1, floor((double)s->scores_cap / (T * T))));
    double sets = L * B * group * ceil(KV / per_set), peak = s->bf16 ? s->tf32_peak : s->fp32_peak;
    // a batched product reads each head's (T, D) rows of q, k, v, out or dout once per query head
    double head = rows * D * f;
    batched(st, "x_times_yt: s = q k^T / sqrt(D)", sets, L, 2 * S * D, 2 * head + S * f, peak);
    kernel(st, ATTENTION, PROF_ATTENTION, "softmax_rows_kernel: causal mask and softmax", sets,
           L * 5 * S, L * 2 * S * f);
    batched(st, "s_times_y: block_out = p v", sets, L, 2 * S * D, S * f + 2 * head, peak);
    kernel(st, ATTENTION, PROF_ATTENTION, "merge_out_kernel", L, L * 10 * rows * D,
           L * (3 * rows * D + 2 * rows) * f);
    kernel(st, ATTENTION, PROF_ATTENTION, "merge_lse_kernel", L, L * 8 * rows, L * 3 * rows * f);
    batched(st, "x_times_yt: s = q k^T / sqrt(D) again", sets, L, 2 * S * D, 2 * head + S * f,
            peak);
    kernel(st, ATTENTION, PROF_ATTENTION, "probs_kernel: p = exp(s - lse) causal", sets, L * 3 * S,
           L * 2 * S * f);
    batched(st, "st_times_x: dv += p^T dout", sets, L, 2 * S * D, S * f + 3 * head, peak);
    batched(st, "x_times_yt: dp = dout v^T", sets, L, 2 * S * D, 2 * head + S * f, peak);
    kernel(st, ATTENTION, PROF_ATTENTION, "softmax_backward_kernel: ds = p (dp - delta)", sets,
           L * 3 * S, L * 3 * S * f);
    batched(st, "s_times_y: dq += ds k", sets, L, 2 * S * D, S * f + 3 * head, peak);
    batched(st, "st_times_x: dk += ds^T q", sets, L, 2 * S * D, S * f + 3 * head, peak);
}

// attention at cp = 1: context_parallel.c's ring of one around attention_forward_block and
// attention_backward_block (no block staged: its gradients go straight to dk and dv), then the
// blocks' kernels
static void attention_rows(Step *st) {
    const Setup *s = &st->s;
    double L = s->layers, H = s->heads, D = (double)s->hidden / H, N = st->N, f = 4;
    double HD = H * D, rows = (double)s->mbs * H * s->seq;
    kernel(st, ATTENTION, PROF_OTHER, "fill_kernel: out and lse (ring_attention_forward)", 2 * L, 0,
           L * (N * HD + rows) * f);
    kernel(st, ATTENTION, PROF_ATTENTION, "attention_delta_kernel: rowsum(dout * out)", L,
           L * 2 * N * HD, L * (2 * N * HD + rows) * f);
    if (st->flash)
        flash_rows(st);
    else
        gemm_attention_rows(st);
}

// the decoder layers (model.c) and the final norm: their products, elementwise kernels, zeroing
static void layer_rows(Step *st) {
    const Setup *s = &st->s;
    Plan p = st->p;
    double L = s->layers, T = s->seq, N = st->N, C = s->hidden, D = C / s->heads;
    double HD = C, KVD = s->kv_heads * D, I = s->intermediate, f = 4;
    double el = s->bf16 ? 6 : 4; // ln1, ln2, lnf, act: fp32, and in bf16 the products' copy
    double norms = 2 * L + 1;    // ln1 and ln2 of every layer, and lnf
    linear(st, LINEAR, "q_proj", L, C, HD, 1);
    linear(st, LINEAR, "k_proj and v_proj", 2 * L, C, KVD, 0);
    linear(st, LINEAR, "o_proj", L, HD, C, 1);
    linear(st, LINEAR, "gate_proj", L, C, I, 1);
    linear(st, LINEAR, "up_proj", L, C, I, 0);
    linear(st, LINEAR, "down_proj", L, I, C, 1);
    kernel(st, ELEMENTWISE, PROF_OTHER, "rmsnorm_forward_kernel: ln1 ln2 lnf", norms,
           norms * 4 * N * C, norms * (N * C * (f + el) + N * f));
    // dinp += per row, and the block's dweight partial row; dout, inp, rstd read once
    kernel(st, ELEMENTWISE, PROF_OTHER, "rmsnorm_backward_kernel: dinp and partial dweight", norms,
           norms * 11 * N * C, norms * (4 * N * C * f + N * f + N / 8 * C * f));
    kernel(st, ELEMENTWISE, PROF_OTHER, "rmsnorm_dweight_kernel: the partial rows added", norms,
           norms * N / 8 * C, norms * (N / 8 * C + 2 * C) * f);
    // a launch also reads the (T, D/2) cos and sin tables
    kernel(st, ELEMENTWISE, PROF_OTHER, "rotate_kernel: q and k, then dq and dk", 4 * L,
           2 * L * 3 * N * (HD + KVD), 2 * L * (2 * N * (HD + KVD) + 2 * T * D) * f);
    kernel(st, ELEMENTWISE, PROF_OTHER, "add_inplace_kernel: the residual adds", 2 * L,
           2 * L * N * C, 2 * L * 3 * N * C * f);
    kernel(st, ELEMENTWISE, PROF_OTHER, "swiglu_forward_kernel", L, L * 5 * N * I,
           L * N * I * (2 * f + el));
    // reads dout, gate and up; writes dgate and dup, and in bf16 their copies for the products
    kernel(st, ELEMENTWISE, PROF_OTHER, "swiglu_backward_kernel", L, L * 10 * N * I,
           L * N * I * (3 * f + 2 * el));
    // the linears write their input gradients (matmul_backward_write): only what the final
    // norm's backward and the attention backward add into is zeroed (--write-not-zero: the
    // attention backward writes its gradients)
    zero(st, "device_zero: dresid (model_backward)", 1, N * C * f);
    if (!p.write)
        zero(st, "device_zero: d(q) and d(k v) (attention_backward)", 2 * L,
             L * (N * HD + 2 * N * KVD) * f);
}

// matmul.cu casts the products' fp32 operands to bf16 in "bfloat16", each tensor once while it
// stays unchanged: a weight at its first product of the step (the cast kept for the step, by
// backend_step_begin's promise), any other input at its first product after its last write (the
// cast kept until the next write). So the weights: one cast each, the tensors the products read
// (not the norms', nor an untied embedding table). att: once, for o_proj's forward; its dweight
// reads that copy. The dout of q, k and v: once each, though tensor_parallel.c's backward reads
// each twice (the dinp products, then the dweight ones). dresid: twice a layer, down_proj's and
// o_proj's dout, since the norm's backward writes it between them. ln1, ln2, lnf, act, d(gate),
// d(up) and dlogits are never cast: their kernels write the copy (bf16_copy_to_write, counted in
// those kernels' bytes above).
static void cast_rows(Step *st) {
    const Setup *s = &st->s;
    Plan p = st->p;
    double L = s->layers, N = st->N, C = s->hidden, KVD = C / s->heads * s->kv_heads;
    if (!p.a16) // --bf16-activations: AdamW writes the copy
        cast(st, "to_bf16_kernel: each weight, at its first product of the step", 7 * L + 1,
             num_params(s, 1));
    if (!(p.a16 && st->flash)) // att stays fp32 unless the flash kernel writes it in bf16
        cast(st, "to_bf16_kernel: att (o_proj forward; its dweight reads the copy)", L, L * N * C);
    cast(st, "to_bf16_kernel: dout of q_proj, k_proj and v_proj (dinp, dweight)", 3 * L,
         L * N * (C + 2 * KVD));
    cast(st, "to_bf16_kernel: dout of o_proj and down_proj (dresid)", 2 * L, 2 * L * N * C);
}

// the embedding, the head and the loss (model.c, tensor_parallel.c's vocab-parallel loss), the
// step's zeroing, the gradient norm and AdamW (train.c, optimizer.c)
static void step_rows(Step *st) {
    const Setup *s = &st->s;
    Plan p = st->p;
    double L = s->layers, N = st->N, C = s->hidden, V = s->vocab, P = num_params(s, 0), f = 4;
    linear(st, HEAD, "lm_head", 1, C, V, 1);
    kernel(st, HEAD, PROF_OTHER, "embedding_forward_kernel", 1, 0, 2 * N * C * f + N * 4);
    kernel(st, HEAD, PROF_OTHER, "cross_entropy_stats_kernel: max and sum of exp in one read", 1,
           4 * N * V, N * V * f);
    copy(st, HEAD, "device_copy: the shard's maxima (vocab_parallel_cross_entropy)", 1, N * f);
    kernel(st, HEAD, PROF_OTHER, "cross_entropy_rescale_kernel", 1, 2 * N, 3 * N * f);
    kernel(st, HEAD, PROF_OTHER, "cross_entropy_loss_kernel", 1, 3 * N, 4 * N * f);
    // reads the logits; writes dlogits in fp32 and, in bf16, the products' copy (--bf16-dlogits:
    // the copy alone)
    double written = p.dlogits16 ? 2 : s->bf16 ? f + 2 : f;
    kernel(st, HEAD, PROF_OTHER, "cross_entropy_backward_kernel: dlogits written whole", 1,
           5 * N * V, N * V * (f + written));
    zero(st, "device_zero: the loss's sum and the norm's two", 2, 3 * f);
    kernel(st, HEAD, PROF_OTHER, "sum_partial_kernel: the loss's sum", 1, N, N * f);
    kernel(st, HEAD, PROF_OTHER, "sum_final_kernel: the loss's sum", 1, 512, 512 * 8);
    // the bitonic sort of N (row, position) keys padded to M = 2^m: stages up to a 4096-key tile
    // in shared memory, then each larger stage's steps over the whole array and its tail in tiles
    double M = 1, tile, step_launches = 0, tile_launches = 1;
    while (M < N) M *= 2;
    tile = fmin(M, 4096);
    for (double k = 2 * tile; k <= M; k *= 2, tile_launches++)
        for (double j = k / 2; j >= tile; j /= 2) step_launches++;
    kernel(st, HEAD, PROF_OTHER, "bitonic_tile_kernel: sort the tokens' keys", tile_launches, 0,
           tile_launches * 2 * M * 8 + N * 4);
    if (step_launches > 0)
        kernel(st, HEAD, PROF_OTHER, "bitonic_step_kernel", step_launches, 0,
               step_launches * 2 * M * 8);
    // each token's row of dout added onto its row of the gradient, which is read and written
    kernel(st, HEAD, PROF_OTHER, "embedding_backward_sum_kernel", 1, N * C, 3 * N * C * f + N * 8);

    // --write-not-zero: the dweight products write the gradients (one micro-batch); the norms'
    // and an untied embedding's, which kernels add into, stay zeroed
    double zeroed = p.write ? (2 * L + 1) * C + (s->tied ? 0 : V * C) : P;
    zero(st, "device_zero: model.grads (train.c)", p.write ? 2 * L + 2 - s->tied : 1, zeroed * f);
    double tensors = 9 * L + 2 + (s->tied ? 0 : 1); // the norm's sum of squares, one per tensor
    kernel(st, ZEROING, PROF_OTHER, "sum_partial_kernel: squares per tensor (clip_grad_norm)",
           tensors, 2 * P, P * f);
    kernel(st, ZEROING, PROF_OTHER, "sum_final_kernel: squares per tensor", tensors, tensors * 512,
           tensors * 512 * 8);
    // reads params, grads, m, v; writes params, m, v (and the bf16 copy the products read)
    kernel(st, ZEROING, PROF_OTHER, "adamw_kernel", 1, 12 * P, 7 * P * f + (p.a16 ? 2 * P : 0));
    // the updated weights' finiteness, before anything can save them (first_nonfinite_param):
    // one sum of their squares
    zero(st, "device_zero: the weights' check's sum", 1, f);
    kernel(st, ZEROING, PROF_OTHER,
           "sum_partial_kernel: the weights' squares (first_nonfinite_param)", 1, 2 * P, P * f);
    kernel(st, ZEROING, PROF_OTHER, "sum_final_kernel: the weights' squares", 1, 512, 512 * 8);
}

static void build(Step *st, Setup s, Plan p) {
    memset(st, 0, sizeof *st);
    st->s = s;
    st->p = p;
    st->N = (double)s.mbs * s.seq;
    st->e = s.bf16 ? 2 : 4;
    st->flash = s.bf16 && s.hidden / s.heads <= 128;
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
        printf("%s,%s,%s,%s,\"%s\",%.0f,%.17g,%.17g,%.17g,%.17g\n", config, group_names[r->group],
               prof_names[r->prof], r->call, r->name, r->calls, r->flops, r->bytes, r->peak, r->ms);
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
    "  [--peak 989.5e12] [--flash-peak PEAK] [--tf32-peak PEAK/2] [--fp32-peak 67e12]\n"
    "  [--bandwidth 4.8e12] [--scores-cap 67108864]\n"
    "  [--bf16-activations] [--bf16-dlogits] [--write-not-zero] [--all] [--csv]\n"
    "defaults: SmolLM-1.7B's shape on one H200 (FLOP/s of bf16, flash attention's, TF32 and fp32\n"
    "products; HBM B/s; attention.cu's SCORES_CAP)\n";

// returns 1 for --csv
static int parse_flags(int argc, char **argv, Setup *s, Plan *p) {
    int csv = 0;
    struct {
        const char *flag;
        int *on;
    } switches[] = {{"--bf16-activations", &p->a16},
                    {"--bf16-dlogits", &p->dlogits16},
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
                  {"--flash-peak", 0, &s->flash_peak, 1, INFINITY, "400e12"},
                  {"--tf32-peak", 0, &s->tf32_peak, 1, INFINITY, "494.7e12"},
                  {"--fp32-peak", 0, &s->fp32_peak, 1, INFINITY, "67e12"},
                  {"--bandwidth", 0, &s->bandwidth, 1, INFINITY, "4.8e12"},
                  {"--scores-cap", &s->scores_cap, 0, 1, 1 << 30, "67108864"}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int known = 0;
        if (!strcmp(a, "--help")) {
            fputs(usage, stdout);
            exit(0);
        }
        if (!strcmp(a, "--all")) {
            *p = (Plan){1, 1, 1};
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
    if (p->dlogits16 && !s->bf16) flag_error("--bf16-dlogits needs --dtype bf16");
    return csv;
}

// the planned changes that p switches on, as flags
static void plan_name(char *out, size_t size, Plan p) {
    snprintf(out, size, "%s%s%s", p.a16 ? " --bf16-activations" : "",
             p.dlogits16 ? " --bf16-dlogits" : "", p.write ? " --write-not-zero" : "");
    if (p.a16 && p.dlogits16 && p.write) snprintf(out, size, " --all");
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
    // scores_cap: attention.cu's SCORES_CAP, 64 Mi floats of scores per head set
    Setup s = {.layers = 24,
               .hidden = 2048,
               .intermediate = 8192,
               .heads = 32,
               .kv_heads = 32,
               .vocab = 49152,
               .seq = 2048,
               .mbs = 4,
               .tied = 1,
               .bf16 = 1,
               .scores_cap = 1 << 26,
               .peak = 989.5e12,
               .fp32_peak = 67e12,
               .bandwidth = 4.8e12};
    Plan plan = {0}, today = {0};
    int csv = parse_flags(argc, argv, &s, &plan);
    if (s.tf32_peak == 0) s.tf32_peak = s.peak / 2; // the tensor cores' dense TF32 rate
    if (s.flash_peak == 0) s.flash_peak = s.peak;
    static Step before, after, alone; // static: 20 kB each
    char name[96];
    build(&before, s, today);
    build(&after, s, plan);
    plan_name(name, sizeof name, plan);
    int changed = name[0] != '\0';
    if (csv) {
        printf("config,group,profiler,call,name,calls,flops,bytes,peak,ms\n");
        print_csv(&before, "today");
        if (changed) print_csv(&after, name);
        return finish();
    }
    printf("roofline: %d layers, hidden %d, intermediate %d, %d heads, %d kv heads, vocab %d (%s), "
           "seq %d, micro-batch %d, %s products\n",
           s.layers, s.hidden, s.intermediate, s.heads, s.kv_heads, s.vocab,
           s.tied ? "tied" : "untied", s.seq, s.mbs, s.bf16 ? "bf16" : "fp32");
    printf("roofline: device %.1f TFLOP/s bf16 (flash attention %.1f), %.1f TF32, %.1f fp32, %.2f "
           "TB/s; every number below is an estimate\n",
           s.peak / 1e12, s.flash_peak / 1e12, s.tf32_peak / 1e12, s.fp32_peak / 1e12,
           s.bandwidth / 1e12);
    print_table(&before, "today");
    if (changed) print_table(&after, name);
    summary(&before, "today");
    // with several changes, each alone too, so that its own effect shows
    Plan single[3] = {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}};
    int wanted[3] = {plan.a16, plan.dlogits16, plan.write};
    for (int k = 0; k < 3 && wanted[0] + wanted[1] + wanted[2] > 1; k++) {
        if (!wanted[k]) continue;
        char one[96];
        build(&alone, s, single[k]);
        plan_name(one, sizeof one, single[k]);
        summary(&alone, one);
    }
    if (changed) summary(&after, name);
    return finish();
}
