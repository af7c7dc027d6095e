// Every CUDA kernel computes what its CPU twin computes: the same random inputs through
// backend/cuda/<k>.cu and backend/cpu/<k>.c (linked under cpu_ names, see cpu_twins.h), outputs
// compared as max |gpu - cpu| / max |cpu| over the tensor. Tolerances:
//   TOL_ELEM 1e-5: elementwise kernels and short reductions (same formula, same order of
//                  operations; expf/logf may differ by an ulp, and FMA contraction by one rounding)
//   TOL_SUM  5e-5: GEMM and attention, whose sums over C or Tk keys run in a different order
//                  (cuBLAS's blocking, the online softmax's rescaling): the float rounding error
//                  of a length-K sum grows like sqrt(K) * 6e-8, K up to 512 here
//   bf16 products: against the CPU twin fed the same bf16-rounded operands, TOL_BF16_SUM 2e-4
//                  (a bf16 product is exact in fp32, so only the sums differ, and tensor cores
//                  may align the addends of their fp32 sums with less care than IEEE adds: 4x
//                  TOL_SUM, still 10x below the 2e-3 an operand left unrounded shows); against the
//                  exact fp32 product, TOL_BF16 1e-2: each operand carries a relative rounding
//                  error up to 2^-9 = 2e-3, and a length-K sum of such errors with random signs
//                  stays near that relative to the largest output (2.1e-3 to 2.3e-3 for these
//                  shapes with torch's bf16 rounding in fp64), while a transposed or misplaced
//                  operand is off by O(1)
//   flash attention (the bf16 path): against the CPU twin on the same unrounded fp32 inputs,
//                  ||gpu - cpu|| / ||cpu|| over a tensor (over the increments of a += output)
//                  within TOL_FLASH 1e-2. q, k, v, dout and the kernels' own p and ds are each
//                  rounded to bf16 (relative error up to 2^-9 = 2e-3) before a product, and a few
//                  such roundings meet in each output with random signs: 1.9e-3 to 3.6e-3 here
//                  (the lse 1e-5 to 4e-4). Rounded inputs would not make an exact reference, as
//                  p and ds are rounded inside. The smallest wrong answer tried, a mask off by one
//                  position, is 8e-2; a skipped tile or an unmasked padding key 0.25 to 1
//   init_tensor:   bit-identical for uniform and constant; normal within 1 ulp on at most 1e-6 of
//                  the elements (CUDA's double log/cos vs glibc's, see backend/cuda/init.cu)
// Runs on one GPU; prints one line per comparison and "N passed, N failed" last.
#include "backend/backend.h"
#include "tests/gpu/bf16_round.h"
#include "tests/gpu/cpu_twins.h"
#include "utils.h"
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL_ELEM             1e-5
#define TOL_SUM              5e-5
#define TOL_BF16_SUM         2e-4
#define TOL_BF16             1e-2
#define NORMAL_MISMATCH_RATE 1e-6
#define TOL_FLASH            1e-2

static int passed = 0, failed = 0;
static uint64_t rng_state = 0x12345678abcdefull;

static float uniform(float lo, float hi) { // xorshift64*
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    uint64_t r = rng_state * 2685821657736338717ull;
    return lo + (hi - lo) * (float)((r >> 40) * 0x1.0p-24);
}

static float *random_host(size_t n, float lo, float hi) {
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = uniform(lo, hi);
    return x;
}

static void *to_device(const void *host, size_t bytes) {
    void *d = device_malloc(bytes);
    host_to_device(d, host, bytes);
    return d;
}

static void check(const char *what, const float *dev, const float *cpu, size_t n, double tol) {
    float *gpu = xmalloc(n * sizeof(float));
    device_to_host(gpu, dev, n * sizeof(float));
    double max_diff = 0.0, max_ref = 0.0;
    int finite = 1;
    for (size_t i = 0; i < n; i++) {
        if (isfinite(cpu[i]) != isfinite(gpu[i])) finite = 0;
        if (!isfinite(cpu[i])) {
            if (cpu[i] != gpu[i]) finite = 0; // -inf lse of a row that saw no key
            continue;
        }
        double d = fabs((double)gpu[i] - cpu[i]);
        if (d > max_diff) max_diff = d;
        if (fabs(cpu[i]) > max_ref) max_ref = fabs(cpu[i]);
    }
    double rel = max_ref > 0 ? max_diff / max_ref : max_diff;
    int ok = finite && rel <= tol;
    printf("  %-4s %-40s max rel diff %.2e (tol %.0e)%s\n", ok ? "ok" : "FAIL", what, rel, tol,
           finite ? "" : ", non-finite values differ");
    ok ? passed++ : failed++;
    free(gpu);
}

static void test_elementwise(void) {
    size_t n = 1000003;
    float *x = random_host(n, -2, 2), *y = random_host(n, -2, 2);
    float *dx = to_device(x, n * 4), *dy = to_device(y, n * 4);
    cpu_add_inplace(y, x, n);
    add_inplace(dy, dx, n);
    check("add_inplace", dy, y, n, 0.0);
    cpu_scale_inplace(y, 0.37f, n);
    scale_inplace(dy, 0.37f, n);
    check("scale_inplace", dy, y, n, 0.0);
    int rows = 1009, cols = 991; // rows * cols <= n; a row's scale must reach exactly its row
    float *scale = random_host(rows, -2, 2), *dscale = to_device(scale, rows * 4);
    cpu_scale_rows(y, scale, rows, cols);
    scale_rows(dy, dscale, rows, cols);
    check("scale_rows", dy, y, n, 0.0);
    free(scale);
    device_free(dscale);
    cpu_fill(x, -1.25f, 1000);
    fill(dx, -1.25f, 1000);
    check("fill", dx, x, n, 0.0);
    cpu_fill_columns(x, -3.5f, 37, 301, 250); // the padding of a vocab shard (vocab_padding.c)
    fill_columns(dx, -3.5f, 37, 301, 250);
    check("fill_columns", dx, x, n, 0.0);
    float s[2] = {1.5f, -0.5f};
    float *ds = to_device(s, sizeof s);
    cpu_sum_squares(&s[0], y, n);
    cpu_sum_reduce(&s[1], y, n);
    sum_squares(ds, dy, n);
    sum_reduce(ds + 1, dy, n);
    check("sum_squares (double accumulator)", ds, &s[0], 1, TOL_ELEM);
    check("sum_reduce (double accumulator)", ds + 1, &s[1], 1, TOL_ELEM);
    free(x), free(y), device_free(dx), device_free(dy), device_free(ds);
}

static void test_matmul(void) {
    int N = 257, C = 384, OC = 320;
    float *inp = random_host((size_t)N * C, -1, 1), *w = random_host((size_t)OC * C, -1, 1);
    float *out = random_host((size_t)N * OC, -1, 1), *dout = random_host((size_t)N * OC, -1, 1);
    float *dinp = random_host((size_t)N * C, -1, 1), *dw = random_host((size_t)OC * C, -1, 1);
    float *d_inp = to_device(inp, (size_t)N * C * 4), *d_w = to_device(w, (size_t)OC * C * 4);
    float *d_out = to_device(out, (size_t)N * OC * 4);
    float *d_dout = to_device(dout, (size_t)N * OC * 4);
    float *d_dinp = to_device(dinp, (size_t)N * C * 4), *d_dw = to_device(dw, (size_t)OC * C * 4);
    cpu_matmul_forward(out, inp, w, N, C, OC);
    matmul_forward(d_out, d_inp, d_w, N, C, OC);
    check("matmul_forward out", d_out, out, (size_t)N * OC, TOL_SUM);
    cpu_matmul_backward(dinp, dw, dout, inp, w, N, C, OC);
    matmul_backward(d_dinp, d_dw, d_dout, d_inp, d_w, N, C, OC);
    check("matmul_backward dinp (+=)", d_dinp, dinp, (size_t)N * C, TOL_SUM);
    check("matmul_backward dweight (+=)", d_dw, dw, (size_t)OC * C, TOL_SUM);
    cpu_matmul_backward(NULL, dw, dout, inp, w, N, C, OC);
    matmul_backward(NULL, d_dw, d_dout, d_inp, d_w, N, C, OC);
    check("matmul_backward dinp = NULL", d_dw, dw, (size_t)OC * C, TOL_SUM);
    // the write variant: a NaN in dinp must not show (cuBLAS's beta = 0 reads nothing there)
    fill(d_dinp, NAN, (size_t)N * C);
    cpu_matmul_backward_write(dinp, dw, dout, inp, w, N, C, OC);
    matmul_backward_write(d_dinp, d_dw, d_dout, d_inp, d_w, N, C, OC);
    check("matmul_backward_write dinp (=)", d_dinp, dinp, (size_t)N * C, TOL_SUM);
    check("matmul_backward_write dweight (+=)", d_dw, dw, (size_t)OC * C, TOL_SUM);
    free(inp), free(w), free(out), free(dout), free(dinp), free(dw);
    device_free(d_inp), device_free(d_w), device_free(d_out), device_free(d_dout);
    device_free(d_dinp), device_free(d_dw);
}

