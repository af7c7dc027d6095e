// Flash attention on the tensor cores (backend/cuda/flash_attention.cu): attention.cu's path for
// the "bfloat16" dtype. The arguments and their meaning are attention_forward_block's and
// attention_backward_block's (backend/backend.h).
#pragma once

// 1 when the kernels take head dim D (up to 128; attention.cu's GEMM path takes the others)
int flash_attention_supports(int D);

// q: (B, Tq, H, D)  k, v: (B, Tk, KV, D)  q_pos (Tq), k_pos (Tk)  out: (B, Tq, H, D)
// lse: (B, H, Tq), both running values merged with this block's softmax
void flash_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                             const int *q_pos, const int *k_pos, int B, int Tq, int Tk, int H,
                             int KV, int D);

// dq (B, Tq, H, D), dk, dv (B, Tk, KV, D) += this block's gradients; lse and delta (B, H, Tq)
void flash_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                              const float *k, const float *v, const float *lse, const float *delta,
                              const int *q_pos, const int *k_pos, int B, int Tq, int Tk, int H,
                              int KV, int D);
