// The one interface between the model and a device.
// model.c and the *_parallel.c files call only what is declared here; the CPU build links
// backend/cpu/*.c (loops + CBLAS + MPI), `make GPU=1` links backend/cuda/*.cu (CUDA + cuBLAS +
// NCCL). Every pointer named a tensor lives in device memory: callers pass it on, never dereference
// it. Size letters: N rows (tokens), B batch, T tokens this rank holds, C hidden, OC output
// features, H query heads, KV key/value heads, D head dim, V vocab rows this rank holds. Every
// backward ACCUMULATES (+=) into its outputs (but cross_entropy_backward, swiglu_backward,
// matmul_backward_write's dinp and the Mamba kernels' activation gradients, which write); callers
// zero what must start from zero.
#pragma once
#include <stddef.h>
#include <stdint.h>

// ---------------------------------------------------------------------------------------------
// device memory (backend/*/memory.*)
void backend_init(int local_rank); // picks the device; a no-op on the CPU
// The precision of the matrix products: "float32", or "bfloat16" (GPU only) for
// torch-autocast-style mixed precision: each product reads bf16 copies of its fp32 operands and
// writes fp32; every buffer the model sees (weights, activations, gradients, AdamW moments) stays
// fp32. Called once after backend_init; float32 until then.
void backend_set_dtype(const char *dtype);
// Called at the start of every training step, before its products. The promise it makes: from
// one call to the next (and before the first), nothing writes a weight once a product has read it
// (AdamW and ZeRO-1's all-gather write them between steps; ZeRO-3, which gathers weights during
// the step, is refused on the GPU for this reason). The bf16 build keeps each weight's cast for the
// step on that promise (backend/cuda/matmul.cu); a no-op on the CPU.
void backend_step_begin(void);
void *device_malloc(size_t bytes); // zeroed
void device_free(void *ptr);
void device_zero(void *ptr, size_t bytes);
void device_copy(void *dst, const void *src, size_t bytes); // device -> device
void host_to_device(void *dst, const void *src, size_t bytes);
void device_to_host(void *dst, const void *src, size_t bytes);
void device_synchronize(void);
size_t device_memory_used(void); // bytes in use by this process (peak RSS on the CPU)
// the most bytes device_malloc had handed out at once in this process: the allocator's own count,
// which the end-of-run memory table is checked against
size_t device_allocated_peak(void);
// FLOP/s of this rank's share of its node's devices, for MFU; ranks_on_node share them (a GPU
// each with nccl; on the CPU, the cores)
double device_peak_flops(int ranks_on_node);

// ---------------------------------------------------------------------------------------------
// elementwise (backend/*/elementwise.*)
void fill(float *x, float value, size_t n);
// x (N, V): columns [from, V) of every row = value (the vocabulary padding's logits)
void fill_columns(float *x, float value, int N, int V, int from);
void add_inplace(float *y, const float *x, size_t n); // y += x
void scale_inplace(float *x, float s, size_t n);      // x *= s
// x (rows, cols): row r *= scale[r] (a loss weight per token, doremi.c)
void scale_rows(float *x, const float *scale, int rows, int cols);
void sum_squares(float *out, const float *x, size_t n); // out[0] += sum(x^2)
void sum_reduce(float *out, const float *x, size_t n);  // out[0] += sum(x)

// ---------------------------------------------------------------------------------------------
// matrix products (backend/*/matmul.*): a linear layer without bias, weight as torch stores it.
// out (N, OC) = inp (N, C) @ weight (OC, C)^T
void matmul_forward(float *out, const float *inp, const float *weight, int N, int C, int OC);
// dinp (N, C) += dout @ weight; dweight (OC, C) += dout^T @ inp. Either output may be NULL.
void matmul_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                     const float *weight, int N, int C, int OC);
// the same, but dinp = dout @ weight is written (a GEMM with beta = 0), not added: the first
// product into an input gradient needs no zeroed buffer (dweight still adds up)
void matmul_backward_write(float *dinp, float *dweight, const float *dout, const float *inp,
                           const float *weight, int N, int C, int OC);