// backend_set_dtype("bfloat16"): the products read bf16 copies of fp32 operands, write fp32
static void test_matmul_bf16(void) {
    int N = 257, C = 384, OC = 320;
    size_t nx = (size_t)N * C, nw = (size_t)OC * C, ny = (size_t)N * OC;
    float *inp = random_host(nx, -1, 1), *w = random_host(nw, -1, 1);
    float *dout = random_host(ny, -1, 1), *dinp = random_host(nx, -1, 1);
    float *dw = random_host(nw, -1, 1);
    float *inp_r = bf16_rounded(inp, nx), *w_r = bf16_rounded(w, nw);
    float *dout_r = bf16_rounded(dout, ny);
    float *out = xmalloc(ny * 4), *out_r = xmalloc(ny * 4);
    float *dinp_r = xmalloc(nx * 4), *dw_r = xmalloc(nw * 4);
    memcpy(dinp_r, dinp, nx * 4);
    memcpy(dw_r, dw, nw * 4);
    float *d_inp = to_device(inp, nx * 4), *d_w = to_device(w, nw * 4);
    float *d_dout = to_device(dout, ny * 4), *d_out = device_malloc(ny * 4);
    float *d_dinp = to_device(dinp, nx * 4), *d_dw = to_device(dw, nw * 4);
    backend_set_dtype("bfloat16");
    matmul_forward(d_out, d_inp, d_w, N, C, OC);
    matmul_backward(d_dinp, d_dw, d_dout, d_inp, d_w, N, C, OC);
    backend_set_dtype("float32");
    cpu_matmul_forward(out_r, inp_r, w_r, N, C, OC);
    cpu_matmul_backward(dinp_r, dw_r, dout_r, inp_r, w_r, N, C, OC);
    check("bf16 matmul_forward vs rounded operands", d_out, out_r, ny, TOL_BF16_SUM);
    check("bf16 matmul_backward dinp vs rounded", d_dinp, dinp_r, nx, TOL_BF16_SUM);
    check("bf16 matmul_backward dweight vs rounded", d_dw, dw_r, nw, TOL_BF16_SUM);
    cpu_matmul_forward(out, inp, w, N, C, OC);
    cpu_matmul_backward(dinp, dw, dout, inp, w, N, C, OC);
    check("bf16 matmul_forward vs fp32", d_out, out, ny, TOL_BF16);
    check("bf16 matmul_backward dinp vs fp32", d_dinp, dinp, nx, TOL_BF16);
    check("bf16 matmul_backward dweight vs fp32", d_dw, dw, nw, TOL_BF16);
    free(inp), free(w), free(dout), free(dinp), free(dw), free(inp_r), free(w_r), free(dout_r);
    free(out), free(out_r), free(dinp_r), free(dw_r);
    device_free(d_inp), device_free(d_w), device_free(d_dout), device_free(d_out);
    device_free(d_dinp), device_free(d_dw);
}

// bf16 out (N, OC) = x (N, C) @ w (OC, C)^T against the CPU twin on x and w as the device holds
// them now, rounded to bf16: a product that read a copy from before a write is off by O(1)
static void check_product_now(const char *what, float *d_out, const float *d_x, const float *d_w,
                              int N, int C, int OC) {
    size_t nx = (size_t)N * C, nw = (size_t)OC * C, ny = (size_t)N * OC;
    float *x = xmalloc(nx * 4), *w = xmalloc(nw * 4), *out = xmalloc(ny * 4);
    device_to_host(x, d_x, nx * 4);
    device_to_host(w, d_w, nw * 4);
    float *x_r = bf16_rounded(x, nx), *w_r = bf16_rounded(w, nw);
    matmul_forward(d_out, d_x, d_w, N, C, OC);
    cpu_matmul_forward(out, x_r, w_r, N, C, OC);
    check(what, d_out, out, ny, TOL_BF16_SUM);
    free(x), free(w), free(out), free(x_r), free(w_r);
}

// The bf16 copies matmul.cu keeps follow every write: after each way the backend writes a
// product's input (its kernel writing the copy, then an add, a scale, a fill of one row, a host
// copy, a device copy, RoPE in place, a product's output, a memset), the next product reads the
// new values, whole or a block of rows; and a weight written between steps is read anew after
// backend_step_begin.
static void test_bf16_copies(void) {
    int N = 48, C = 64, OC = 40, D = 16;
    size_t nx = (size_t)N * C, nw = (size_t)OC * C, nw2 = (size_t)C * C, nt = (size_t)N * D / 2;
    float *in = random_host(nx, -1, 1), *norm_w = random_host(C, 0.5f, 1.5f);
    float *y = random_host(nx, -1, 1), *w = random_host(nw, -1, 1), *w2 = random_host(nw2, -1, 1);
    float *cs = random_host(nt, -1, 1), *sn = random_host(nt, -1, 1);
    float *d_in = to_device(in, nx * 4), *d_norm_w = to_device(norm_w, C * 4);
    float *d_y = to_device(y, nx * 4), *d_w = to_device(w, nw * 4), *d_w2 = to_device(w2, nw2 * 4);
    float *d_cs = to_device(cs, nt * 4), *d_sn = to_device(sn, nt * 4);
    float *d_x = device_malloc(nx * 4), *d_rstd = device_malloc(N * 4);
    float *d_out = device_malloc((size_t)N * OC * 4);
    backend_set_dtype("bfloat16");
    backend_step_begin();
    rmsnorm_forward(d_x, d_rstd, d_in, d_norm_w, N, C, 1e-5f);
    check_product_now("bf16 copy: written by rmsnorm_forward", d_out, d_x, d_w, N, C, OC);
    add_inplace(d_x, d_y, nx);
    check_product_now("bf16 copy: after add_inplace", d_out, d_x, d_w, N, C, OC);
    scale_inplace(d_x, -0.5f, nx);
    check_product_now("bf16 copy: after scale_inplace", d_out, d_x, d_w, N, C, OC);
    fill(d_x + 5 * C, 0.75f, C);
    check_product_now("bf16 copy: after fill of one row", d_out, d_x, d_w, N, C, OC);
    host_to_device(d_x, y, nx * 4);
    check_product_now("bf16 copy: after host_to_device, cast", d_out, d_x, d_w, N, C, OC);
    check_product_now("bf16 copy: the same cast, kept", d_out, d_x, d_w, N, C, OC);
    device_copy(d_x + C, d_in, C * 4);
    check_product_now("bf16 copy: after device_copy of one row", d_out, d_x, d_w, N, C, OC);
    rope_forward(d_x, d_cs, d_sn, 1, N, C / D, D);
    check_product_now("bf16 copy: after rope_forward", d_out, d_x, d_w, N, C, OC);
    matmul_forward(d_x, d_y, d_w2, N, C, C);
    check_product_now("bf16 copy: after a product wrote it", d_out, d_x, d_w, N, C, OC);
    device_zero(d_x + 7 * C, C * 4);
    check_product_now("bf16 copy: after device_zero of one row", d_out, d_x, d_w, N, C, OC);
    check_product_now("bf16 copy: rows 8 to 24 of a copy", d_out, d_x + 8 * C, d_w, 16, C, OC);
    host_to_device(d_w, y, nw * 4);
    backend_step_begin();
    check_product_now("bf16 weight: written, then backend_step_begin", d_out, d_x, d_w, N, C, OC);
    backend_set_dtype("float32");
    free(in), free(norm_w), free(y), free(w), free(w2), free(cs), free(sn);
    device_free(d_in), device_free(d_norm_w), device_free(d_y), device_free(d_w);
    device_free(d_w2), device_free(d_cs), device_free(d_sn), device_free(d_x), device_free(d_rstd);
    device_free(d_out);
}

