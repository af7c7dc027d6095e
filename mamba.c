// The Mamba mixer, Mamba-1's selective state space block, forward and backward by hand.
//
// forward, for N = B*T tokens x (N, C):
//   in_proj:  xi = x @ W_in[0:I]^T, z = x @ W_in[I:2I]^T                  (N, I) each
//   conv:     u = silu(causal depthwise conv1d(xi)): each channel mixes its last W tokens, the
//             only place where a token sees its neighbours before the scan
//   x_proj:   dt_low = u @ W_x[0:R]^T (N, R); B = u @ W_x[R:R+S]^T, C = u @ W_x[R+S:R+2S]^T (N, S)
//   dt_proj:  dt = dt_low @ W_dt^T (N, I); delta = softplus(dt + dt_bias) inside the scan
//   scan:     h_t = exp(delta_t A) h_{t-1} + delta_t B_t u_t, y_t = C_t . h_t + D u_t, per channel
//             (backend/*/mamba.*: selective_scan_forward), A = -exp(A_log)
//   gate:     gated = y * silu(z)                                         (swiglu_forward)
//   out_proj: out = gated @ W_out^T                                       (N, C)
// What makes it selective is that delta, B and C are functions of the token (x_proj of u): S4
// had them fixed, so its recurrence was a convolution; here the model chooses per token how much
// to remember (delta) and what to write and read (B, C), and the recurrence must be scanned.
// transformers splits in_proj's and x_proj's outputs with chunk and split; here each part is its
// own product with a slice of the weight's rows, so every activation is a contiguous tensor.
// The backward runs these lines in reverse, each named above the call that differentiates it.
#include "mamba.h"
#include "mamba_context_parallel.h"
#include "backend/backend.h"
#include "utils.h"

MambaSizes mamba_sizes(int B, int T, int C, int I, int S, int R, int W) {
    if (B < 1 || T < 1 || C < 1 || I < 1 || S < 1 || R < 1 || W < 1)
        FAIL("a Mamba layer needs positive sizes", "mamba: B=%d T=%d C=%d I=%d S=%d R=%d W=%d", B,
             T, C, I, S, R, W);
    return (MambaSizes){.B = B, .T = T, .C = C, .I = I, .S = S, .R = R, .W = W, .N = B * T};
}

const char *const mamba_tensor_names[MAMBA_TENSORS] = {
    "in_proj.weight", "conv1d.weight", "conv1d.bias", "x_proj.weight",  "dt_proj.weight",
    "dt_proj.bias",   "A_log",         "D",           "out_proj.weight"};

void mamba_tensor_sizes(size_t sizes[MAMBA_TENSORS], const MambaSizes *s) {
    size_t C = s->C, I = s->I, S = s->S, R = s->R, W = s->W;
    size_t n[MAMBA_TENSORS] = {2 * I * C, I * W, I, (R + 2 * S) * I, I * R, I, I * S, I, C * I};
    for (int i = 0; i < MAMBA_TENSORS; i++) sizes[i] = n[i];
}

MambaWeights mamba_weights_point(float *const t[MAMBA_TENSORS]) {
    return (MambaWeights){.in_proj = t[0],
                          .conv1d_weight = t[1],
                          .conv1d_bias = t[2],
                          .x_proj = t[3],
                          .dt_proj_weight = t[4],
                          .dt_proj_bias = t[5],
                          .A_log = t[6],
                          .D = t[7],
                          .out_proj = t[8]};
}

static size_t activations_layout(MambaActivations *a, char *base, const MambaSizes *s) {
    size_t NI = (size_t)s->N * s->I * sizeof(float), o = 0;
    size_t NR = (size_t)s->N * s->R * sizeof(float), NS = (size_t)s->N * s->S * sizeof(float);
    a->xi = layout_piece(base, &o, NI), a->z = layout_piece(base, &o, NI);
    a->pre = layout_piece(base, &o, NI), a->u = layout_piece(base, &o, NI);
    a->dt_low = layout_piece(base, &o, NR);
    a->Bm = layout_piece(base, &o, NS), a->Cm = layout_piece(base, &o, NS);
    a->dt = layout_piece(base, &o, NI);
    a->y = layout_piece(base, &o, NI), a->gated = layout_piece(base, &o, NI);
    a->halo = a->h_in = a->decay = NULL;
    if (s->cp) { // mamba_context_parallel.c's
        size_t state = (size_t)s->B * s->I * s->S * sizeof(float);
        a->halo = layout_piece(base, &o, (size_t)s->B * (s->W - 1) * s->I * sizeof(float));
        a->h_in = layout_piece(base, &o, state), a->decay = layout_piece(base, &o, state);
    }
    return o;
}

