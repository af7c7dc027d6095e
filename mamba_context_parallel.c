// Context parallelism for the Mamba mixer: the sequence split over the cp ranks in order, and the
// scan's state passed between them. Neither nanotron nor Megatron-LM's Mamba-1 path does this; the
// argument is short.
//
// The scan is linear in its state. Per channel and state, h_t = a_t h_{t-1} + b_t with
// a_t = exp(delta_t A) and b_t = delta_t B_t u_t, so a chunk's last state from an incoming h_in is
//     h_last = h_loc + P * h_in,   h_loc: the chunk's scan from a zero state, P = prod_t a_t,
// and P = exp(A * sum_t delta_t). Rank k needs h_in(k) = h_last(k-1), which is the fold, in rank
// order, of the earlier ranks' (h_loc, P): h = 0; for j < k: h = P_j * h + h_loc_j. So each rank
// scans its chunk from zero (selective_scan_chunk_forward gives h_loc and P), the ranks all-gather
// their pairs (2*B*I*S floats each), each folds the earlier ones into its h_in, and scans its chunk
// again from h_in for its outputs: every rank works at once, and the exchange is one small
// all-gather per layer instead of a chain through the ranks.
//
// The backward is the same argument transposed. The gradient reaching this chunk's first state
// (the state before it, h_in) is d h_in(k) = d_loc(k) + P_k * G_k, where d_loc(k) comes from this
// chunk's own outputs (a reverse scan with no gradient from later) and G_k is the gradient later
// chunks send back to its last state: G_k = d h_in(k+1), so G_{cp-1} = 0 and the ranks fold the
// all-gathered (d_loc, P) in reverse rank order: G = 0; for j from cp-1 down to k+1:
// G = d_loc_j + P_j * G. A second reverse scan from h_in with G_k arriving at the last state gives
// every gradient (the first pass's parameter gradients go to a scratch buffer). The recurrence for
// g never reads h, so the first pass needs no h_in of its own beyond the saved one.
//
// The conv mixes a channel's last W tokens, so a chunk's first W-1 outputs need the previous
// chunk's last W-1 inputs: the ranks all-gather their tails, each convolves [halo, chunk] and keeps
// the chunk's outputs; in the backward the halo rows' input gradient is all-gathered back and added
// to the previous chunk's tail. cp = 1 never comes here. Zig-zag chunks are refused (config.c).
#include "mamba_context_parallel.h"
#include "backend/backend.h"
#include "utils.h"

static size_t state_floats(const MambaSizes *s) {
    return (size_t)s->B * s->I * s->S;
}

static size_t device_layout(MambaContextParallel *cp, char *base, const MambaSizes *s, int size) {
    size_t o = 0, f = sizeof(float), H = s->W - 1, ext = (size_t)s->B * (s->T + H) * s->I;
    cp->gathered = layout_piece(base, &o, 2 * size * state_floats(s) * f);
    cp->halo = layout_piece(base, &o, (size_t)size * s->B * H * s->I * f);
    for (int i = 0; i < 4; i++) cp->ext[i] = layout_piece(base, &o, ext * f);
    cp->dummy = layout_piece(base, &o, ((size_t)s->I * s->S + 2 * s->I) * f);
    cp->g_last = layout_piece(base, &o, state_floats(s) * f);
    return o;
}

size_t mamba_cp_bytes(const MambaSizes *s) {
    MambaContextParallel cp;
    return device_layout(&cp, NULL, s, s->cp ? s->cp->group->size : 1);
}

void mamba_cp_alloc(MambaContextParallel *cp, Group *group, MambaSizes *s) {
    cp->group = group;
    s->cp = cp;
    cp->memory = device_malloc(mamba_cp_bytes(s));
    device_layout(cp, cp->memory, s, group->size);
    cp->host = cp->host_memory = xmalloc(2 * (group->size + 1) * state_floats(s) * sizeof(float));
}

void mamba_cp_free(MambaContextParallel *cp) {
    device_free(cp->memory);
    free(cp->host_memory);
}

