// Causal attention of one (query block, key/value block) pair, flash-attention style (Dao et
// al.): the softmax of each block is folded into the running (out, lse) with the log-sum-exp
// update, so ring attention (Liu et al.) can visit the key/value blocks one by one and plain
// attention is the ring of one. The backward recomputes probabilities from the final lse.
// Work goes in panels of the product's micro-tile rows (SGEMM_MR) of one head, each over the
// keys its own rows see: the scores of a panel stay in cache, its products are gemm.c's, and
// little of a causal block's future is computed. The backward sums dk and dv over tiles of
// TILE query rows, a few panels at a time.
#include "backend/backend.h"
#include "backend/kernel_time.h"
#include "backend/cpu/fast_exp.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/lanes.h"
#include "backend/cpu/scratch.h"
#include "utils.h"
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>

// Query rows per tile of the backward: a multiple of the product's micro-tile rows on every
// build (14 with AVX-512, 6 without), so that the tile is whole panels, and the same on every
// build, so that dk and dv sum the same tiles' terms: the same bits on an AVX2 CPU as on an
// AVX-512 one. (42 measured as fast as 56 and faster than 84.)
#define TILE 42
_Static_assert(TILE % SGEMM_MR == 0, "a tile of whole micro-tiles");

// The rows of the first of the panels that Tq rows are cut into, the rest `size` rows each: what
// is left over, Tq % size. A panel cut short costs as much as a whole one, and first it sees the
// fewest keys of a causal block (at seq 256, 4 rows over 32 keys, not 256). The backward's tiles
// start at row 0: their edges decide how dk and dv round, and so the bits a run trains to.
static int first_rows(int Tq, int size) {
    return Tq % size ? Tq % size : size;
}

static Scratch forward_scratch, backward_scratch; // the threads' scores and packed keys

// The keys [*j0, *j1) hold every key that some query of the tile sees: with ordered positions
// the future of the tile is skipped, which halves the work of a causal block.
static void visible_keys(int *j0, int *j1, const int *q_pos, int rows, const int *k_pos, int Tk) {
    int last = q_pos[0];
    for (int r = 1; r < rows; r++) last = q_pos[r] > last ? q_pos[r] : last;
    *j0 = 0, *j1 = Tk;
    while (*j0 < Tk && k_pos[*j0] > last) (*j0)++;
    while (*j1 > *j0 && k_pos[*j1 - 1] > last) (*j1)--;
}

// The keys a tile's products run over: [0, j1) and on to a whole tile of the product's columns.
// With ordered positions j0 is 0; a key before j0 or from j1 on is masked, its probability
// exactly 0, and computing it in a tile the product runs anyway costs nothing.
static int visible_width(int j1, int Tk) {
    int whole = (j1 + SGEMM_NR - 1) / SGEMM_NR * SGEMM_NR;
    return whole < Tk ? whole : Tk;
}

// the (query, key) pairs a causal block computes: key position at most the query's (for the
// kernel timing's FLOP count)
static double visible_pairs(const int *q_pos, const int *k_pos, int Tq, int Tk) {
    double pairs = 0;
    for (int i = 0; i < Tq; i++)
        for (int j = 0; j < Tk; j++) pairs += k_pos[j] <= q_pos[i];
    return pairs;
}