static void test_embedding(void) {
    int N = 300, C = 96, V = 50, vocab_start = 20;
    int *tokens = xmalloc(N * sizeof(int));
    for (int n = 0; n < N; n++) tokens[n] = (int)uniform(0, 100); // repeats, some not here
    float *wte = random_host((size_t)V * C, -1, 1), *out = random_host((size_t)N * C, -1, 1);
    float *dout = random_host((size_t)N * C, -1, 1), *dwte = random_host((size_t)V * C, -1, 1);
    int *d_tokens = to_device(tokens, N * sizeof(int));
    float *d_wte = to_device(wte, (size_t)V * C * 4), *d_out = to_device(out, (size_t)N * C * 4);
    float *d_dout = to_device(dout, (size_t)N * C * 4);
    float *d_dwte = to_device(dwte, (size_t)V * C * 4);
    cpu_embedding_forward(out, tokens, wte, N, C, vocab_start, V);
    embedding_forward(d_out, d_tokens, d_wte, N, C, vocab_start, V);
    check("embedding_forward", d_out, out, (size_t)N * C, 0.0);
    cpu_embedding_backward(dwte, dout, tokens, N, C, vocab_start, V);
    embedding_backward(d_dwte, d_dout, d_tokens, N, C, vocab_start, V);
    check("embedding_backward (+=, repeated tokens)", d_dwte, dwte, (size_t)V * C, 0.0);
    free(tokens), free(wte), free(out), free(dout), free(dwte);
    device_free(d_tokens), device_free(d_wte), device_free(d_out), device_free(d_dout);
    device_free(d_dwte);
}

static void test_rmsnorm(void) {
    int N = 67, C = 333;
    float eps = 1e-5f;
    float *inp = random_host((size_t)N * C, -2, 2), *w = random_host(C, 0.5f, 1.5f);
    float *out = xmalloc((size_t)N * C * 4), *rstd = xmalloc(N * 4);
    float *dout = random_host((size_t)N * C, -1, 1), *dinp = random_host((size_t)N * C, -1, 1);
    float *dw = random_host(C, -1, 1);
    float *d_inp = to_device(inp, (size_t)N * C * 4), *d_w = to_device(w, C * 4);
    float *d_out = device_malloc((size_t)N * C * 4), *d_rstd = device_malloc(N * 4);
    float *d_dout = to_device(dout, (size_t)N * C * 4);
    float *d_dinp = to_device(dinp, (size_t)N * C * 4), *d_dw = to_device(dw, C * 4);
    cpu_rmsnorm_forward(out, rstd, inp, w, N, C, eps);
    rmsnorm_forward(d_out, d_rstd, d_inp, d_w, N, C, eps);
    check("rmsnorm_forward out", d_out, out, (size_t)N * C, TOL_ELEM);
    check("rmsnorm_forward rstd", d_rstd, rstd, N, TOL_ELEM);
    cpu_rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
    rmsnorm_backward(d_dinp, d_dw, d_dout, d_inp, d_w, d_rstd, N, C);
    check("rmsnorm_backward dinp (+=)", d_dinp, dinp, (size_t)N * C, TOL_ELEM);
    check("rmsnorm_backward dweight (+=)", d_dw, dw, C, TOL_ELEM);
    free(inp), free(w), free(out), free(rstd), free(dout), free(dinp), free(dw);
    device_free(d_inp), device_free(d_w), device_free(d_out), device_free(d_rstd);
    device_free(d_dout), device_free(d_dinp), device_free(d_dw);
}

static void test_rope(void) {
    int B = 2, T = 17, NH = 3, D = 64;
    size_t n = (size_t)B * T * NH * D, nt = (size_t)T * D / 2;
    float *x = random_host(n, -1, 1), *cs = xmalloc(nt * 4), *sn = xmalloc(nt * 4);
    for (size_t i = 0; i < nt; i++) {
        float angle = uniform(-3.14f, 3.14f);
        cs[i] = cosf(angle);
        sn[i] = sinf(angle);
    }
    float *d_x = to_device(x, n * 4), *d_cs = to_device(cs, nt * 4), *d_sn = to_device(sn, nt * 4);
    cpu_rope_forward(x, cs, sn, B, T, NH, D);
    rope_forward(d_x, d_cs, d_sn, B, T, NH, D);
    check("rope_forward", d_x, x, n, TOL_ELEM);
    cpu_rope_backward(x, cs, sn, B, T, NH, D);
    rope_backward(d_x, d_cs, d_sn, B, T, NH, D);
    check("rope_backward", d_x, x, n, TOL_ELEM);
    free(x), free(cs), free(sn), device_free(d_x), device_free(d_cs), device_free(d_sn);
}

// Ring attention's pieces on two key/value blocks: block 0 holds the earlier positions, block 1
// the queries' own (a causal diagonal), visited in the order `first`, then the other; then a
// block entirely in the queries' future, which must change nothing.
static void test_attention(int B, int T, int H, int KV, int D, int zigzag, int first) {
    size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * KV * D, nl = (size_t)B * H * T;
    int *q_pos = xmalloc(T * sizeof(int)), *k_pos[3];
    for (int b = 0; b < 3; b++) k_pos[b] = xmalloc(T * sizeof(int));
    for (int t = 0; t < T; t++) {
        // zig-zag: each rank's chunk holds positions from both ends of the sequence
        int p = zigzag ? (t % 2 ? 4 * T - 1 - t / 2 : T + t / 2) : T + t;
        q_pos[t] = p;
        k_pos[0][t] = t;          // all before every query
        k_pos[1][t] = p;          // the queries' own positions
        k_pos[2][t] = 10 * T + t; // all in the future
    }
    float *q = random_host(nq, -1, 1), *kv[3][2], *d_kv[3][2];
    for (int b = 0; b < 3; b++)
        for (int s = 0; s < 2; s++) {
            kv[b][s] = random_host(nk, -1, 1);
            d_kv[b][s] = to_device(kv[b][s], nk * 4);
        }
    float *out = xmalloc(nq * 4), *lse = xmalloc(nl * 4);
    for (size_t i = 0; i < nl; i++) lse[i] = -INFINITY;
    float *d_q = to_device(q, nq * 4), *d_out = device_malloc(nq * 4);
    float *d_lse = to_device(lse, nl * 4);
    int *d_q_pos = to_device(q_pos, T * sizeof(int)), *d_k_pos[3];
    for (int b = 0; b < 3; b++) d_k_pos[b] = to_device(k_pos[b], T * sizeof(int));
    int order[3] = {first, 1 - first, 2};
    for (int o = 0; o < 3; o++) {
        int b = order[o];
        cpu_attention_forward_block(out, lse, q, kv[b][0], kv[b][1], q_pos, k_pos[b], B, T, T, H,
                                    KV, D);
        attention_forward_block(d_out, d_lse, d_q, d_kv[b][0], d_kv[b][1], d_q_pos, d_k_pos[b], B,
                                T, T, H, KV, D);
    }
    char what[96];
    snprintf(what, sizeof what, "attention fwd B%d T%d H%d KV%d D%d%s out", B, T, H, KV, D,
             zigzag ? " zigzag" : "");
    check(what, d_out, out, nq, TOL_SUM);
    snprintf(what, sizeof what, "attention fwd B%d T%d H%d KV%d D%d%s lse", B, T, H, KV, D,
             zigzag ? " zigzag" : "");
    check(what, d_lse, lse, nl, TOL_SUM);
    // backward from the CPU's out and lse, so only the backward kernels are compared
    float *dout = random_host(nq, -1, 1), *delta = xmalloc(nl * 4);
    float *d_dout = to_device(dout, nq * 4), *d_delta = device_malloc(nl * 4);
    host_to_device(d_out, out, nq * 4);
    host_to_device(d_lse, lse, nl * 4);
    cpu_attention_backward_delta(delta, dout, out, B, T, H, D);
    attention_backward_delta(d_delta, d_dout, d_out, B, T, H, D);
    check("attention_backward_delta", d_delta, delta, nl, TOL_ELEM);
    host_to_device(d_delta, delta, nl * 4);
    float *dq = random_host(nq, -1, 1), *d_dq = to_device(dq, nq * 4);
    for (int b = 0; b < 3; b++) {
        float *dk = random_host(nk, -1, 1), *dv = random_host(nk, -1, 1);
        float *d_dk = to_device(dk, nk * 4), *d_dv = to_device(dv, nk * 4);
        cpu_attention_backward_block(dq, dk, dv, dout, q, kv[b][0], kv[b][1], lse, delta, q_pos,
                                     k_pos[b], B, T, T, H, KV, D);
        attention_backward_block(d_dq, d_dk, d_dv, d_dout, d_q, d_kv[b][0], d_kv[b][1], d_lse,
                                 d_delta, d_q_pos, d_k_pos[b], B, T, T, H, KV, D);
        snprintf(what, sizeof what, "attention bwd block %d dk (+=)", b);
        check(what, d_dk, dk, nk, TOL_SUM);
        snprintf(what, sizeof what, "attention bwd block %d dv (+=)", b);
        check(what, d_dv, dv, nk, TOL_SUM);
        free(dk), free(dv), device_free(d_dk), device_free(d_dv);
    }
    check("attention bwd dq over 3 blocks (+=)", d_dq, dq, nq, TOL_SUM);
    for (int b = 0; b < 3; b++) {
        free(k_pos[b]), device_free(d_k_pos[b]);
        for (int s = 0; s < 2; s++) free(kv[b][s]), device_free(d_kv[b][s]);
    }
    free(q_pos), free(q), free(out), free(lse), free(dout), free(delta), free(dq);
    device_free(d_q_pos), device_free(d_q), device_free(d_out), device_free(d_lse);
    device_free(d_dout), device_free(d_delta), device_free(d_dq);
}