// dst (B, rows, I) rows [d0, d0+n) of each sequence = src (B, src_rows, I) rows [s0, s0+n)
static void copy_rows(float *dst, int dst_rows, int d0, const float *src, int src_rows, int s0,
                      int n, const MambaSizes *s) {
    for (int b = 0; b < s->B; b++)
        device_copy(dst + ((size_t)b * dst_rows + d0) * s->I,
                    src + ((size_t)b * src_rows + s0) * s->I, (size_t)n * s->I * sizeof(float));
}

static void zero_rows(float *dst, int dst_rows, int d0, int n, const MambaSizes *s) {
    for (int b = 0; b < s->B; b++)
        device_zero(dst + ((size_t)b * dst_rows + d0) * s->I, (size_t)n * s->I * sizeof(float));
}

void mamba_cp_conv_forward(MambaActivations *a, const MambaWeights *w, const MambaSizes *s) {
    MambaContextParallel *cp = s->cp;
    int k = cp->group->rank, H = s->W - 1, T = s->T, TE = T + H;
    size_t piece = (size_t)s->B * H * s->I;
    // every rank's last H tokens of xi; this rank's halo is the previous rank's (zeros on rank 0)
    copy_rows(cp->halo + k * piece, H, 0, a->xi, T, T - H, H, s);
    all_gather(cp->halo, cp->group->size * piece, cp->group);
    if (k > 0)
        device_copy(a->halo, cp->halo + (k - 1) * piece, piece * sizeof(float));
    else
        device_zero(a->halo, piece * sizeof(float));
    // u, pre = the chunk's rows of conv([halo, xi])
    float *xi_ext = cp->ext[0], *u_ext = cp->ext[1], *pre_ext = cp->ext[2];
    copy_rows(xi_ext, TE, 0, a->halo, H, 0, H, s);
    copy_rows(xi_ext, TE, H, a->xi, T, 0, T, s);
    causal_conv1d_forward(u_ext, pre_ext, xi_ext, w->conv1d_weight, w->conv1d_bias, s->B, TE, s->I,
                          s->W);
    copy_rows(a->u, T, 0, u_ext, TE, H, T, s);
    copy_rows(a->pre, T, 0, pre_ext, TE, H, T, s);
}

void mamba_cp_conv_backward(MambaGrads *g, const MambaWeights *dw, const MambaActivations *a,
                            const MambaWeights *w, const MambaSizes *s) {
    MambaContextParallel *cp = s->cp;
    int k = cp->group->rank, H = s->W - 1, T = s->T, TE = T + H;
    size_t piece = (size_t)s->B * H * s->I;
    float *xi_ext = cp->ext[0], *du_ext = cp->ext[1], *pre_ext = cp->ext[2], *dxi_ext = cp->ext[3];
    // the halo rows' outputs are the previous chunk's: no gradient here (and pre 0 there)
    copy_rows(xi_ext, TE, 0, a->halo, H, 0, H, s);
    copy_rows(xi_ext, TE, H, a->xi, T, 0, T, s);
    zero_rows(du_ext, TE, 0, H, s);
    copy_rows(du_ext, TE, H, g->du, T, 0, T, s);
    zero_rows(pre_ext, TE, 0, H, s);
    copy_rows(pre_ext, TE, H, a->pre, T, 0, T, s);
    // forward: u, pre = the chunk's rows of silu(conv([halo, xi]))
    causal_conv1d_backward(dxi_ext, dw->conv1d_weight, dw->conv1d_bias, du_ext, xi_ext, pre_ext,
                           w->conv1d_weight, s->B, TE, s->I, s->W);
    copy_rows(g->dxi, T, 0, dxi_ext, TE, H, T, s);
    // the halo's gradient belongs to the previous rank's last H tokens: every rank's, gathered
    copy_rows(cp->halo + k * piece, H, 0, dxi_ext, TE, 0, H, s);
    all_gather(cp->halo, cp->group->size * piece, cp->group);
    if (k + 1 < cp->group->size)
        for (int b = 0; b < s->B; b++)
            add_inplace(g->dxi + ((size_t)b * T + T - H) * s->I,
                        cp->halo + (k + 1) * piece + (size_t)b * H * s->I, (size_t)H * s->I);
}

