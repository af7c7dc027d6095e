// The linear layer's products through cuBLAS. cuBLAS is column-major; a row-major (R, K) matrix
// is the column-major (K, R) one, its transpose. So each row-major product below is written as
// the product of the transposes:
//   out = inp @ W^T        (row-major)  <=>  out^T  = W @ inp^T          (column-major)
//   dinp += dout @ W       (row-major)  <=>  dinp^T += W^T @ dout^T      (column-major)
//   dW += dout^T @ inp     (row-major)  <=>  dW^T   += inp^T @ dout      (column-major)
// where, column-major, W is (C, OC) with ld C, inp^T is (C, N) with ld C, dout^T is (OC, N).
//
// Precision (backend_set_dtype):
//   "float32":  fp32 operands, CUBLAS_COMPUTE_32F (no TF32), so the GPU matches the CPU to 1e-5.
//   "bfloat16": mixed precision as torch.autocast does it: each product casts its fp32 operands
//               to bf16 copies in one reusable scratch buffer and multiplies them on the tensor
//               cores, accumulating and writing in fp32 (CUBLAS_COMPUTE_32F; dweight still
//               accumulates with beta = 1 into the fp32 gradient). The weights come from a bf16
//               copy of the parameter buffer, cast once per step (matmul_weights_changed: 6
//               bytes per parameter, where casting at each product cost 12 per parameter and
//               micro-batch, for the forward and the backward's dinp); an input that several
//               products read unchanged is cast once (matmul_keep_casts); and the kernels that
//               write a product's input whole (the norms, SwiGLU and its backward, the loss's
//               backward) write its bf16 copy beside it, so that no product casts it
//               (bf16_copy_to_write). Master weights, gradients, buckets and AdamW moments stay
//               fp32, and so do the activations model.c saves: this saves GEMM time and HBM
//               passes, not activation memory (the copies add 2 bytes per element of the tensors
//               they shadow; picotron's bf16 model saves memory).
#include "backend/cuda/common.h"
#include <stdlib.h>
#include <string.h>

int compute_bf16 = 0;

// The bf16 copies of one product's operands. The compute stream runs in program order, so the
// next product may overwrite them: nothing reads them after their GEMM.
static DeviceScratch scratch;
#define SCRATCH_ALIGN 64 // elements (128 bytes): each operand starts where tensor cores want it

static size_t aligned(size_t n) {
    return (n + SCRATCH_ALIGN - 1) / SCRATCH_ALIGN * SCRATCH_ALIGN;
}

static __nv_bfloat16 *bf16_scratch(size_t n) {
    return (__nv_bfloat16 *)device_scratch(&scratch, n * sizeof(__nv_bfloat16));
}

// round to nearest even, as torch's .to(torch.bfloat16)
__global__ static void to_bf16_kernel(__nv_bfloat16 *out, const float *in, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2bfloat16_rn(in[i]);
}

static const void *to_bf16(__nv_bfloat16 *out, const float *in, size_t n) {
    to_bf16_kernel<<<blocks_for(n, 256), 256>>>(out, in, n);
    cudaCheckLaunch();
    return out;
}

// The weights' bf16 copy: params[i] is copy[i], as cast before this step (matmul_weights_changed)
static const float *copied_params;
static size_t copied_n;
static DeviceScratch weights_copy;

void matmul_weights_changed(const float *params, size_t n) {
    const char *off = getenv("PICOTRON_BF16_WEIGHT_COPY");
    if (!compute_bf16 || n == 0 || (off && strcmp(off, "0") == 0)) return;
    PROFILE(PROFILE_GEMM);
    to_bf16((__nv_bfloat16 *)device_scratch(&weights_copy, n * sizeof(__nv_bfloat16)), params, n);
    copied_params = params, copied_n = n;
}

// weight (n) in bf16: its place in the copy when it lies in the parameter buffer, else cast into
// out (the same bits either way: one rounding of the same fp32 value)
static const void *weight_bf16(__nv_bfloat16 *out, const float *weight, size_t n) {
    if (copied_params && weight >= copied_params && weight + n <= copied_params + copied_n)
        return (const __nv_bfloat16 *)weights_copy.ptr + (weight - copied_params);
    return to_bf16(out, weight, n);
}