// In "bfloat16" the products read bf16 copies of their operands, which the GPU backend makes,
// keeps and drops itself (backend/cuda/matmul.cu); of them, callers know only backend_step_begin.

// ---------------------------------------------------------------------------------------------
// embedding (backend/*/embedding.*): this rank holds rows [vocab_start, vocab_start + V) of the
// table; a token outside that range gives a zero row (the vocab-parallel all-reduce fills it in).
// out (N, C), tokens (N), wte (V, C)
void embedding_forward(float *out, const int *tokens, const float *wte, int N, int C,
                       int vocab_start, int V);
void embedding_backward(float *dwte, const float *dout, const int *tokens, int N, int C,
                        int vocab_start, int V);

// ---------------------------------------------------------------------------------------------
// RMSNorm (backend/*/rmsnorm.*). out, inp: (N, C)  weight: (C)  rstd: (N), saved for backward
void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N, int C,
                     float eps);
void rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                      const float *weight, const float *rstd, int N, int C);

// ---------------------------------------------------------------------------------------------
// rotary position embedding, Hugging Face Llama's rotate-half layout (backend/*/rope.*).
// x: (B, T, NH, D), rotated in place; cos, sin: (T, D/2) for the global positions this rank holds
void rope_forward(float *x, const float *cos, const float *sin, int B, int T, int NH, int D);
// dx: (B, T, NH, D) in place: the gradient of a rotation is the inverse rotation
void rope_backward(float *dx, const float *cos, const float *sin, int B, int T, int NH, int D);

// ---------------------------------------------------------------------------------------------
// attention of one (query block, key/value block) pair (backend/*/attention.*); ring attention
// calls it once per block that travels round the context-parallel ring, plain attention is the
// ring of one. Grouped-query: query head h reads kv head h / (H / KV).
// q: (B, Tq, H, D)  k, v: (B, Tk, KV, D)  q_pos: (Tq), k_pos: (Tk) global positions (causal mask:
// key j is seen by query i iff k_pos[j] <= q_pos[i])  out: (B, Tq, H, D)  lse: (B, H, Tq)
// The block's softmax is merged into (out, lse) with the log-sum-exp update; start from out = 0,
// lse = -INFINITY.
void attention_forward_block(float *out, float *lse, const float *q, const float *k, const float *v,
                             const int *q_pos, const int *k_pos, int B, int Tq, int Tk, int H,
                             int KV, int D);
// delta (B, H, Tq) = rowsum(dout * out), once per step, before the blocks
void attention_backward_delta(float *delta, const float *dout, const float *out, int B, int T,
                              int H, int D);
// dq (B, Tq, H, D) += ..., dk, dv (B, Tk, KV, D) += ... for one block; probabilities are
// recomputed from the final lse
void attention_backward_block(float *dq, float *dk, float *dv, const float *dout, const float *q,
                              const float *k, const float *v, const float *lse, const float *delta,
                              const int *q_pos, const int *k_pos, int B, int Tq, int Tk, int H,
                              int KV, int D);

// ---------------------------------------------------------------------------------------------
// SwiGLU (backend/*/swiglu.*): out = silu(gate) * up, all (N)
void swiglu_forward(float *out, const float *gate, const float *up, size_t N);
// dgate and dup are WRITTEN, not added to: gate and up feed nothing else, so the backward is
// their whole gradient, and no pass of zeros goes before it
void swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                     const float *up, size_t N);

// ---------------------------------------------------------------------------------------------
// mixture of experts (backend/*/moe.*): Mixtral's top-k router and the shuffles that give each
// expert its tokens as contiguous rows, so an expert is plain matmul + SwiGLU. E experts, K
// choices per token (K <= E); a (token, choice) pair is row n * K + j of the (N, K) tensors.
// probs (N, E) = softmax(logits (N, E)); topk_ids (N, K) the K largest probs, largest first, ties
// to the lower expert; topk_w (N, K) their probs renormalised to sum to 1 over the K
void moe_router_forward(float *probs, int *topk_ids, float *topk_w, const float *logits, int N,
                        int E, int K);