size_t mamba_activations_bytes(const MambaSizes *s) {
    MambaActivations a;
    return activations_layout(&a, NULL, s);
}

void mamba_activations_place(MambaActivations *a, void *memory, const MambaSizes *s) {
    activations_layout(a, memory, s);
    a->memory = NULL; // the caller's
}

void mamba_activations_alloc(MambaActivations *a, const MambaSizes *s) {
    void *memory = device_malloc(mamba_activations_bytes(s));
    mamba_activations_place(a, memory, s);
    a->memory = memory;
}

void mamba_activations_free(MambaActivations *a) {
    device_free(a->memory);
}

static size_t grads_layout(MambaGrads *g, char *base, const MambaSizes *s) {
    size_t NI = (size_t)s->N * s->I * sizeof(float), o = 0;
    size_t NR = (size_t)s->N * s->R * sizeof(float), NS = (size_t)s->N * s->S * sizeof(float);
    g->dgated = layout_piece(base, &o, NI), g->dy = layout_piece(base, &o, NI);
    g->dz = layout_piece(base, &o, NI), g->du = layout_piece(base, &o, NI);
    g->ddt = layout_piece(base, &o, NI), g->dxi = layout_piece(base, &o, NI);
    g->ddt_low = layout_piece(base, &o, NR);
    g->dBm = layout_piece(base, &o, NS), g->dCm = layout_piece(base, &o, NS);
    return o;
}

size_t mamba_grads_bytes(const MambaSizes *s) {
    MambaGrads g;
    return grads_layout(&g, NULL, s);
}

void mamba_grads_alloc(MambaGrads *g, const MambaSizes *s) {
    g->memory = device_malloc(mamba_grads_bytes(s));
    grads_layout(g, g->memory, s);
}

void mamba_grads_free(MambaGrads *g) {
    device_free(g->memory);
}

// out (N, OC) = u (N, I) @ W (OC, I)^T, a sum over the channels: over every tp rank's when they
// are split (tensor_parallel.c's row-parallel linear, whose all-reduce completes it)
// out_proj's output joins the residual stream: tensor_parallel.c's row-parallel linear, whose
// sum leaves it as the stream is held (reduce-scattered under sequence parallelism); x_proj's
// outputs stay inside the mixer, where every tp rank needs all N tokens of them: all-reduced
static void channel_sum_forward(float *out, const float *u, const float *W, int OC, int to_stream,
                                const MambaSizes *s) {
    if (s->tp && to_stream) {
        row_parallel_linear_forward(s->tp, out, u, W, s->N, s->I, OC);
        return;
    }
    matmul_forward(out, u, W, s->N, s->I, OC);
    if (s->tp) all_reduce(out, (size_t)s->N * OC, REDUCE_SUM, s->tp->group);
}

void mamba_forward(float *y, MambaActivations *a, const float *x, const MambaWeights *w,
                   const MambaSizes *s) {
    int B = s->B, T = s->T, N = s->N, C = s->C, I = s->I, S = s->S, R = s->R;
    const float *W_B = w->x_proj + (size_t)R * I, *W_C = W_B + (size_t)S * I;
    // in_proj: xi = x @ W_in[0:I]^T, z = x @ W_in[I:2I]^T
    matmul_forward(a->xi, x, w->in_proj, N, C, I);
    matmul_forward(a->z, x, w->in_proj + (size_t)I * C, N, C, I);
    // conv: u = silu(conv1d(xi))
    if (s->cp) // the previous chunk's last W-1 tokens first (mamba_context_parallel.c)
        mamba_cp_conv_forward(a, w, s);
    else
        causal_conv1d_forward(a->u, a->pre, a->xi, w->conv1d_weight, w->conv1d_bias, B, T, I, s->W);
    // x_proj: dt_low, B, C = u @ W_x[rows]^T
    channel_sum_forward(a->dt_low, a->u, w->x_proj, R, 0, s);
    channel_sum_forward(a->Bm, a->u, W_B, S, 0, s);
    channel_sum_forward(a->Cm, a->u, W_C, S, 0, s);
    // dt_proj: dt = dt_low @ W_dt^T (its bias and the softplus are the scan's first line)
    matmul_forward(a->dt, a->dt_low, w->dt_proj_weight, N, R, I);
    // scan: y = selective_scan(u, delta = softplus(dt + dt_bias), A = -exp(A_log), B, C, D)
    if (s->cp) // from the state the earlier chunks hand over (mamba_context_parallel.c)
        mamba_cp_scan_forward(a, w, s);
    else
        selective_scan_forward(a->y, a->u, a->dt, w->dt_proj_bias, w->A_log, a->Bm, a->Cm, w->D, B,
                               T, I, S);
    // gate: gated = silu(z) * y
    swiglu_forward(a->gated, a->z, a->y, (size_t)N * I);
    // out_proj: out = gated @ W_out^T
    channel_sum_forward(y, a->gated, w->out_proj, C, 1, s);
}