// PICOTRON_BF16_KEEP_CASTS=0: every product casts its own inputs, as torch.autocast does; the
// tests' way to show that the copies below give the same bits. Read once: the kernels that write
// the copies and every column-parallel call ask.
static int cast_at_every_product(void) {
    static int off = -1;
    if (off < 0) {
        const char *value = getenv("PICOTRON_BF16_KEEP_CASTS");
        off = value && strcmp(value, "0") == 0;
    }
    return off;
}

// The bf16 copies written beside their fp32 tensors by the kernels that write those whole: x[i]
// rounds to copy[i] from the kernel's write until the next (or until any device_free, which may
// hand the memory to another tensor). Only those kernels write these tensors (model.c's ln1, ln2,
// lnf, act, d(gate), d(up), dlogits; their MoE and generate.c counterparts), so a product reading
// x, or rows of it, reads the copy: one bf16 write where a cast read 4 bytes and wrote 2 more. A
// table of COPIES (a step needs 3 a layer and micro-batch in flight, and a few); a full table
// starts again.
#define COPIES 1024
static struct {
    const float *src;
    size_t n;
    DeviceScratch copy;
} copies[COPIES];
static int num_copies;

__nv_bfloat16 *bf16_copy_to_write(const float *x, size_t n) {
    if (!compute_bf16 || n == 0 || cast_at_every_product()) return NULL;
    int slot = -1;
    for (int i = 0; i < num_copies; i++) { // a copy of x's memory from before is stale now
        if (copies[i].src == NULL || copies[i].src >= x + n || copies[i].src + copies[i].n <= x)
            continue;
        if (slot < 0 || copies[i].src == x) slot = i; // x's own slot if it has one: same size
        copies[i].src = NULL;
    }
    for (int i = 0; slot < 0 && i < num_copies; i++)
        if (copies[i].src == NULL) slot = i;
    if (slot < 0 && num_copies == COPIES) bf16_copies_forget();
    if (slot < 0) slot = num_copies++;
    copies[slot].src = x, copies[slot].n = n;
    return (__nv_bfloat16 *)device_scratch(&copies[slot].copy, n * sizeof(__nv_bfloat16));
}

void bf16_copies_forget(void) {
    num_copies = 0; // their buffers stay, for the next copies
}

// x (n) in bf16 as a kernel wrote it beside x, or NULL
static const void *bf16_copy_written(const float *x, size_t n) {
    for (int i = 0; i < num_copies; i++)
        if (copies[i].src && x >= copies[i].src && x + n <= copies[i].src + copies[i].n)
            return (const __nv_bfloat16 *)copies[i].copy.ptr + (x - copies[i].src);
    return NULL;
}

// The inputs cast between matmul_keep_casts and matmul_drop_casts, each in its own buffer (kept
// for the next window, so that a step allocates nothing new): a product that reads one of them
// again reads its copy. Beyond KEPT_CASTS inputs a window casts as outside one.
#define KEPT_CASTS 8
static struct {
    const float *src;
    size_t n;
    DeviceScratch copy;
} kept[KEPT_CASTS];
static int keeping, num_kept;

void matmul_keep_casts(void) {
    keeping = compute_bf16 && !cast_at_every_product();
}

void matmul_drop_casts(void) {
    keeping = 0, num_kept = 0;
}

// an input x (n) in bf16: the copy its kernel wrote, or its copy kept in this window, else cast
// into out (or into a kept copy)
static const void *input_bf16(__nv_bfloat16 *out, const float *x, size_t n) {
    const void *written = bf16_copy_written(x, n);
    if (written) return written;
    for (int i = 0; keeping && i < num_kept; i++)
        if (kept[i].src == x && kept[i].n == n) return kept[i].copy.ptr;
    if (!keeping || num_kept == KEPT_CASTS) return to_bf16(out, x, n);
    kept[num_kept].src = x, kept[num_kept].n = n;
    void *copy = device_scratch(&kept[num_kept++].copy, n * sizeof(__nv_bfloat16));
    return to_bf16((__nv_bfloat16 *)copy, x, n);
}

