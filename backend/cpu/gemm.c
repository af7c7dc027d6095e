// The CPU's matrix product, written out (beyond picotron, which leaves it to PyTorch): Goto's
// algorithm, as BLIS lays it out (Van Zee and van de Geijn). B is copied ("packed") into panels
// of NR columns that are read in order, A into panels of MR rows, and a micro-kernel keeps an
// (MR, NR) tile of C in registers while it walks K: for each k one row of B's panel (NR floats,
// two vectors) meets MR broadcast values of A's panel, MR * 2 vector FMAs. The blocks are sized
// for the caches: KC values of k per pass over C, MC rows of A kept in L2, NC columns of B in L3.
// Written in GCC's vector extensions, so one source serves AVX-512, AVX2 and SSE: the
// width is the widest this build may use. Measured on an AMD EPYC with AVX-512 against BLIS 0.9's
// skx kernels at the model's shapes: 1.14 to 1.18 times as fast (79-84% of the FMA peak); built
// for AVX2 on the same CPU, level with BLIS's zen3 kernels (85-91%). bench/bench_gemm.sh.
// Every element of C sums its products in the same order wherever it sits (k in order, in
// blocks of KC): splitting rows among threads or columns among tensor-parallel ranks does not
// change a bit.
#include "backend/cpu/gemm.h"
#include "utils.h"
#include <omp.h>
#include <stdlib.h>
#include <string.h>

// MR (gemm.h's SGEMM_MR): 28 accumulators and B's two vectors in AVX-512's 32 registers, 12 and
// two in AVX2's (or SSE's) 16
#define MR SGEMM_MR
#if defined(__AVX512F__)
typedef float FloatVector __attribute__((vector_size(64)));
#elif defined(__AVX__)
typedef float FloatVector __attribute__((vector_size(32)));
#else
typedef float FloatVector __attribute__((vector_size(16)));
#endif
#define LANES (int)(sizeof(FloatVector) / sizeof(float))
#define NR    SGEMM_NR // two vectors
_Static_assert(SGEMM_NR == 2 * LANES, "gemm.h's SGEMM_NR is two of this build's vectors");
// measured on the EPYC above (bench/bench_gemm.sh): KC 512 beat 256 and 384 by 5-10%; on an
// Intel Xeon with a 48 KB L1d, by 4-5% too, and MC 168 or 252 was level with 84. Build with
// -DKC=... (or MC, NC) in OPT to measure another blocking on another CPU.
#ifndef KC
#define KC 512
#endif
#ifndef MC
#define MC 84 // a multiple of both MRs
#endif
#ifndef NC
#define NC 1536
#endif
// measured on the Intel Xeon (bench/bench_gemm.sh, against BLIS in the same run): 16 rows ahead
// 1.09-1.11 times BLIS, 4 and 8 rows less, none 1.06-1.08
#ifndef PREFETCH_B
#define PREFETCH_B 16
#endif
#define LINE_FLOATS  (64 / (int)sizeof(float)) // a prefetch fetches one 64-byte cache line
#define PANEL_FLOATS ((size_t)MC * KC + (size_t)KC * NC) // one thread's packed A and B

// The threads' packed panels, kept from call to call. Grown outside parallel regions only
// (sgemm_reserve), so that a failing allocation ends the job from the main thread.
static float *panels;
static int panel_threads;

void sgemm_reserve(int threads) {
    if (threads <= panel_threads) return;
    free(panels);
    panels = aligned_alloc(64, threads * PANEL_FLOATS * sizeof(float));
    if (!panels)
        FAIL("the machine is out of memory",
             "could not allocate %.1f MB for %d threads' GEMM panels",
             threads * PANEL_FLOATS * sizeof(float) / 1e6, threads);
    panel_threads = threads;
}