// Flash attention (backend/cuda/flash_attention.cu, the "bfloat16" path) against the fp32 CPU
// twin on the same unrounded inputs, ||gpu - cpu|| / ||cpu|| over a tensor (for a += output,
// over the increments) within TOL_FLASH; and per element: finite where the CPU's is (a -inf lse
// stays -inf, no NaN), changed wherever the CPU's changed (nothing left unwritten), and the
// FLASH_GUARD NaN floats after the tensor untouched (no write past its end; a read past an
// input's end would bring NaN in).
#define FLASH_GUARD 64
static void check_flash(const char *what, const float *dev, const float *cpu, const float *init,
                        size_t n) {
    float *gpu = xmalloc((n + FLASH_GUARD) * sizeof(float));
    device_to_host(gpu, dev, (n + FLASH_GUARD) * sizeof(float));
    double diff2 = 0.0, ref2 = 0.0, max_diff = 0.0, max_ref = 0.0;
    size_t non_finite = 0, unwritten = 0, guard = 0;
    for (size_t i = 0; i < n; i++) {
        float base = init ? init[i] : 0.0f;
        if (!isfinite(cpu[i]) || !isfinite(gpu[i])) {
            non_finite += !(cpu[i] == gpu[i]); // equal infinities pass, a NaN never does
            continue;
        }
        unwritten += gpu[i] == base && cpu[i] != base;
        double d = (double)gpu[i] - cpu[i], r = (double)cpu[i] - base;
        diff2 += d * d, ref2 += r * r;
        max_diff = fmax(max_diff, fabs(d)), max_ref = fmax(max_ref, fabs(r));
    }
    for (size_t i = n; i < n + FLASH_GUARD; i++) guard += !isnan(gpu[i]);
    double rel = ref2 > 0.0 ? sqrt(diff2 / ref2) : sqrt(diff2);
    int ok = rel <= TOL_FLASH && non_finite == 0 && unwritten == 0 && guard == 0;
    printf("  %-4s %-40s rel L2 diff %.2e (tol %.0e), max %.2e", ok ? "ok" : "FAIL", what, rel,
           TOL_FLASH, max_ref > 0.0 ? max_diff / max_ref : max_diff);
    if (non_finite || unwritten || guard)
        printf(", %zu non-finite differ, %zu unwritten, %zu guard floats written", non_finite,
               unwritten, guard);
    printf("\n");
    ok ? passed++ : failed++;
    free(gpu);
}

// a device copy of n floats (or ints) followed by FLASH_GUARD NaN floats
static void *flash_device(const void *host, size_t n) {
    float *d = device_malloc((n + FLASH_GUARD) * sizeof(float)), nan[FLASH_GUARD];
    for (int i = 0; i < FLASH_GUARD; i++) nan[i] = NAN;
    host_to_device(d, host, n * sizeof(float));
    host_to_device(d + n, nan, sizeof nan);
    return d;
}

// One query block at positions q_pos (Tq) meets nb key/value blocks, block n holding Tk[n] keys
// at k_pos[n], merged in that order as ring attention does; then each block's backward, from the
// CPU's out, lse and delta so that only the flash kernels are compared.
static void test_flash(const char *label, int B, int Tq, int H, int KV, int D, const int *q_pos,
                       int nb, const int *Tk, int *const *k_pos) {
    size_t nq = (size_t)B * Tq * H * D, nl = (size_t)B * H * Tq;
    char what[160];
    float *q = random_host(nq, -1, 1), *out = xmalloc(nq * 4), *lse = xmalloc(nl * 4);
    for (size_t i = 0; i < nq; i++) out[i] = 0.0f;
    for (size_t i = 0; i < nl; i++) lse[i] = -INFINITY;
    float *d_q = flash_device(q, nq), *d_out = flash_device(out, nq);
    float *d_lse = flash_device(lse, nl);
    int *d_q_pos = flash_device(q_pos, Tq), *d_k_pos[8];
    float *kv[8][2], *d_kv[8][2];
    for (int n = 0; n < nb; n++) {
        size_t nk = (size_t)B * Tk[n] * KV * D;
        d_k_pos[n] = flash_device(k_pos[n], Tk[n]);
        for (int s = 0; s < 2; s++) {
            kv[n][s] = random_host(nk, -1, 1);
            d_kv[n][s] = flash_device(kv[n][s], nk);
        }
    }
    backend_set_dtype("bfloat16");
    for (int n = 0; n < nb; n++) {
        cpu_attention_forward_block(out, lse, q, kv[n][0], kv[n][1], q_pos, k_pos[n], B, Tq, Tk[n],
                                    H, KV, D);
        attention_forward_block(d_out, d_lse, d_q, d_kv[n][0], d_kv[n][1], d_q_pos, d_k_pos[n], B,
                                Tq, Tk[n], H, KV, D);
    }
    snprintf(what, sizeof what, "flash fwd %s out", label);
    check_flash(what, d_out, out, NULL, nq);
    snprintf(what, sizeof what, "flash fwd %s lse", label);
    check_flash(what, d_lse, lse, NULL, nl);

    // a row that saw no key has lse = -inf and no gradient, even from keys it could see: the
    // first row of every head is given that lse
    for (size_t bh = 0; bh < (size_t)B * H; bh++) lse[bh * Tq] = -INFINITY;
    float *dout = random_host(nq, -1, 1), *delta = xmalloc(nl * 4);
    cpu_attention_backward_delta(delta, dout, out, B, Tq, H, D);
    float *d_dout = flash_device(dout, nq), *d_delta = flash_device(delta, nl);
    host_to_device(d_out, out, nq * 4);
    host_to_device(d_lse, lse, nl * 4);
    float *dq = random_host(nq, -1, 1), *dq0 = xmalloc(nq * 4);
    memcpy(dq0, dq, nq * 4);
    float *d_dq = flash_device(dq, nq);
    for (int n = 0; n < nb; n++) {
        size_t nk = (size_t)B * Tk[n] * KV * D;
        float *dk = random_host(nk, -1, 1), *dv = random_host(nk, -1, 1);
        float *dk0 = xmalloc(nk * 4), *dv0 = xmalloc(nk * 4);
        memcpy(dk0, dk, nk * 4), memcpy(dv0, dv, nk * 4);
        float *d_dk = flash_device(dk, nk), *d_dv = flash_device(dv, nk);
        cpu_attention_backward_block(dq, dk, dv, dout, q, kv[n][0], kv[n][1], lse, delta, q_pos,
                                     k_pos[n], B, Tq, Tk[n], H, KV, D);
        attention_backward_block(d_dq, d_dk, d_dv, d_dout, d_q, d_kv[n][0], d_kv[n][1], d_lse,
                                 d_delta, d_q_pos, d_k_pos[n], B, Tq, Tk[n], H, KV, D);
        snprintf(what, sizeof what, "flash bwd %s block %d dk (+=)", label, n);
        check_flash(what, d_dk, dk, dk0, nk);
        snprintf(what, sizeof what, "flash bwd %s block %d dv (+=)", label, n);
        check_flash(what, d_dv, dv, dv0, nk);
        free(dk), free(dv), free(dk0), free(dv0), device_free(d_dk), device_free(d_dv);
    }
    backend_set_dtype("float32");
    snprintf(what, sizeof what, "flash bwd %s dq over %d blocks (+=)", label, nb);
    check_flash(what, d_dq, dq, dq0, nq);
    for (int n = 0; n < nb; n++) {
        device_free(d_k_pos[n]);
        for (int s = 0; s < 2; s++) free(kv[n][s]), device_free(d_kv[n][s]);
    }
    free(q), free(out), free(lse), free(dout), free(delta), free(dq), free(dq0);
    device_free(d_q), device_free(d_out), device_free(d_lse), device_free(d_q_pos);
    device_free(d_dout), device_free(d_delta), device_free(d_dq);
}