// q: (B, Tq, H, D)  k, v: (B, Tk, KV, D)  q_pos (Tq), k_pos (Tk)  out: (B, Tq, H, D)
// lse: (B, H, Tq), both running values merged with this block's softmax
// Parallel over (batch, kv head): the keys and values of one are packed for the products once,
// and serve every panel of every query head that shares them.
void attention_forward_block(float *out, float *lse, const float *q, const float *k, const float *v,
                             const int *q_pos, const int *k_pos, int B, int Tq, int Tk, int H,
                             int KV, int D) {
    KERNEL_TIME(KT_ATTENTION, 4.0 * D * B * H * visible_pairs(q_pos, k_pos, Tq, Tk), 0);
    float scale = 1.0f / sqrtf((float)D);
    int group = H / KV;
    size_t packed = sgemm_packed_floats(D, Tk) + sgemm_packed_floats(Tk, D);
    size_t per_thread = (size_t)SGEMM_MR * Tk + (size_t)SGEMM_MR * D + packed;
    float *scratch = scratch_floats(&forward_scratch, omp_get_max_threads() * per_thread);
    sgemm_reserve(omp_get_max_threads());
#pragma omp parallel
    {
        float *p = scratch + omp_get_thread_num() * per_thread; // (MR, Tk) scores, then probs
        float *o = p + (size_t)SGEMM_MR * Tk;                   // (MR, D) this block's output
        SgemmPacked kT = {o + (size_t)SGEMM_MR * D, D, Tk};     // k^T (D, Tk)
        SgemmPacked vp = {kT.panels + sgemm_packed_floats(D, Tk), Tk, D}; // v (Tk, D)
        float panel_lse[SGEMM_MR], panel_sum[SGEMM_MR];
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int b = 0; b < B; b++) {
            for (int g = 0; g < KV; g++) {
                sgemm_pack(kT, 1, k + ((size_t)b * Tk * KV + g) * D, KV * D);
                sgemm_pack(vp, 0, v + ((size_t)b * Tk * KV + g) * D, KV * D);
                for (int h = g * group; h < (g + 1) * group; h++) {
                    // each panel on its own: a query row's output is its own
                    for (int i0 = 0, rows = first_rows(Tq, SGEMM_MR); i0 < Tq;
                         i0 += rows, rows = SGEMM_MR) {
                        int j0, j1;
                        visible_keys(&j0, &j1, q_pos + i0, rows, k_pos, Tk);
                        if (j0 == j1) continue; // the whole block is in this panel's future
                        int nk = visible_width(j1, Tk);
                        const float *qt = q + (((size_t)b * Tq + i0) * H + h) * D;
                        // p (rows, nk) = scale * q_panel @ k^T
                        sgemm_packed(0, rows, nk, D, scale, qt, H * D, kT, 0.0f, p, nk);
                        // p = exp(p - rowmax) on the keys each query sees, 0 elsewhere
                        for (int r = 0; r < rows; r++) {
                            float *pr = p + (size_t)r * nk, m = -INFINITY;
                            int qp = q_pos[i0 + r];
#pragma omp simd reduction(max : m)
                            for (int j = 0; j < nk; j++) { // masked and the max in one pass
                                pr[j] = k_pos[j] > qp ? -INFINITY : pr[j];
                                m = pr[j] > m ? pr[j] : m;
                            }
                            if (m == -INFINITY) m = 0.0f; // no key for this row: all p are 0
                            // and their sum, in lanes.h's fixed lanes, in the same pass
                            float lane[SUM_LANES] = {0};
                            int j = 0;
                            for (; j + SUM_LANES <= nk; j += SUM_LANES)
                                for (int l = 0; l < SUM_LANES; l++)
                                    lane[l] += pr[j + l] = exp_approx(pr[j + l] - m);
                            for (; j < nk; j++)
                                lane[j % SUM_LANES] += pr[j] = exp_approx(pr[j] - m);
                            float sum = sum_lanes(lane);
                            panel_sum[r] = sum;
                            panel_lse[r] = sum > 0.0f ? m + logf(sum) : -INFINITY;
                        }
                        // o (rows, D) = p @ v, not yet divided by the row sums
                        sgemm_packed(0, rows, D, nk, 1.0f, p, nk, vp, 0.0f, o, D);
                        // merge: lse = log(exp(lse) + exp(lse_panel)), out = weighted mean of both
                        for (int r = 0; r < rows; r++) {
                            if (panel_lse[r] == -INFINITY) continue; // leaves (out, lse) as is
                            float *lse_i = lse + ((size_t)b * H + h) * Tq + i0 + r;
                            float top = fmaxf(*lse_i, panel_lse[r]);
                            float lse_new =
                                top + logf(expf(*lse_i - top) + expf(panel_lse[r] - top));
                            float w_old = expf(*lse_i - lse_new); // 0 while lse = -inf
                            float w_new = expf(panel_lse[r] - lse_new) / panel_sum[r];
                            float *oi = out + (((size_t)b * Tq + i0 + r) * H + h) * D;
                            const float *o_r = o + (size_t)r * D;
#pragma omp simd
                            for (int d = 0; d < D; d++) oi[d] = oi[d] * w_old + o_r[d] * w_new;
                            *lse_i = lse_new;
                        }
                    }
                }
            }
        }
    }
}

// delta (B, H, T) = rowsum(dout * out): the softmax backward's sum_j p_j dp_j, per query row
void attention_backward_delta(float *delta, const float *dout, const float *out, int B, int T,
                              int H, int D) {
    KERNEL_TIME(KT_ATTENTION, 0, 8.0 * B * T * H * D);
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < H; h++) {
                size_t row = (((size_t)b * T + t) * H + h) * D;
                const float *dr = dout + row, *outr = out + row;
                float lane[SUM_LANES] = {0}; // in fixed lanes: a vectorised sum would not fuse
                int d = 0;                   // the products as the scalar one does
                for (; d + SUM_LANES <= D; d += SUM_LANES)
                    for (int l = 0; l < SUM_LANES; l++) lane[l] += dr[d + l] * outr[d + l];
                for (; d < D; d++) lane[d % SUM_LANES] += dr[d] * outr[d];
                delta[((size_t)b * H + h) * T + t] = sum_lanes(lane);
            }
        }
    }
}