// A counting sort of the pairs by expert, in token order (deterministic): counts (E) pairs routed
// to each expert; offsets (E+1) the first sorted row of each expert, offsets[E] the rows kept;
// pos (N, K) each pair's sorted row, or -1 when its expert already holds capacity pairs
// (capacity 0: no limit)
void moe_dispatch(int *counts, int *offsets, int *pos, const int *topk_ids, int N, int E, int K,
                  int capacity);
// What Switch Transformer's load-balancing loss of one layer needs, summable over ranks that hold
// parts of one micro-batch: load (2E) = the pairs routed to each expert (counts, as floats), then
// each expert's sum of probs over the N tokens. aux = E * sum_e (load[e] / tokens) *
// (load[E + e] / tokens), tokens being the micro-batch's (moe.c forms it on the host).
void moe_load(float *load, const float *probs, const int *counts, int N, int E);
// x_sorted[pos[n, j]] = x[n] for every kept pair; x (N, C), x_sorted (rows, C)
void moe_gather_forward(float *x_sorted, const float *x, const int *pos, int N, int C, int K);
// dx[n] += sum over kept j of dx_sorted[pos[n, j]]
void moe_gather_backward(float *dx, const float *dx_sorted, const int *pos, int N, int C, int K);
// y (N, C) = sum over kept j of topk_w[n, j] * out_sorted[pos[n, j]]; a dropped pair adds nothing
void moe_combine_forward(float *y, const float *out_sorted, const float *topk_w, const int *pos,
                         int N, int C, int K);
// dout_sorted[pos[n, j]] += topk_w[n, j] * dy[n]; dtopk_w[n, j] += dy[n] . out_sorted[pos[n, j]]
void moe_combine_backward(float *dout_sorted, float *dtopk_w, const float *dy,
                          const float *out_sorted, const float *topk_w, const int *pos, int N,
                          int C, int K);
// dlogits (N, E) += the gradient through the renormalised top-k weights (dtopk_w (N, K)) and the
// softmax, plus aux_scale * d aux / d logits of these N tokens, aux formed over `tokens` tokens
// whose pairs per expert are counts (E), moe_load's first half (constants: only the probs carry it)
void moe_router_backward(float *dlogits, const float *dtopk_w, const float *probs,
                         const int *topk_ids, const float *topk_w, const float *counts,
                         float aux_scale, int tokens, int N, int E, int K);

// ---------------------------------------------------------------------------------------------
// Mamba-1 (backend/*/mamba.*): the two kernels that run along the sequence, each channel of
// d_inner on its own. B batch, T tokens, I d_inner channels (of this rank), S the state size, W
// the conv's width; (B, T, I) tensors are token-major, as matmul_* writes them.
// out, pre (B, T, I) = silu(pre), pre = the causal depthwise conv of x (B, T, I): channel i of
// token t is bias[i] + sum_k weight[i, k] * x[t - (W-1) + k] (zeros before the first token).
// weight (I, W) (transformers' conv1d.weight (I, 1, W)); bias (I), or NULL for none
void causal_conv1d_forward(float *out, float *pre, const float *x, const float *weight,
                           const float *bias, int B, int T, int I, int W);
// dx (B, T, I) is WRITTEN (x feeds nothing else); dweight (I, W) and dbias (I) += (dbias may be
// NULL). pre from the forward
void causal_conv1d_backward(float *dx, float *dweight, float *dbias, const float *dout,
                            const float *x, const float *pre, const float *weight, int B, int T,
                            int I, int W);
// The selective scan (the state space model of one layer), per channel i and state s:
//   delta_t = softplus(dt_t + dt_bias),  A = -exp(A_log)
//   h_t = exp(delta_t A) h_{t-1} + delta_t B_t u_t,  y_t = sum_s C_t h_t + D u_t,  h_{-1} = 0
// y, u, dt (B, T, I); dt_bias (I); A_log (I, S); Bm, Cm (B, T, S), shared by the channels; D (I).
// The states are not kept: the backward recomputes them.
void selective_scan_forward(float *y, const float *u, const float *dt, const float *dt_bias,
                            const float *A_log, const float *Bm, const float *Cm, const float *D,
                            int B, int T, int I, int S);