// The blocks ring attention hands a query block of Tq rows at positions from P = 2 * Tq on
// (zigzag: both ends of [P, P + 2 * Tq), as a zig-zag chunk holds them), in the order
//   earlier  Tq - 23 keys, all before every query: fully visible
//   own      keys around the queries' own positions: Tq + 30 keys from P - 30 on (zigzag: the
//            queries' own positions): tiles fully visible, partially masked and fully masked
//   future   50 keys after every query: fully masked, must change nothing
// reordered as `order` says (a permutation of "eof"). Order "o": the own block alone, its keys
// from P + 63 on: the 63 queries before see no key at all (lse -inf, no gradient), and the
// position ranges of the first query tile and the first key tile touch (64 rows: the kernels'
// tile), the one pair of them that sees each other.
static void test_flash_ring(int B, int Tq, int H, int KV, int D, int zigzag, const char *order) {
    int P = 2 * Tq, nb = (int)strlen(order), Tk[3], *k_pos[3];
    int *q_pos = xmalloc(Tq * sizeof(int));
    for (int t = 0; t < Tq; t++) q_pos[t] = zigzag && t % 2 ? P + 2 * Tq - 1 - t / 2 : P + t;
    if (zigzag)
        for (int t = 0; t < Tq; t += 2) q_pos[t] = P + t / 2;
    for (int n = 0; n < nb; n++) {
        char kind = order[n];
        Tk[n] = kind == 'e' ? Tq - 23 : kind == 'f' ? 50 : zigzag ? Tq : Tq + 30;
        k_pos[n] = xmalloc(Tk[n] * sizeof(int));
        for (int t = 0; t < Tk[n]; t++)
            k_pos[n][t] = kind == 'e'   ? t
                          : kind == 'f' ? 100 * Tq + t
                          : zigzag      ? q_pos[t]
                          : nb == 1     ? P + 63 + t
                                        : P - 30 + t;
    }
    char label[64];
    snprintf(label, sizeof label, "B%d Tq%d H%d KV%d D%d %s%s", B, Tq, H, KV, D, order,
             zigzag ? " zigzag" : "");
    test_flash(label, B, Tq, H, KV, D, q_pos, nb, Tk, k_pos);
    for (int n = 0; n < nb; n++) free(k_pos[n]);
    free(q_pos);
}

// integers (expert ids, counts, sorted rows) must agree exactly
static void check_int(const char *what, const int *dev, const int *cpu, size_t n) {
    int *gpu = xmalloc(n * sizeof(int));
    device_to_host(gpu, dev, n * sizeof(int));
    size_t differ = 0;
    for (size_t i = 0; i < n; i++) differ += gpu[i] != cpu[i];
    int ok = differ == 0;
    printf("  %-4s %-40s %zu of %zu differ\n", ok ? "ok" : "FAIL", what, differ, n);
    ok ? passed++ : failed++;
    free(gpu);
}

// Mixture of experts: the router on random logits (two rows of exact ties, which the lower index
// wins), the counting sort with or without a capacity, the aux loss, and the shuffles and their
// backwards, each from the CPU's routing so that every kernel is compared alone.
static void test_moe(int N, int C, int E, int K, int capacity) {
    size_t ne = (size_t)N * E, nk = (size_t)N * K, nc = (size_t)N * C, ns = nk * C;
    char what[96];
    float *logits = random_host(ne, -4, 4);
    for (int e = 0; e < E; e++) logits[e] = 1.0f, logits[E + e] = (float)(e % 2);
    float *probs = xmalloc(ne * 4), *w = xmalloc(nk * 4);
    int *ids = xmalloc(nk * sizeof(int));
    float *d_logits = to_device(logits, ne * 4), *d_probs = device_malloc(ne * 4);
    float *d_w = device_malloc(nk * 4);
    int *d_ids = device_malloc(nk * sizeof(int));
    cpu_moe_router_forward(probs, ids, w, logits, N, E, K);
    moe_router_forward(d_probs, d_ids, d_w, d_logits, N, E, K);
    snprintf(what, sizeof what, "moe_router_forward N%d E%d K%d probs", N, E, K);
    check(what, d_probs, probs, ne, TOL_ELEM);
    check_int("moe_router_forward topk_ids", d_ids, ids, nk);
    check("moe_router_forward topk_w", d_w, w, nk, TOL_ELEM);
    host_to_device(d_probs, probs, ne * 4);
    host_to_device(d_w, w, nk * 4);
    host_to_device(d_ids, ids, nk * sizeof(int));

    int *counts = xmalloc(E * sizeof(int)), *offsets = xmalloc((E + 1) * sizeof(int));
    int *pos = xmalloc(nk * sizeof(int)), *d_counts = device_malloc(E * sizeof(int));
    int *d_offsets = device_malloc((E + 1) * sizeof(int)), *d_pos = device_malloc(nk * 4);
    cpu_moe_dispatch(counts, offsets, pos, ids, N, E, K, capacity);
    moe_dispatch(d_counts, d_offsets, d_pos, d_ids, N, E, K, capacity);
    snprintf(what, sizeof what, "moe_dispatch counts (capacity %d: %d dropped)", capacity,
             (int)nk - offsets[E]);
    check_int(what, d_counts, counts, E);
    check_int("moe_dispatch offsets", d_offsets, offsets, E + 1);
    check_int("moe_dispatch pos", d_pos, pos, nk);
    float *load = xmalloc(2 * E * sizeof(float)), *d_load = device_malloc(2 * E * sizeof(float));
    cpu_moe_load(load, probs, counts, N, E);
    moe_load(d_load, d_probs, d_counts, N, E);
    check("moe_load", d_load, load, 2 * E, TOL_ELEM);

    float *x = random_host(nc, -1, 1), *xs = random_host(ns, -1, 1), *outs = random_host(ns, -1, 1);
    float *y = xmalloc(nc * 4), *dy = random_host(nc, -1, 1), *dxs = random_host(ns, -1, 1);
    float *dw = random_host(nk, -1, 1), *dx = random_host(nc, -1, 1);
    float *dl = random_host(ne, -1, 1);
    float *d_x = to_device(x, nc * 4), *d_xs = to_device(xs, ns * 4);
    float *d_outs = to_device(outs, ns * 4), *d_y = device_malloc(nc * 4);
    float *d_dy = to_device(dy, nc * 4), *d_dxs = to_device(dxs, ns * 4);
    float *d_dw = to_device(dw, nk * 4), *d_dx = to_device(dx, nc * 4);
    float *d_dl = to_device(dl, ne * 4);
    cpu_moe_gather_forward(xs, x, pos, N, C, K);
    moe_gather_forward(d_xs, d_x, d_pos, N, C, K);
    check("moe_gather_forward", d_xs, xs, ns, 0.0);
    cpu_moe_combine_forward(y, outs, w, pos, N, C, K);
    moe_combine_forward(d_y, d_outs, d_w, d_pos, N, C, K);
    check("moe_combine_forward", d_y, y, nc, TOL_ELEM);
    cpu_moe_combine_backward(dxs, dw, dy, outs, w, pos, N, C, K);
    moe_combine_backward(d_dxs, d_dw, d_dy, d_outs, d_w, d_pos, N, C, K);
    check("moe_combine_backward dout_sorted (+=)", d_dxs, dxs, ns, TOL_ELEM);
    check("moe_combine_backward dtopk_w (+=)", d_dw, dw, nk, TOL_ELEM);
    cpu_moe_gather_backward(dx, dxs, pos, N, C, K);
    moe_gather_backward(d_dx, d_dxs, d_pos, N, C, K);
    check("moe_gather_backward (+=)", d_dx, dx, nc, TOL_ELEM);
    cpu_moe_router_backward(dl, dw, probs, ids, w, load, 0.3f, N, N, E, K);
    moe_router_backward(d_dl, d_dw, d_probs, d_ids, d_w, d_load, 0.3f, N, N, E, K);
    check("moe_router_backward (+=)", d_dl, dl, ne, TOL_ELEM);
    free(logits), free(probs), free(w), free(ids), free(counts), free(offsets), free(pos);
    free(load);
    free(x), free(xs), free(outs), free(y), free(dy), free(dxs), free(dw), free(dx), free(dl);
    device_free(d_logits), device_free(d_probs), device_free(d_w), device_free(d_ids);
    device_free(d_counts), device_free(d_offsets), device_free(d_pos), device_free(d_load);
    device_free(d_x), device_free(d_xs), device_free(d_outs), device_free(d_y), device_free(d_dy);
    device_free(d_dxs), device_free(d_dw), device_free(d_dx), device_free(d_dl);
}

