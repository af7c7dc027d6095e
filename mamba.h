// The Mamba mixer: the selective state space block of Mamba-1 (Gu and Dao 2023, "Mamba:
// Linear-Time Sequence Modeling with Selective State Spaces"; Hugging Face transformers'
// MambaMixer), forward and backward by hand. It stands where a decoder layer's attention and MLP
// stand: y (B, T, C) from x (B, T, C), the layer's RMSNorm and residual being the caller's.
// Size letters: B batch, T tokens, C hidden, I d_inner (transformers' intermediate_size, expand *
// C), S state size, R dt rank (time_step_rank), W the conv's width (conv_kernel). Every tensor
// lives on the device; this file only passes pointers.
#pragma once
#include <stddef.h>
#include "tensor_parallel.h"

// Tensor parallelism (tp set: model_mamba.c): I is this rank's share of the channels, and x_proj
// and out_proj, which sum over the channels, are row-parallel: their outputs are all-reduced over
// tp in the forward, and the gradients of x_proj's outputs before its backward. in_proj's input
// gradient is a partial sum too: the caller sums it (dx +=, so the caller owns it).
typedef struct MambaContextParallel MambaContextParallel; // mamba_context_parallel.h
typedef struct {
    int B, T, C, I, S, R, W;
    int N;                    // B * T tokens
    TensorParallel *tp;       // NULL: every channel on this rank
    MambaContextParallel *cp; // NULL: the whole sequence on this rank; else chunk cp rank of it
} MambaSizes;

MambaSizes mamba_sizes(int B, int T, int C, int I, int S, int R, int W);

// one layer's mixer tensors, transformers' backbone.layers.N.mixer.*, in a parameter buffer or
// in its gradient buffer
typedef struct {
    float *in_proj;        // (2I, C): rows [0, I) make x, rows [I, 2I) the gate z
    float *conv1d_weight;  // (I, W): transformers' conv1d.weight (I, 1, W)
    float *conv1d_bias;    // (I), or NULL when use_conv_bias is false
    float *x_proj;         // (R + 2S, I): rows [0, R) make dt's low rank, [R, R+S) B, [R+S, R+2S) C
    float *dt_proj_weight; // (I, R)
    float *dt_proj_bias;   // (I)
    float *A_log;          // (I, S): A = -exp(A_log)
    float *D;              // (I): the skip connection
    float *out_proj;       // (C, I)
} MambaWeights;

// The mixer's tensors by transformers' names (mixer.<name>), in the order of MambaWeights' fields:
// a parameter table, a checkpoint or a fixture lists them so, and mamba_weights_point maps such a
// list of MAMBA_TENSORS pointers (no conv bias: NULL at index 2) onto the struct
#define MAMBA_TENSORS 9
extern const char *const mamba_tensor_names[MAMBA_TENSORS];
void mamba_tensor_sizes(size_t sizes[MAMBA_TENSORS], const MambaSizes *s); // elements of each
MambaWeights mamba_weights_point(float *const t[MAMBA_TENSORS]);

// What the forward saves for the backward (one micro-batch)
typedef struct {
    float *xi, *z;    // (N, I): in_proj's two halves, the conv's input and the gate
    float *pre, *u;   // (N, I): the conv's output before and after SiLU; u is the scan's input
    float *dt_low;    // (N, R): x_proj's first R columns, dt_proj's input
    float *Bm, *Cm;   // (N, S): the input-dependent B and C
    float *dt;        // (N, I): dt_proj's output, delta before its bias and softplus
    float *y, *gated; // (N, I): the scan's output, and y * silu(z), out_proj's input
    // context parallelism only (cp set): the previous chunk's last W-1 tokens of xi (B, W-1, I);
    // the state entering this chunk, and the chunk's decay product (B, I, S)
    float *halo, *h_in, *decay;
    void *memory; // the one device allocation (mamba_activations_alloc's), or NULL
} MambaActivations;

// The backward's buffers, which any number of saved micro-batches can share
typedef struct {
    float *dgated, *dy, *dz; // (N, I)
    float *du, *ddt, *dxi;   // (N, I)
    float *ddt_low;          // (N, R)
    float *dBm, *dCm;        // (N, S)
    void *memory;
} MambaGrads;

size_t mamba_activations_bytes(const MambaSizes *s);
// a laid out over memory, the caller's (mamba_activations_bytes of it, the model's slots)
void mamba_activations_place(MambaActivations *a, void *memory, const MambaSizes *s);
void mamba_activations_alloc(MambaActivations *a, const MambaSizes *s);
void mamba_activations_free(MambaActivations *a);
size_t mamba_grads_bytes(const MambaSizes *s);
void mamba_grads_alloc(MambaGrads *g, const MambaSizes *s);
void mamba_grads_free(MambaGrads *g);

// y (N, C) = the mixer of x (N, C); fills a for the backward. y may not be x's buffer (the
// backward reads x).
void mamba_forward(float *y, MambaActivations *a, const float *x, const MambaWeights *w,
                   const MambaSizes *s);
// dx (N, C) += and every tensor of dw += the gradient of sum(y * dy); a from mamba_forward on x
void mamba_backward(float *dx, const MambaWeights *dw, MambaGrads *g, const float *dy,
                    const MambaActivations *a, const float *x, const MambaWeights *w,
                    const MambaSizes *s);
