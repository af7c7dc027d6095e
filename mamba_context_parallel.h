// Context parallelism for the Mamba mixer (mamba_context_parallel.c): the sequence split over the
// cp ranks in order, rank k holding tokens [k*T, (k+1)*T) of every sequence.
#pragma once
#include "backend/comm.h"
#include "mamba.h"

struct MambaContextParallel {
    Group *group;    // the cp ranks, in sequence order
    float *gathered; // (cp, 2, B, I, S) device: each rank's state and decay product
    float *host;     // (cp + 1, 2, B, I, S) the same on the host, and the fold's result
    float *halo;     // (cp, B, W-1, I) device: each rank's last W-1 tokens of xi, or their grads
    float *ext[4];   // (B, T+W-1, I) device: the conv over the halo and the chunk, its in/outs
    float *dummy;    // (I*S + 2I) device: the first backward pass's parameter grads, discarded
    float *g_last;   // (B, I, S) device: the gradient the later chunks send to the last state
    void *memory, *host_memory;
};

// cp's buffers for a layer of sizes s (s->cp is set to it)
void mamba_cp_alloc(MambaContextParallel *cp, Group *group, MambaSizes *s);
void mamba_cp_free(MambaContextParallel *cp);
size_t mamba_cp_bytes(const MambaSizes *s); // the device bytes mamba_cp_alloc takes
// a->u, a->pre = silu(conv(xi)) of this chunk, its first W-1 tokens seeing the previous chunk's
// last (a->halo keeps them)
void mamba_cp_conv_forward(MambaActivations *a, const MambaWeights *w, const MambaSizes *s);
// g->dxi WRITTEN, the weights' += as causal_conv1d_backward's, and the halo's gradient added to
// the previous chunk's dxi
void mamba_cp_conv_backward(MambaGrads *g, const MambaWeights *dw, const MambaActivations *a,
                            const MambaWeights *w, const MambaSizes *s);
// a->y = the scan of this chunk from the state the earlier chunks hand over (a->h_in)
void mamba_cp_scan_forward(MambaActivations *a, const MambaWeights *w, const MambaSizes *s);
// selective_scan_backward's outputs, with the gradient the later chunks hand back to this
// chunk's last state
void mamba_cp_scan_backward(MambaGrads *g, const MambaWeights *dw, const MambaActivations *a,
                            const MambaWeights *w, const MambaSizes *s);