static void test_swiglu(void) {
    size_t n = 100003;
    float *gate = random_host(n, -6, 6), *up = random_host(n, -2, 2), *out = xmalloc(n * 4);
    float *dout = random_host(n, -1, 1), *dg = random_host(n, -1, 1), *du = random_host(n, -1, 1);
    float *d_gate = to_device(gate, n * 4), *d_up = to_device(up, n * 4);
    float *d_out = device_malloc(n * 4), *d_dout = to_device(dout, n * 4);
    float *d_dg = to_device(dg, n * 4), *d_du = to_device(du, n * 4);
    cpu_swiglu_forward(out, gate, up, n);
    swiglu_forward(d_out, d_gate, d_up, n);
    check("swiglu_forward", d_out, out, n, TOL_ELEM);
    cpu_swiglu_backward(dg, du, dout, gate, up, n);
    swiglu_backward(d_dg, d_du, d_dout, d_gate, d_up, n);
    check("swiglu_backward dgate (written over garbage)", d_dg, dg, n, TOL_ELEM);
    check("swiglu_backward dup (written over garbage)", d_du, du, n, TOL_ELEM);
    free(gate), free(up), free(out), free(dout), free(dg), free(du);
    device_free(d_gate), device_free(d_up), device_free(d_out), device_free(d_dout);
    device_free(d_dg), device_free(d_du);
}

// Mamba's conv1d and selective scan: I = 40 channels make three scan groups (the last of 8), so
// the groups' partial dB and dC are summed as on the CPU; T = 3 is fewer tokens than the conv's
// width. The recurrence runs T steps with CUDA's expf against fast_exp.h's (each within an ulp or
// two), so a rounding per step can build up over the sequence: the scan's outputs are held to
// TOL_SUM (measured on the emulator, host expf: 2.9e-7 at most), the elementwise conv to TOL_ELEM.
static void test_mamba(int B, int T, int I, int S, int W, int with_bias) {
    size_t n = (size_t)B * T * I, nS = (size_t)B * T * S, nw = (size_t)I * W, nA = (size_t)I * S;
    char what[96];
    float *x = random_host(n, -1, 1), *w = random_host(nw, -1, 1), *bias = random_host(I, -1, 1);
    float *out = xmalloc(n * 4), *pre = xmalloc(n * 4), *dout = random_host(n, -1, 1);
    float *dx = random_host(n, -1, 1), *dw = random_host(nw, -1, 1), *db = random_host(I, -1, 1);
    float *d_x = to_device(x, n * 4), *d_w = to_device(w, nw * 4), *d_bias = to_device(bias, I * 4);
    float *d_out = device_malloc(n * 4), *d_pre = device_malloc(n * 4);
    float *d_dout = to_device(dout, n * 4), *d_dx = to_device(dx, n * 4);
    float *d_dw = to_device(dw, nw * 4), *d_db = to_device(db, I * 4);
    const float *b_or_null = with_bias ? bias : NULL, *d_b_or_null = with_bias ? d_bias : NULL;
    cpu_causal_conv1d_forward(out, pre, x, w, b_or_null, B, T, I, W);
    causal_conv1d_forward(d_out, d_pre, d_x, d_w, d_b_or_null, B, T, I, W);
    snprintf(what, sizeof what, "causal_conv1d_forward B%d T%d I%d W%d%s", B, T, I, W,
             with_bias ? " bias" : "");
    check(what, d_out, out, n, TOL_ELEM);
    check("causal_conv1d_forward pre", d_pre, pre, n, TOL_ELEM);
    cpu_causal_conv1d_backward(dx, dw, with_bias ? db : NULL, dout, x, pre, w, B, T, I, W);
    causal_conv1d_backward(d_dx, d_dw, with_bias ? d_db : NULL, d_dout, d_x, d_pre, d_w, B, T, I,
                           W);
    check("causal_conv1d_backward dx (written over garbage)", d_dx, dx, n, TOL_ELEM);
    check("causal_conv1d_backward dweight (+=)", d_dw, dw, nw, TOL_ELEM);
    check("causal_conv1d_backward dbias (+=)", d_db, db, I, TOL_ELEM);

    float *dt = random_host(n, -1.5, 0.5), *dtb = random_host(I, -0.5, 0.5);
    float *A_log = random_host(nA, 0, 2), *Bm = random_host(nS, -1, 1),
          *Cm = random_host(nS, -1, 1);
    float *D = random_host(I, 0.5, 1.5), *y = xmalloc(n * 4), *du = random_host(n, -1, 1);
    float *ddt = random_host(n, -1, 1), *dB = random_host(nS, -1, 1), *dC = random_host(nS, -1, 1);
    float *ddtb = random_host(I, -1, 1), *dA = random_host(nA, -1, 1), *dD = random_host(I, -1, 1);
    float *d_dt = to_device(dt, n * 4), *d_dtb = to_device(dtb, I * 4);
    float *d_A = to_device(A_log, nA * 4), *d_Bm = to_device(Bm, nS * 4);
    float *d_Cm = to_device(Cm, nS * 4), *d_D = to_device(D, I * 4), *d_y = device_malloc(n * 4);
    float *d_du = to_device(du, n * 4), *d_ddt = to_device(ddt, n * 4);
    float *d_dB = to_device(dB, nS * 4), *d_dC = to_device(dC, nS * 4);
    float *d_ddtb = to_device(ddtb, I * 4), *d_dA = to_device(dA, nA * 4);
    float *d_dD = to_device(dD, I * 4);
    // u is the conv's output, dy its dout: inputs of the right scale
    cpu_selective_scan_forward(y, out, dt, dtb, A_log, Bm, Cm, D, B, T, I, S);
    selective_scan_forward(d_y, d_out, d_dt, d_dtb, d_A, d_Bm, d_Cm, d_D, B, T, I, S);
    snprintf(what, sizeof what, "selective_scan_forward B%d T%d I%d S%d", B, T, I, S);
    check(what, d_y, y, n, TOL_SUM);
    cpu_selective_scan_backward(du, ddt, dB, dC, ddtb, dA, dD, dout, out, dt, dtb, A_log, Bm, Cm, D,
                                B, T, I, S);
    selective_scan_backward(d_du, d_ddt, d_dB, d_dC, d_ddtb, d_dA, d_dD, d_dout, d_out, d_dt, d_dtb,
                            d_A, d_Bm, d_Cm, d_D, B, T, I, S);
    check("selective_scan_backward du (written over garbage)", d_du, du, n, TOL_SUM);
    check("selective_scan_backward ddt (written over garbage)", d_ddt, ddt, n, TOL_SUM);
    check("selective_scan_backward dB (written over garbage)", d_dB, dB, nS, TOL_SUM);
    check("selective_scan_backward dC (written over garbage)", d_dC, dC, nS, TOL_SUM);
    check("selective_scan_backward ddt_bias (+=)", d_ddtb, ddtb, I, TOL_SUM);
    check("selective_scan_backward dA_log (+=)", d_dA, dA, nA, TOL_SUM);
    check("selective_scan_backward dD (+=)", d_dD, dD, I, TOL_SUM);
    free(x), free(w), free(bias), free(out), free(pre), free(dout), free(dx), free(dw), free(db);
    free(dt), free(dtb), free(A_log), free(Bm), free(Cm), free(D), free(y), free(du), free(ddt);
    free(dB), free(dC), free(ddtb), free(dA), free(dD);
    device_free(d_x), device_free(d_w), device_free(d_bias), device_free(d_out);
    device_free(d_pre), device_free(d_dout), device_free(d_dx), device_free(d_dw);
    device_free(d_db), device_free(d_dt), device_free(d_dtb), device_free(d_A), device_free(d_Bm);
    device_free(d_Cm), device_free(d_D), device_free(d_y), device_free(d_du), device_free(d_ddt);
    device_free(d_dB), device_free(d_dC), device_free(d_ddtb), device_free(d_dA);
    device_free(d_dD);
}