// c (m, n) = a (op) @ b (op) + beta * c, column-major; a and b of `type`, c fp32
static void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *a,
                 int lda, const void *b, int ldb, float beta, float *c, int ldc,
                 cudaDataType type) {
    const float alpha = 1.0f;
    if (!device_selected)
        FAIL("call backend_init(local_rank) first", "a GEMM before the GPU was selected");
    cublasCheck(cublasGemmEx(cublas_handle, ta, tb, m, n, k, &alpha, a, type, lda, b, type, ldb,
                             &beta, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// out (N, OC) = inp (N, C) @ weight (OC, C)^T
void matmul_forward(float *out, const float *inp, const float *weight, int N, int C, int OC) {
    PROFILE(PROFILE_GEMM);
    if (N == 0 || OC == 0) return;
    if (C == 0) {
        device_zero(out, (size_t)N * OC * sizeof(float));
        return;
    }
    const void *a = weight, *b = inp;
    cudaDataType type = CUDA_R_32F;
    if (compute_bf16) {
        size_t n_inp = (size_t)N * C, n_w = (size_t)OC * C;
        __nv_bfloat16 *s = bf16_scratch(aligned(n_inp) + n_w);
        b = input_bf16(s, inp, n_inp);
        a = weight_bf16(s + aligned(n_inp), weight, n_w);
        type = CUDA_R_16BF;
    }
    // column-major: out^T (OC, N) = W^T-as-stored (OC x C, op T of the (C, OC) buffer) @ inp^T
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, a, C, b, C, 0.0f, out, OC, type);
}

// dinp (N, C) = dinp_beta * dinp + dout (N, OC) @ weight (OC, C); dweight (OC, C) += dout^T @ inp.
// dinp_beta 1: matmul_backward; 0: matmul_backward_write
static void backward(float *dinp, float *dweight, const float *dout, const float *inp,
                     const float *weight, int N, int C, int OC, float dinp_beta) {
    PROFILE(PROFILE_GEMM);
    if (N == 0 || C == 0) return;
    if (OC == 0) { // an empty sum: dinp is 0 (written) or unchanged
        if (dinp && dinp_beta == 0.0f) device_zero(dinp, (size_t)N * C * sizeof(float));
        return;
    }
    const void *w = weight, *x = inp, *dy = dout;
    cudaDataType type = CUDA_R_32F;
    if (compute_bf16) {
        size_t n_dout = (size_t)N * OC, n_w = dinp ? (size_t)OC * C : 0;
        size_t n_inp = dweight ? (size_t)N * C : 0;
        __nv_bfloat16 *s = bf16_scratch(aligned(n_dout) + aligned(n_w) + n_inp);
        dy = input_bf16(s, dout, n_dout);
        if (dinp) w = weight_bf16(s + aligned(n_dout), weight, n_w);
        if (dweight) x = input_bf16(s + aligned(n_dout) + aligned(n_w), inp, n_inp);
        type = CUDA_R_16BF;
    }
    // column-major: dinp^T (C, N) += W (C, OC) @ dout^T (OC, N)
    if (dinp) gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, w, C, dy, OC, dinp_beta, dinp, C, type);
    // column-major: dW^T (C, OC) += inp^T (C, N) @ (dout^T)^T (N, OC)
    if (dweight) gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, x, C, dy, OC, 1.0f, dweight, C, type);
}

void matmul_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                     const float *weight, int N, int C, int OC) {
    backward(dinp, dweight, dout, inp, weight, N, C, OC, 1.0f);
}

void matmul_backward_write(float *dinp, float *dweight, const float *dout, const float *inp,
                           const float *weight, int N, int C, int OC) {
    backward(dinp, dweight, dout, inp, weight, N, C, OC, 0.0f);
}