void mamba_backward(float *dx, const MambaWeights *dw, MambaGrads *g, const float *dy,
                    const MambaActivations *a, const float *x, const MambaWeights *w,
                    const MambaSizes *s) {
    int B = s->B, T = s->T, N = s->N, C = s->C, I = s->I, S = s->S, R = s->R;
    size_t xB = (size_t)R * I, xC = xB + (size_t)S * I; // B's and C's rows of x_proj
    // forward: out = gated @ W_out^T
    matmul_backward_write(g->dgated, dw->out_proj, dy, a->gated, w->out_proj, N, I, C);
    // forward: gated = silu(z) * y (dz and dy written)
    swiglu_backward(g->dz, g->dy, g->dgated, a->z, a->y, (size_t)N * I);
    // forward: y = selective_scan(u, dt, ...): the reverse scan writes du, ddt, dB, dC and adds
    // into dt_bias, A_log and D
    if (s->cp) // and the gradient the later chunks hand back (mamba_context_parallel.c)
        mamba_cp_scan_backward(g, dw, a, w, s);
    else
        selective_scan_backward(g->du, g->ddt, g->dBm, g->dCm, dw->dt_proj_bias, dw->A_log, dw->D,
                                g->dy, a->u, a->dt, w->dt_proj_bias, w->A_log, a->Bm, a->Cm, w->D,
                                B, T, I, S);
    // forward: dt = dt_low @ W_dt^T
    matmul_backward_write(g->ddt_low, dw->dt_proj_weight, g->ddt, a->dt_low, w->dt_proj_weight, N,
                          R, I);
    // forward: dt_low, B, C summed over the tp ranks' channels: the gradients this rank's
    // channels gave them (dt_proj's, the scan's) are partial, and sum first
    if (s->tp) {
        all_reduce(g->ddt_low, (size_t)N * R, REDUCE_SUM, s->tp->group);
        all_reduce(g->dBm, (size_t)N * S, REDUCE_SUM, s->tp->group);
        all_reduce(g->dCm, (size_t)N * S, REDUCE_SUM, s->tp->group);
    }
    // forward: dt_low, B, C = u @ W_x[rows]^T: u's gradient gathers all three, after the scan's
    matmul_backward(g->du, dw->x_proj, g->ddt_low, a->u, w->x_proj, N, I, R);
    matmul_backward(g->du, dw->x_proj + xB, g->dBm, a->u, w->x_proj + xB, N, I, S);
    matmul_backward(g->du, dw->x_proj + xC, g->dCm, a->u, w->x_proj + xC, N, I, S);
    // forward: u = silu(conv1d(xi)) (dxi written)
    if (s->cp)
        mamba_cp_conv_backward(g, dw, a, w, s);
    else
        causal_conv1d_backward(g->dxi, dw->conv1d_weight, dw->conv1d_bias, g->du, a->xi, a->pre,
                               w->conv1d_weight, B, T, I, s->W);
    // forward: xi = x @ W_in[0:I]^T, z = x @ W_in[I:2I]^T
    matmul_backward(dx, dw->in_proj, g->dxi, x, w->in_proj, N, C, I);
    matmul_backward(dx, dw->in_proj + (size_t)I * C, g->dz, x, w->in_proj + (size_t)I * C, N, C, I);
}