// N = 70000 rows: more than a grid's y or z dimension holds (65535). sumexp is a length-V sum in
// another order: at V = 4099 the CPU's sequential float sum was 6.1e-6 off the exact (double) one,
// the GPU's 1.6e-7, so what TOL_ELEM leaves room for is mostly the CPU's rounding.
static void test_cross_entropy(int N, int V, int vocab_start) {
    size_t nl = (size_t)N * V;
    char what[96];
    int *targets = xmalloc(N * sizeof(int));
    for (int n = 0; n < N; n++)
        targets[n] = (int)uniform(0, 2 * (vocab_start + V)); // some elsewhere
    float *logits = random_host(nl, -8, 8), *dlogits = random_host(nl, -1, 1);
    float *maxes = xmalloc(N * 4), *sumexp = xmalloc(N * 4), *tl = xmalloc(N * 4);
    float *losses = xmalloc(N * 4);
    int *d_targets = to_device(targets, N * sizeof(int));
    float *d_logits = to_device(logits, nl * 4), *d_dlogits = to_device(dlogits, nl * 4);
    float *d_maxes = device_malloc(N * 4), *d_sumexp = device_malloc(N * 4);
    float *d_tl = device_malloc(N * 4), *d_losses = device_malloc(N * 4);
    cpu_cross_entropy_stats(maxes, sumexp, tl, logits, targets, N, V, vocab_start);
    cross_entropy_stats(d_maxes, d_sumexp, d_tl, d_logits, d_targets, N, V, vocab_start);
    snprintf(what, sizeof what, "cross_entropy_stats N%d V%d maxes", N, V);
    check(what, d_maxes, maxes, N, 0.0);
    snprintf(what, sizeof what, "cross_entropy_stats N%d V%d sumexp", N, V);
    check(what, d_sumexp, sumexp, N, TOL_ELEM);
    snprintf(what, sizeof what, "cross_entropy_stats N%d V%d target_logit", N, V);
    check(what, d_tl, tl, N, 0.0);
    cpu_cross_entropy_loss(losses, maxes, sumexp, tl, N);
    cross_entropy_loss(d_losses, d_maxes, d_sumexp, d_tl, N);
    snprintf(what, sizeof what, "cross_entropy_loss N%d V%d", N, V);
    check(what, d_losses, losses, N, TOL_ELEM);
    // dlogits start as random garbage on both devices: the backward writes, it does not add
    cpu_cross_entropy_backward(dlogits, logits, maxes, sumexp, targets, 0.01f, N, V, vocab_start);
    cross_entropy_backward(d_dlogits, d_logits, d_maxes, d_sumexp, d_targets, 0.01f, N, V,
                           vocab_start);
    snprintf(what, sizeof what, "cross_entropy_backward N%d V%d (=)", N, V);
    check(what, d_dlogits, dlogits, nl, TOL_ELEM);
    free(targets), free(logits), free(dlogits), free(maxes), free(sumexp), free(tl), free(losses);
    device_free(d_targets), device_free(d_logits), device_free(d_dlogits), device_free(d_maxes);
    device_free(d_sumexp), device_free(d_tl), device_free(d_losses);
}

// ---------------------------------------------------------------------------------------------
// The embedding's sort, RMSNorm's block partial sums and the one-read cross-entropy at shapes
// that exercise their parallelism, and their determinism: each runs twice on the same inputs and
// must write the same bytes (t_81 runs this program again with the emulator's threads and blocks
// in reverse order, and under its race check, which compares two orders of every launch).

static void check_same_bytes(const char *what, const void *dev_a, const void *dev_b, size_t bytes) {
    unsigned char *a = xmalloc(bytes), *b = xmalloc(bytes);
    device_to_host(a, dev_a, bytes);
    device_to_host(b, dev_b, bytes);
    size_t differ = 0;
    for (size_t i = 0; i < bytes; i++) differ += a[i] != b[i];
    printf("  %-4s %-40s %zu of %zu bytes differ\n", differ ? "FAIL" : "ok", what, differ, bytes);
    differ ? failed++ : passed++;
    free(a), free(b);
}

// tokens drawn from [0, vocab) (or all one token of the shard): each repeats ~N / vocab times,
// and those outside [vocab_start, vocab_start + V) belong to other shards. N > 4096 takes the sort
// past one block's tile. Bit-equal to the CPU: each row's rows of dout add in position order.
static void test_embedding_backward_sorted(int N, int C, int vocab, int vocab_start, int V,
                                           int one_token) {
    char what[96];
    int *tokens = xmalloc(N * sizeof(int));
    for (int n = 0; n < N; n++)
        tokens[n] = one_token ? vocab_start + V / 2 : (int)uniform(0, vocab);
    float *dout = random_host((size_t)N * C, -1, 1), *dwte = random_host((size_t)V * C, -1, 1);
    int *d_tokens = to_device(tokens, N * sizeof(int));
    float *d_dout = to_device(dout, (size_t)N * C * 4);
    float *d_a = to_device(dwte, (size_t)V * C * 4), *d_b = to_device(dwte, (size_t)V * C * 4);
    cpu_embedding_backward(dwte, dout, tokens, N, C, vocab_start, V);
    embedding_backward(d_a, d_dout, d_tokens, N, C, vocab_start, V);
    embedding_backward(d_b, d_dout, d_tokens, N, C, vocab_start, V);
    snprintf(what, sizeof what, "embedding_backward N%d C%d vocab %d%s", N, C,
             one_token ? 1 : vocab, one_token ? " (one token)" : "");
    check(what, d_a, dwte, (size_t)V * C, 0.0);
    snprintf(what, sizeof what, "embedding_backward N%d twice", N);
    check_same_bytes(what, d_a, d_b, (size_t)V * C * 4);
    free(tokens), free(dout), free(dwte);
    device_free(d_tokens), device_free(d_dout), device_free(d_a), device_free(d_b);
}

// N not a multiple of the block's rows, C of the block's threads; C = 12300 needs more than
// 48 KiB of shared memory for the block's dweight row, which the kernel must ask for
static void test_rmsnorm_backward_blocks(int N, int C) {
    char what[96];
    size_t nc = (size_t)N * C;
    float *inp = random_host(nc, -2, 2), *w = random_host(C, 0.5f, 1.5f);
    float *out = xmalloc(nc * 4), *rstd = xmalloc(N * 4);
    float *dout = random_host(nc, -1, 1), *dinp = random_host(nc, -1, 1);
    float *dw = random_host(C, -1, 1);
    float *d_inp = to_device(inp, nc * 4), *d_w = to_device(w, C * 4);
    float *d_out = device_malloc(nc * 4), *d_rstd = device_malloc(N * 4);
    float *d_dout = to_device(dout, nc * 4);
    float *d_dinp = to_device(dinp, nc * 4), *d_dw = to_device(dw, C * 4);
    float *d_dinp2 = to_device(dinp, nc * 4), *d_dw2 = to_device(dw, C * 4);
    cpu_rmsnorm_forward(out, rstd, inp, w, N, C, 1e-5f);
    rmsnorm_forward(d_out, d_rstd, d_inp, d_w, N, C, 1e-5f);
    host_to_device(d_rstd, rstd, N * 4); // the backward's inputs equal on both devices
    cpu_rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
    rmsnorm_backward(d_dinp, d_dw, d_dout, d_inp, d_w, d_rstd, N, C);
    rmsnorm_backward(d_dinp2, d_dw2, d_dout, d_inp, d_w, d_rstd, N, C);
    snprintf(what, sizeof what, "rmsnorm_backward N%d C%d dinp", N, C);
    check(what, d_dinp, dinp, nc, TOL_ELEM);
    snprintf(what, sizeof what, "rmsnorm_backward N%d C%d dweight", N, C);
    check(what, d_dw, dw, C, TOL_ELEM);
    snprintf(what, sizeof what, "rmsnorm_backward N%d twice: dinp", N);
    check_same_bytes(what, d_dinp, d_dinp2, nc * 4);
    snprintf(what, sizeof what, "rmsnorm_backward N%d twice: dweight", N);
    check_same_bytes(what, d_dw, d_dw2, C * 4);
    free(inp), free(w), free(out), free(rstd), free(dout), free(dinp), free(dw);
    device_free(d_inp), device_free(d_w), device_free(d_out), device_free(d_rstd);
    device_free(d_dout), device_free(d_dinp), device_free(d_dw), device_free(d_dinp2);
    device_free(d_dw2);
}