static inline FloatVector load(const float *p) {
    FloatVector v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void store(float *p, FloatVector v) {
    memcpy(p, &v, sizeof v);
}

// c (MR, NR) = beta * c + alpha * a (MR, kc) @ b (kc, NR); a's element (i, k) at a[i * rsa + k *
// csa], b packed (kc rows of NR). beta = 0 never reads c. Inlined into its two callers, where
// the strides are constants or a loop-invariant lda.
static inline __attribute__((always_inline)) void micro_kernel(float *restrict c, int ldc,
                                                               const float *restrict a, size_t rsa,
                                                               size_t csa, const float *restrict b,
                                                               int kc, float alpha, float beta) {
    FloatVector acc[MR][2];
#pragma GCC unroll 16
    for (int i = 0; i < MR; i++) { // C's tile is fetched for writing while the k loop runs
        acc[i][0] = acc[i][1] = (FloatVector){0};
        __builtin_prefetch(c + (size_t)i * ldc, 1);
        __builtin_prefetch(c + (size_t)i * ldc + NR - 1, 1);
    }
    for (int k = 0; k < kc; k++) {
        FloatVector b0 = load(b + (size_t)k * NR), b1 = load(b + (size_t)k * NR + LANES);
        // B's panel (KC x NR, 64 KB at KC 512 with AVX-512) outgrows a 48 KB L1d: ask for its
        // row PREFETCH_B rows ahead, past the panel's end into the next one, which lies right
        // after it; one request a line (two with AVX-512, one with AVX2)
#pragma GCC unroll 2
        for (int j = 0; j < NR; j += LINE_FLOATS)
            __builtin_prefetch(b + (size_t)(k + PREFETCH_B) * NR + j);
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) {
            float a_ik = a[i * rsa + k * csa];
            acc[i][0] += a_ik * b0;
            acc[i][1] += a_ik * b1;
        }
    }
#pragma GCC unroll 16
    for (int i = 0; i < MR; i++) {
        float *ci = c + (size_t)i * ldc;
        FloatVector c0 = alpha * acc[i][0], c1 = alpha * acc[i][1];
        if (beta != 0.0f) c0 += beta * load(ci), c1 += beta * load(ci + LANES);
        store(ci, c0), store(ci + LANES, c1);
    }
}

// A's panel packed: (kc, MR), MR values of one k side by side
static void kernel_packed(float *c, int ldc, const float *a, const float *b, int kc, float alpha,
                          float beta) {
    micro_kernel(c, ldc, a, 1, MR, b, kc, alpha, beta);
}

// A's MR rows read where they are (row-major, no transpose): the broadcasts walk MR rows of
// lda floats, each in order, which the caches serve as well as a packed panel, and the copy is
// saved
static void kernel_rows(float *c, int ldc, const float *a, int lda, const float *b, int kc,
                        float alpha, float beta) {
    micro_kernel(c, ldc, a, lda, 1, b, kc, alpha, beta);
}

// A tile at C's right or bottom edge (mr < MR or nr < NR): the same kernel on a whole tile of
// scratch, so that an element's bits do not depend on whether it sits at an edge
static void kernel_edge(float *c, int ldc, int mr, int nr, const float *a, size_t rsa, size_t csa,
                        const float *b, int kc, float alpha, float beta) {
    float tile[MR * NR];
    for (int i = 0; i < mr; i++) memcpy(tile + i * NR, c + (size_t)i * ldc, nr * sizeof(float));
    micro_kernel(tile, NR, a, rsa, csa, b, kc, alpha, beta);
    for (int i = 0; i < mr; i++) memcpy(c + (size_t)i * ldc, tile + i * NR, nr * sizeof(float));
}