// du, ddt (B, T, I) and dBm, dCm (B, T, S) are WRITTEN (the scan is their first contribution);
// ddt_bias (I), dA_log (I, S), dD (I) +=
void selective_scan_backward(float *du, float *ddt, float *dBm, float *dCm, float *ddt_bias,
                             float *dA_log, float *dD, const float *dy, const float *u,
                             const float *dt, const float *dt_bias, const float *A_log,
                             const float *Bm, const float *Cm, const float *D, int B, int T, int I,
                             int S);
// The scan of one chunk of a longer sequence (context parallelism: mamba.c), the same with
// h0 (B, I, S) the state before the chunk's first token (NULL: zero); h_last (B, I, S) receives
// the state after its last and decay (B, I, S) the product of its decays exp(sum_t delta_t A)
// (each NULL: not wanted)
void selective_scan_chunk_forward(float *y, const float *u, const float *dt, const float *dt_bias,
                                  const float *A_log, const float *Bm, const float *Cm,
                                  const float *D, int B, int T, int I, int S, const float *h0,
                                  float *h_last, float *decay);
// and its backward from h0: g_last (B, I, S) is the gradient later chunks send back to the
// state after the last token (NULL: none), dh0 (B, I, S) receives the gradient of h0 (NULL: not
// wanted)
void selective_scan_chunk_backward(float *du, float *ddt, float *dBm, float *dCm, float *ddt_bias,
                                   float *dA_log, float *dD, const float *dy, const float *u,
                                   const float *dt, const float *dt_bias, const float *A_log,
                                   const float *Bm, const float *Cm, const float *D, int B, int T,
                                   int I, int S, const float *h0, const float *g_last, float *dh0);

// ---------------------------------------------------------------------------------------------
// cross-entropy from a vocab shard (backend/*/cross_entropy.*): logits (N, V) hold the columns
// [vocab_start, vocab_start + V) of the full vocabulary. Each shard is read once for its
// statistics; the tensor-parallel loss merges them over the ranks between the calls (the max,
// then the sums rescaled to it), so no rank ever holds (N, full vocab).
// maxes (N) = max_j logit_j over this shard; sumexp (N) = sum_j exp(logit_j - maxes);
// target_logit (N) = logit of the target if in this shard, else 0
void cross_entropy_stats(float *maxes, float *sumexp, float *target_logit, const float *logits,
                         const int *targets, int N, int V, int vocab_start);
// sumexp (N) *= exp(shard_maxes - maxes): a shard's sum moved onto the scale of the maxima over
// all shards, where the shards' sums add
void cross_entropy_rescale(float *sumexp, const float *shard_maxes, const float *maxes, int N);
// losses (N) = log(sumexp) + maxes - target_logit
void cross_entropy_loss(float *losses, const float *maxes, const float *sumexp,
                        const float *target_logit, int N);
// dlogits (N, V) = dloss * (softmax - onehot(target)), WRITTEN, not accumulated: the one
// exception to the += rule, since nothing else adds into dlogits and a pass of zeros over (N, V)
// would be the largest memset of a step
void cross_entropy_backward(float *dlogits, const float *logits, const float *maxes,
                            const float *sumexp, const int *targets, float dloss, int N, int V,
                            int vocab_start);

// ---------------------------------------------------------------------------------------------
// AdamW (backend/*/adamw.*), torch.optim.AdamW's update with bias correction; t counts from 1
void adamw_update(float *params, const float *grads, float *m, float *v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int t);

// ---------------------------------------------------------------------------------------------
// deterministic init (backend/*/init.*): element i of a tensor is a pure function of
// (seed, name_hash, global index), so every layout starts from the same weights.
// out (rows, cols) is the block [row0, row0+rows) x [col0, col0+cols) of a (.., global_cols) tensor
// kind 0: uniform(-bound, bound); kind 1: normal(0, bound); kind 2: the constant bound
void init_tensor(float *out, uint64_t seed, uint64_t name_hash, int kind, float bound, int rows,
                 int cols, int row0, int col0, int global_cols);