// host h (n) = fold of the gathered pairs (j: x_j then P_j) over the ranks from `from` stepping
// `step` while j != to: h = P_j * h + x_j
static void fold(float *h, const float *pairs, int from, int to, int step, size_t n) {
    for (size_t e = 0; e < n; e++) h[e] = 0.0f;
    for (int j = from; j != to; j += step) {
        const float *x = pairs + 2 * (size_t)j * n, *P = x + n;
        for (size_t e = 0; e < n; e++) h[e] = P[e] * h[e] + x[e];
    }
}

// all-gathers every rank's pair (this rank's already in place), then folds them on the host into
// dst (device)
static void exchange_and_fold(float *dst, const MambaSizes *s, int from, int to, int step) {
    MambaContextParallel *cp = s->cp;
    size_t n = state_floats(s), size = cp->group->size;
    all_gather(cp->gathered, 2 * size * n, cp->group);
    device_to_host(cp->host, cp->gathered, 2 * size * n * sizeof(float));
    float *h = cp->host + 2 * size * n;
    fold(h, cp->host, from, to, step, n);
    host_to_device(dst, h, n * sizeof(float));
}

void mamba_cp_scan_forward(MambaActivations *a, const MambaWeights *w, const MambaSizes *s) {
    MambaContextParallel *cp = s->cp;
    int k = cp->group->rank;
    size_t n = state_floats(s);
    float *h_loc = cp->gathered + 2 * k * n;
    // from a zero state: the chunk's own last state h_loc and its decay P (a->y is rewritten)
    selective_scan_chunk_forward(a->y, a->u, a->dt, w->dt_proj_bias, w->A_log, a->Bm, a->Cm, w->D,
                                 s->B, s->T, s->I, s->S, NULL, h_loc, a->decay);
    device_copy(h_loc + n, a->decay, n * sizeof(float));
    // h_in = the earlier ranks' pairs folded in rank order
    exchange_and_fold(a->h_in, s, 0, k, 1);
    // y = the chunk's scan from h_in
    selective_scan_chunk_forward(a->y, a->u, a->dt, w->dt_proj_bias, w->A_log, a->Bm, a->Cm, w->D,
                                 s->B, s->T, s->I, s->S, a->h_in, NULL, NULL);
}

void mamba_cp_scan_backward(MambaGrads *g, const MambaWeights *dw, const MambaActivations *a,
                            const MambaWeights *w, const MambaSizes *s) {
    MambaContextParallel *cp = s->cp;
    int k = cp->group->rank, size = cp->group->size, I = s->I, S = s->S;
    size_t n = state_floats(s);
    float *d_loc = cp->gathered + 2 * k * n;
    float *dummy_bias = cp->dummy, *dummy_A = dummy_bias + I, *dummy_D = dummy_A + (size_t)I * S;
    // pass 1: the gradient this chunk's own outputs send to h_in (parameter gradients discarded)
    selective_scan_chunk_backward(g->du, g->ddt, g->dBm, g->dCm, dummy_bias, dummy_A, dummy_D,
                                  g->dy, a->u, a->dt, w->dt_proj_bias, w->A_log, a->Bm, a->Cm, w->D,
                                  s->B, s->T, I, S, a->h_in, NULL, d_loc);
    device_copy(d_loc + n, a->decay, n * sizeof(float));
    // G = what the later ranks send back to this chunk's last state, folded in reverse order
    exchange_and_fold(cp->g_last, s, size - 1, k, -1);
    // pass 2: every gradient, with G arriving at the last state
    selective_scan_chunk_backward(g->du, g->ddt, g->dBm, g->dCm, dw->dt_proj_bias, dw->A_log, dw->D,
                                  g->dy, a->u, a->dt, w->dt_proj_bias, w->A_log, a->Bm, a->Cm, w->D,
                                  s->B, s->T, I, S, a->h_in, cp->g_last, NULL);
}