// b (kc, nc) of op(B), from row k0 and column j0, into panels of NR columns, (kc, NR) each (the
// last one padded with zeros). Either way B is read along its rows, in order.
static void pack_b(float *dst, int trans_b, const float *B, int ldb, int k0, int j0, int kc,
                   int nc) {
    for (int jp = 0; jp < nc; jp += NR) {
        float *panel = dst + (size_t)jp * kc;
        int nr = nc - jp < NR ? nc - jp : NR;
        if (trans_b) { // column j of op(B) is row j of B: NR rows read side by side, so that
                       // the panel is written in order (written along its columns, it measured
                       // several times slower: each store a cache line of its own)
            const float *src = B + (size_t)(j0 + jp) * ldb + k0;
            for (int k = 0; k < kc; k++) {
                float *d = panel + (size_t)k * NR;
                if (nr == NR)
                    for (int j = 0; j < NR; j++) d[j] = src[(size_t)j * ldb + k];
                else
                    for (int j = 0; j < NR; j++) d[j] = j < nr ? src[(size_t)j * ldb + k] : 0.0f;
            }
        }
    }
    for (int k = 0; !trans_b && k < kc; k++) { // row k of B is row k of every panel
        const float *src = B + (size_t)(k0 + k) * ldb + j0;
        for (int jp = 0; jp < nc; jp += NR) {
            float *d = dst + (size_t)jp * kc + (size_t)k * NR;
            int nr = nc - jp < NR ? nc - jp : NR;
            if (nr == NR) // a fixed size: two vectors, where a memcpy of nr would be a call
                store(d, load(src + jp)), store(d + LANES, load(src + jp + LANES));
            else
                for (int j = 0; j < NR; j++) d[j] = j < nr ? src[jp + j] : 0.0f;
        }
    }
}

// a (mc, kc) of op(A), from row i0 and column k0, into panels of MR rows, (kc, MR) each (the
// last one padded with zeros). Untransposed, only a panel cut short is packed (the kernel reads
// whole panels' rows where they are).
static void pack_a(float *dst, int trans_a, const float *A, int lda, int i0, int k0, int mc,
                   int kc) {
    for (int k = 0; trans_a && k < kc; k++) { // row k of A holds column k of every panel
        const float *src = A + (size_t)(k0 + k) * lda + i0;
        for (int ip = 0; ip < mc; ip += MR) {
            float *d = dst + (size_t)ip * kc + (size_t)k * MR;
            int mr = mc - ip < MR ? mc - ip : MR;
            if (mr == MR) // a fixed size, which the compiler copies in vectors
                memcpy(d, src + ip, MR * sizeof(float));
            else
                for (int i = 0; i < MR; i++) d[i] = i < mr ? src[ip + i] : 0.0f;
        }
    }
    int ip = mc / MR * MR, mr = mc - ip; // the panel cut short, if any
    if (trans_a || mr == 0) return;
    float *panel = dst + (size_t)ip * kc;
    for (int i = 0; i < MR; i++) {
        const float *src = A + (size_t)(i0 + ip + i) * lda + k0;
        for (int k = 0; k < kc; k++) panel[(size_t)k * MR + i] = i < mr ? src[k] : 0.0f;
    }
}

// this thread's packed panels: A's (MC, KC), then B's (KC, NC)
static float *thread_panels(void) {
    int thread = omp_in_parallel() ? omp_get_thread_num() : 0;
    if (!omp_in_parallel()) sgemm_reserve(1);
    if (thread >= panel_threads)
        FAIL("call sgemm_reserve(threads) before the parallel region",
             "thread %d has no GEMM panels", thread);
    return panels + thread * PANEL_FLOATS;
}