// The vocab-parallel merge on one device: two shards' statistics, the max of their maxima, each
// sum rescaled to it and the sums added (what tensor_parallel.c all-reduces) give the full
// vocabulary's loss; each shard's dlogits equal the full backward's columns. Then the stats and
// the backward run again and must write the same bytes.
static void test_cross_entropy_shards(int N, int V, int V0) {
    int V1 = V - V0;
    char what[96];
    size_t nl = (size_t)N * V;
    int *targets = xmalloc(N * sizeof(int));
    for (int n = 0; n < N; n++) targets[n] = (int)uniform(0, V);
    float *logits = random_host(nl, -8, 8), *dlogits = xmalloc(nl * 4);
    float *maxes = xmalloc(N * 4), *sumexp = xmalloc(N * 4), *tl = xmalloc(N * 4);
    float *losses = xmalloc(N * 4), *part = xmalloc(nl * 4);
    cpu_cross_entropy_stats(maxes, sumexp, tl, logits, targets, N, V, 0);
    cpu_cross_entropy_loss(losses, maxes, sumexp, tl, N);
    cpu_cross_entropy_backward(dlogits, logits, maxes, sumexp, targets, 0.01f, N, V, 0);
    // the shards (N, V0) and (N, V1), one after the other in one buffer
    for (int n = 0; n < N; n++) {
        memcpy(part + (size_t)n * V0, logits + (size_t)n * V, V0 * 4);
        memcpy(part + (size_t)N * V0 + (size_t)n * V1, logits + (size_t)n * V + V0, V1 * 4);
    }
    int *d_targets = to_device(targets, N * sizeof(int));
    float *d_part = to_device(part, nl * 4), *d_part1 = d_part + (size_t)N * V0;
    float *d_dpart = device_malloc(nl * 4), *d_dpart2 = device_malloc(nl * 4);
    float *d_stats = device_malloc(9 * (size_t)N * 4); // 3 shards' (max, sumexp, target_logit)
    float *m0 = d_stats, *s0 = m0 + N, *t0 = s0 + N, *m1 = t0 + N, *s1 = m1 + N, *t1 = s1 + N;
    float *m2 = t1 + N, *s2 = m2 + N, *t2 = s2 + N;
    cross_entropy_stats(m0, s0, t0, d_part, d_targets, N, V0, 0);
    cross_entropy_stats(m1, s1, t1, d_part1, d_targets, N, V1, V0);
    cross_entropy_stats(m2, s2, t2, d_part1, d_targets, N, V1, V0);
    snprintf(what, sizeof what, "cross_entropy_stats N%d V%d twice", N, V1);
    check_same_bytes(what, m1, m2, 3 * (size_t)N * 4);
    float *h = xmalloc(6 * (size_t)N * 4), *max_all = xmalloc(N * 4);
    device_to_host(h, d_stats, 6 * (size_t)N * 4);
    for (int n = 0; n < N; n++) max_all[n] = fmaxf(h[n], h[3 * N + n]);
    float *d_max = to_device(max_all, N * 4);
    cross_entropy_rescale(s0, m0, d_max, N);
    cross_entropy_rescale(s1, m1, d_max, N);
    add_inplace(s0, s1, N);
    add_inplace(t0, t1, N);
    float *d_losses = device_malloc(N * 4);
    cross_entropy_loss(d_losses, d_max, s0, t0, N);
    snprintf(what, sizeof what, "cross_entropy 2 shards N%d V%d+%d loss", N, V0, V1);
    check(what, d_losses, losses, N, TOL_ELEM);
    fill(d_dpart, NAN, nl), fill(d_dpart2, NAN, nl); // written whole: no NaN may stay
    for (int run = 0; run < 2; run++) {
        float *d = run ? d_dpart2 : d_dpart;
        cross_entropy_backward(d, d_part, d_max, s0, d_targets, 0.01f, N, V0, 0);
        cross_entropy_backward(d + (size_t)N * V0, d_part1, d_max, s0, d_targets, 0.01f, N, V1, V0);
    }
    for (int n = 0; n < N; n++) { // the CPU's full dlogits, laid out as the shards
        memcpy(part + (size_t)n * V0, dlogits + (size_t)n * V, V0 * 4);
        memcpy(part + (size_t)N * V0 + (size_t)n * V1, dlogits + (size_t)n * V + V0, V1 * 4);
    }
    snprintf(what, sizeof what, "cross_entropy 2 shards N%d V%d+%d dlogits", N, V0, V1);
    check(what, d_dpart, part, nl, TOL_ELEM);
    snprintf(what, sizeof what, "cross_entropy_backward N%d V%d twice", N, V);
    check_same_bytes(what, d_dpart, d_dpart2, nl * 4);
    free(targets), free(logits), free(dlogits), free(maxes), free(sumexp), free(tl), free(losses);
    free(part), free(h), free(max_all);
    device_free(d_targets), device_free(d_part), device_free(d_dpart), device_free(d_dpart2);
    device_free(d_stats), device_free(d_max), device_free(d_losses);
}

static void test_adamw(void) {
    size_t n = 100003;
    float *p = random_host(n, -1, 1), *m = xmalloc(n * 4), *v = xmalloc(n * 4);
    float *d_p = to_device(p, n * 4), *d_m = device_malloc(n * 4), *d_v = device_malloc(n * 4);
    for (int t = 1; t <= 3; t++) {
        float *g = random_host(n, -0.1f, 0.1f), *d_g = to_device(g, n * 4);
        cpu_adamw_update(p, g, m, v, n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
        adamw_update(d_p, d_g, d_m, d_v, n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
        free(g), device_free(d_g);
    }
    check("adamw_update params after 3 steps", d_p, p, n, TOL_ELEM);
    check("adamw_update m", d_m, m, n, TOL_ELEM);
    check("adamw_update v", d_v, v, n, TOL_ELEM);
    free(p), free(m), free(v), device_free(d_p), device_free(d_m), device_free(d_v);
}

// bit-for-bit: uniform and constant exactly; normal to 1 ulp on a tiny fraction (see the top)
static void test_init(int kind, int rows, int cols, int row0, int col0, int global_cols) {
    size_t n = (size_t)rows * cols;
    float *cpu = xmalloc(n * 4), *gpu = xmalloc(n * 4), *d = device_malloc(n * 4);
    uint64_t name = hash_string("model.layers.3.self_attn.q_proj.weight");
    cpu_init_tensor(cpu, 1234, name, kind, 0.02f, rows, cols, row0, col0, global_cols);
    init_tensor(d, 1234, name, kind, 0.02f, rows, cols, row0, col0, global_cols);
    device_to_host(gpu, d, n * 4);
    size_t differ = 0, beyond_ulp = 0;
    for (size_t i = 0; i < n; i++) {
        if (memcmp(&cpu[i], &gpu[i], 4) == 0) continue;
        differ++;
        if (fabsf(gpu[i] - cpu[i]) > fabsf(nextafterf(cpu[i], INFINITY) - cpu[i])) beyond_ulp++;
    }
    size_t allowed = kind == 1 ? (size_t)(n * NORMAL_MISMATCH_RATE) : 0;
    int ok = beyond_ulp == 0 && differ <= allowed;
    printf("  %-4s init_tensor kind %d (%dx%d block of a (.., %d))        %zu of %zu elements "
           "differ (allowed %zu, 1 ulp)\n",
           ok ? "ok" : "FAIL", kind, rows, cols, global_cols, differ, n, allowed);
    ok ? passed++ : failed++;
    free(cpu), free(gpu), device_free(d);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    backend_init(0);
    test_elementwise();
    test_matmul();
    test_matmul_bf16();
    test_bf16_copies();
    test_embedding();
    test_rmsnorm();
    test_rope();
    test_attention(2, 67, 4, 2, 64, 0, 0);
    test_attention(1, 100, 8, 8, 128, 1, 1);
    test_attention(2, 33, 6, 1, 32, 0, 1);
    test_flash_ring(2, 100, 8, 2, 64, 0, "eof");
    test_flash_ring(2, 70, 8, 4, 32, 1, "ofe");
    test_flash_ring(1, 70, 4, 2, 8, 0, "o");
    test_flash_ring(1, 65, 2, 1, 128, 0, "foe");
    test_swiglu();
    test_moe(1000, 96, 8, 2, 200);
    test_moe(257, 64, 64, 6, 0);
    test_mamba(2, 37, 40, 16, 4, 1);
    test_mamba(1, 3, 16, 3, 4, 0);
    test_cross_entropy(37, 1000, 500);
    test_cross_entropy(70000, 24, 0);
    test_embedding_backward_sorted(5000, 200, 50, 10, 30, 0);
    test_embedding_backward_sorted(4096, 130, 50, 0, 50, 0);
    test_embedding_backward_sorted(3001, 64, 50, 5, 20, 1);
    test_embedding_backward_sorted(1, 7, 50, 0, 50, 0);
    test_rmsnorm_backward_blocks(5003, 1500);
    test_rmsnorm_backward_blocks(9, 12300);
    test_cross_entropy(300, 4099, 1000);
    test_cross_entropy_shards(300, 4099, 2050);
    test_adamw();
    for (int kind = 0; kind < 3; kind++) test_init(kind, 300, 500, 7, 250, 1000);
    test_init(1, 2048, 2048, 0, 0, 2048); // the mismatch rate of normals over 4M elements
    size_t used = device_memory_used();
    double peak = device_peak_flops(1);
    int ok = used > 0;
    printf("  %-4s device_memory_used %.1f MiB, device_peak_flops %.4g\n", ok ? "ok" : "FAIL",
           used / 1048576.0, peak);
    ok ? passed++ : failed++;
    printf("%d passed, %d failed\n", passed, failed);
    MPI_Finalize();
    return failed > 0;
}