// Parallel over (batch, kv head): the query heads that share a kv head all add into its dk, dv,
// so they run on one thread; dq rows of different kv heads never overlap. The keys and values
// are packed once for the products that read them whole.
void attention_backward_block(float *dq, float *dk, float *dv, const float *dout, const float *q,
                              const float *k, const float *v, const float *lse, const float *delta,
                              const int *q_pos, const int *k_pos, int B, int Tq, int Tk, int H,
                              int KV, int D) {
    KERNEL_TIME(KT_ATTENTION, 8.0 * D * B * H * visible_pairs(q_pos, k_pos, Tq, Tk), 0);
    float scale = 1.0f / sqrtf((float)D);
    int group = H / KV;
    size_t packed = 2 * sgemm_packed_floats(D, Tk) + sgemm_packed_floats(Tk, D);
    size_t per_thread = 2 * (size_t)TILE * Tk + packed;
    float *scratch = scratch_floats(&backward_scratch, omp_get_max_threads() * per_thread);
    sgemm_reserve(omp_get_max_threads());
#pragma omp parallel
    {
        float *p = scratch + omp_get_thread_num() * per_thread; // (TILE, Tk) probabilities
        float *ds = p + (size_t)TILE * Tk;                      // (TILE, Tk) score gradients
        SgemmPacked kT = {ds + (size_t)TILE * Tk, D, Tk};       // k^T (D, Tk)
        SgemmPacked vT = {kT.panels + sgemm_packed_floats(D, Tk), D, Tk}; // v^T (D, Tk)
        SgemmPacked kp = {vT.panels + sgemm_packed_floats(D, Tk), Tk, D}; // k (Tk, D)
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int b = 0; b < B; b++) {
            for (int g = 0; g < KV; g++) {
                size_t kv0 = ((size_t)b * Tk * KV + g) * D; // key 0 of this kv head
                sgemm_pack(kT, 1, k + kv0, KV * D);
                sgemm_pack(vT, 1, v + kv0, KV * D);
                sgemm_pack(kp, 0, k + kv0, KV * D);
                for (int h = g * group; h < (g + 1) * group; h++) {
                    for (int t0 = 0; t0 < Tq; t0 += TILE) {
                        int t_rows = Tq - t0 < TILE ? Tq - t0 : TILE;
                        int j0, j1;
                        visible_keys(&j0, &j1, q_pos + t0, t_rows, k_pos, Tk);
                        if (j0 == j1) continue;
                        int nk = visible_width(j1, Tk); // the tile's keys: p, ds (t_rows, nk)
                        // each panel's rows over the keys they see; beyond, p and ds are 0
                        for (int i0 = t0, rows = first_rows(t_rows, SGEMM_MR); i0 < t0 + t_rows;
                             i0 += rows, rows = SGEMM_MR) {
                            visible_keys(&j0, &j1, q_pos + i0, rows, k_pos, Tk);
                            int np = j0 == j1 ? 0 : visible_width(j1, Tk);
                            float *p_i = p + (size_t)(i0 - t0) * nk,
                                  *ds_i = ds + (size_t)(i0 - t0) * nk;
                            size_t qrow = (((size_t)b * Tq + i0) * H + h) * D;
                            const float *lse_i = lse + ((size_t)b * H + h) * Tq + i0;
                            const float *delta_i = delta + ((size_t)b * H + h) * Tq + i0;
                            // forward: p = exp(scale * q @ k^T - lse) on the keys a query sees
                            sgemm_packed(0, rows, np, D, scale, q + qrow, H * D, kT, 0.0f, p_i, nk);
                            // forward: out = p @ v  =>  dp = dout @ v^T
                            sgemm_packed(0, rows, np, D, 1.0f, dout + qrow, H * D, vT, 0.0f, ds_i,
                                         nk);
                            for (int r = 0; r < rows; r++) {
                                float *pr = p_i + (size_t)r * nk, *dsr = ds_i + (size_t)r * nk;
                                // a row that saw no key at all (lse = -inf) has no gradient
                                float lse_r = lse_i[r], delta_r = delta_i[r];
                                int qp = lse_r > -INFINITY ? q_pos[i0 + r] : INT_MIN;
                                // softmax backward: ds = p * (dp - delta), times scale for q @ k^T
#pragma omp simd
                                for (int j = 0; j < np; j++) {
                                    pr[j] = k_pos[j] > qp ? 0.0f : exp_approx(pr[j] - lse_r);
                                    dsr[j] = pr[j] * (dsr[j] - delta_r) * scale;
                                }
                                for (int j = np; j < nk; j++) pr[j] = dsr[j] = 0.0f;
                            }
                            // forward: s = q @ k^T  =>  dq += ds @ k
                            sgemm_packed(0, rows, D, np, 1.0f, ds_i, nk, kp, 1.0f, dq + qrow,
                                         H * D);
                        }
                        // dv (nk, D) += p^T @ dout, dk += ds^T @ q: the tile's rows summed
                        size_t qrow = (((size_t)b * Tq + t0) * H + h) * D;
                        sgemm(1, 0, nk, D, t_rows, 1.0f, p, nk, dout + qrow, H * D, 1.0f, dv + kv0,
                              KV * D);
                        sgemm(1, 0, nk, D, t_rows, 1.0f, ds, nk, q + qrow, H * D, 1.0f, dk + kv0,
                              KV * D);
                    }
                }
            }
        }
    }
}