// C (M, nc) = beta * C + alpha * op(A) (M, kc) from A's column pc @ b (kc, nc): b's panels of NR
// columns lie panel_floats apart, kc rows of each read. The loops over A's blocks and C's tiles.
static void block_product(float *C, int ldc, int trans_a, const float *A, int lda, int M, int pc,
                          int kc, const float *b_panels, size_t panel_floats, int nc, float alpha,
                          float beta, float *a_panels) {
    for (int ic = 0; ic < M; ic += MC) {
        int mc = M - ic < MC ? M - ic : MC;
        pack_a(a_panels, trans_a, A, lda, ic, pc, mc, kc);
        for (int jp = 0; jp < nc; jp += NR) {
            const float *b = b_panels + (size_t)(jp / NR) * panel_floats;
            int nr = nc - jp < NR ? nc - jp : NR;
            for (int ip = 0; ip < mc; ip += MR) {
                float *c = C + (size_t)(ic + ip) * ldc + jp;
                int mr = mc - ip < MR ? mc - ip : MR;
                const float *packed = a_panels + (size_t)ip * kc;
                const float *rows = A + (size_t)(ic + ip) * lda + pc;
                int is_packed = trans_a || mr < MR; // as pack_a packs
                if (mr < MR || nr < NR)
                    kernel_edge(c, ldc, mr, nr, is_packed ? packed : rows, is_packed ? 1 : lda,
                                is_packed ? MR : 1, b, kc, alpha, beta);
                else if (is_packed)
                    kernel_packed(c, ldc, packed, b, kc, alpha, beta);
                else
                    kernel_rows(c, ldc, rows, lda, b, kc, alpha, beta);
            }
        }
    }
}

// an empty sum: C = beta * C
static void scale(float *C, int ldc, int M, int N, float beta) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++)
            C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
}

void sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
           const float *B, int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) return scale(C, ldc, M, N, beta);
    float *a_panels = thread_panels(), *b_panels = a_panels + (size_t)MC * KC;
    for (int jc = 0; jc < N; jc += NC) {
        int nc = N - jc < NC ? N - jc : NC;
        for (int pc = 0; pc < K; pc += KC) {
            int kc = K - pc < KC ? K - pc : KC;
            pack_b(b_panels, trans_b, B, ldb, pc, jc, kc, nc);
            // later passes over K add to the first
            block_product(C + jc, ldc, trans_a, A, lda, M, pc, kc, b_panels, (size_t)kc * NR, nc,
                          alpha, pc == 0 ? beta : 1.0f, a_panels);
        }
    }
}

// A packed B's layout: blocks of NC columns; in each, blocks of KC rows; in each, the panels of
// NR columns, (kc, NR) each, as sgemm packs them for one pass. Block (jc, pc) starts after the
// jc columns before it (K rows each) and the pc rows of its own columns.
static size_t round_up(size_t n, size_t to) {
    return (n + to - 1) / to * to;
}
static const float *packed_block(SgemmPacked b, int jc, int pc) {
    size_t columns = round_up(b.N - jc < NC ? b.N - jc : NC, NR);
    return b.panels + (size_t)jc * b.K + (size_t)pc * columns;
}

size_t sgemm_packed_floats(int K, int N) {
    return (size_t)K * round_up(N, NR);
}

void sgemm_pack(SgemmPacked b, int trans_b, const float *B, int ldb) {
    for (int jc = 0; jc < b.N; jc += NC)
        for (int pc = 0; pc < b.K; pc += KC)
            pack_b((float *)packed_block(b, jc, pc), trans_b, B, ldb, pc, jc,
                   b.K - pc < KC ? b.K - pc : KC, b.N - jc < NC ? b.N - jc : NC);
}

void sgemm_packed(int trans_a, int M, int N, int K, float alpha, const float *A, int lda,
                  SgemmPacked b, float beta, float *C, int ldc) {
    if (K > b.K || N > b.N)
        FAIL("", "sgemm_packed: a (%d, %d) product of a packed (%d, %d)", K, N, b.K, b.N);
    if (M <= 0 || N <= 0) return;
    if (K <= 0) return scale(C, ldc, M, N, beta);
    float *a_panels = thread_panels();
    for (int jc = 0; jc < N; jc += NC) {
        int nc = N - jc < NC ? N - jc : NC;
        for (int pc = 0; pc < K; pc += KC) {
            int packed_kc = b.K - pc < KC ? b.K - pc : KC, kc = K - pc < KC ? K - pc : KC;
            block_product(C + jc, ldc, trans_a, A, lda, M, pc, kc, packed_block(b, jc, pc),
                          (size_t)packed_kc * NR, nc, alpha, pc == 0 ? beta : 1.0f, a_panels);
        }
    }
}
