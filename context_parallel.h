// Context parallelism: ring attention over the sequence split (see context_parallel.c).
#pragma once
#include "backend/comm.h"

typedef struct {
    Group *cp;
    int B, T, H, KV, D; // T: tokens this rank holds; H, KV: this tp rank's heads
    int zigzag;
    int *positions_host;  // (cp, T): global position of each rank's tokens
    const int *positions; // the same on the device
    float *ring[2];       // (4, B, T, KV*D): k, v, then dk, dv, travelling the ring (cp > 1)
    float *delta;         // (B, H, T)
    long blocks_computed; // attention blocks run (skipped ones are not counted)
} RingAttention;

// pos (T = S/cp) = the global positions rank cp_rank holds of a sequence of S tokens: the
// loader picks these tokens, the model rotates them by these positions
void context_parallel_positions(int *pos, int cp_rank, int cp, int S, int zigzag);

void ring_attention_init(RingAttention *ra, Group *cp, int B, int S, int H, int KV, int D,
                         int zigzag);
void ring_attention_free(RingAttention *ra);
// out (B, T, H, D), lse (B, H, T); q (B, T, H, D); kv (2, B, T, KV, D): k then v
void ring_attention_forward(float *out, float *lse, const float *q, const float *kv,
                            RingAttention *ra);
// dq (B, T, H, D) and dkv (2, B, T, KV, D) += the gradients of this rank's q, k and v
void ring_attention_backward(float *dq, float *dkv, const float *dout, const float *q,
                             const float *kv, const float *out, const float *lse,
                             RingAttention *ra);
