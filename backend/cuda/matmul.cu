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
//   "bfloat16": mixed precision as torch.autocast does it: each product multiplies bf16 copies of
//               its fp32 operands on the tensor cores, accumulating and writing in fp32
//               (CUBLAS_COMPUTE_32F; dweight still accumulates with beta = 1 into the fp32
//               gradient). A copy is kept while its tensor is unchanged, so that each tensor is
//               cast once however many products read it, and only this backend knows of it:
//               - a weight: cast at its first product of a step into a buffer of its own, which
//                 the step's later products read (the other micro-batches', the backward's
//                 dinp). Sound by backend_step_begin's contract (below): 6 bytes moved per
//                 weight and step, where casting at each product moved 12 per micro-batch.
//               - any other input: cast into a copy kept until something writes its memory.
//                 Every backend call that writes device memory first hands what it writes to
//                 bf16_copies_stale (common.h), which drops the copies it overlaps; and the
//                 kernels that write a product's input whole (the norms, SwiGLU and its backward,
//                 the loss's backward) write its copy beside it (bf16_copy_to_write), so that no
//                 product casts it at all: 2 bytes written where a cast reads 4 and writes 2.
//               Master weights, gradients, buckets and AdamW moments stay fp32, and so do the
//               activations model.c saves: this saves GEMM time and HBM passes, not activation
//               memory (the copies add 2 bytes per element of the tensors they shadow; picotron's
//               bf16 model saves memory).
// The test switch CAST_AT_EVERY_PRODUCT (utils.h) keeps no copy at all: every product casts its
// operands into scratch, as torch.autocast does; the tests' way to show the copies give its bits.
#include "backend/cuda/common.h"
#include <stdlib.h>
#include <string.h>

int compute_bf16 = 0;

// round to nearest even, as torch's .to(torch.bfloat16)
__global__ static void to_bf16_kernel(__nv_bfloat16 *out, const float *in, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2bfloat16_rn(in[i]);
}

static const void *to_bf16(void *out, const float *in, size_t n) {
    to_bf16_kernel<<<blocks_for(n, 256), 256>>>((__nv_bfloat16 *)out, in, n);
    cudaCheckLaunch();
    return out;
}

// read once: the products and the kernels that write copies ask at every call
static int cast_at_every_product(void) {
    static int on = -1;
    if (on < 0) {
        const char *value = test_switch("CAST_AT_EVERY_PRODUCT");
        on = value && strcmp(value, "1") == 0;
    }
    return on;
}

// Under CAST_AT_EVERY_PRODUCT, operand k (0 to 2) of a product is cast into scratch[k]. The
// compute stream runs in program order, so the next product may overwrite it: nothing reads it
// after its GEMM.
static DeviceScratch scratch[3];

static const void *cast_into_scratch(int k, const float *x, size_t n) {
    return to_bf16(device_scratch(&scratch[k], n * sizeof(__nv_bfloat16)), x, n);
}

// The weights' casts, one entry per weight the products read. The contract that makes them sound
// (backend.h): from one backend_step_begin() to the next, the weights the products read are not
// written. train.c calls it at the start of each step, after AdamW and ZeRO-1's all-gather wrote
// the weights; a program that writes weights otherwise (a test's AdamW steps, a checkpoint loaded
// between products) calls it after the write. So an entry cast this step holds its weight's bits.
// backend_step_begin marks every entry for casting again; the buffers stay, so that a step
// allocates nothing. device_free forgets the entries of the memory it frees (which may become any
// tensor); nothing else looks here, so the writes of a step cost no search of these entries.
typedef struct {
    const float *src; // NULL: free, its buffer kept for another weight
    size_t n;
    int cast_this_step;
    DeviceScratch copy;
} WeightCast;
static WeightCast *weight_casts;
static int num_weight_casts, weight_casts_cap;

void backend_step_begin(void) {
    for (int i = 0; i < num_weight_casts; i++) weight_casts[i].cast_this_step = 0;
}

// weight (n) in bf16: its entry, cast at the first product of the step
static const void *weight_bf16(const float *weight, size_t n) {
    if (cast_at_every_product()) return cast_into_scratch(1, weight, n);
    WeightCast *e = NULL;
    for (int i = 0; i < num_weight_casts && !e; i++)
        if (weight_casts[i].src == weight) e = &weight_casts[i];
    for (int i = 0; i < num_weight_casts && !e; i++)
        if (!weight_casts[i].src) e = &weight_casts[i];
    if (!e) {
        if (num_weight_casts == weight_casts_cap) {
            weight_casts_cap = weight_casts_cap ? 2 * weight_casts_cap : 64;
            weight_casts =
                (WeightCast *)realloc(weight_casts, weight_casts_cap * sizeof(WeightCast));
            if (!weight_casts) FAIL("out of host memory", "cannot grow the weights' casts");
        }
        e = &weight_casts[num_weight_casts++];
        *e = WeightCast{};
    }
    if (e->src != weight || e->n != n || !e->cast_this_step) {
        e->src = weight, e->n = n, e->cast_this_step = 1;
        to_bf16(device_scratch(&e->copy, n * sizeof(__nv_bfloat16)), weight, n);
    }
    return e->copy.ptr;
}

// The other inputs' copies: copy is src (n) rounded, while valid. A step holds a few a layer and
// micro-batch in flight (ln1, ln2, act, att, d(gate), d(up)), and dlogits, lnf and the copies of
// the gradient buffers the layers share (dq, dk, dv, dresid). An entry keeps its src when it goes
// stale, so that src's next copy reuses its buffer: after the first step, a step allocates
// nothing new.
typedef struct {
    const float *src; // NULL: nobody's, its buffer kept for any copy
    size_t n;
    int valid;
    DeviceScratch copy;
} Copy;
static Copy *copies;
static int num_copies, copies_cap;

static int overlaps(const float *src, size_t n, const void *ptr, size_t bytes) {
    const char *lo = (const char *)ptr;
    return (const char *)src < lo + bytes && (const char *)(src + n) > lo;
}

void bf16_copies_stale(const void *ptr, size_t bytes) {
    for (int i = 0; i < num_copies; i++)
        if (copies[i].valid && overlaps(copies[i].src, copies[i].n, ptr, bytes))
            copies[i].valid = 0;
}

void bf16_memory_freed(const void *ptr, size_t bytes) {
    for (int i = 0; i < num_copies; i++)
        if (copies[i].src && overlaps(copies[i].src, copies[i].n, ptr, bytes))
            copies[i].valid = 0, copies[i].src = NULL;
    for (int i = 0; i < num_weight_casts; i++)
        if (weight_casts[i].src && overlaps(weight_casts[i].src, weight_casts[i].n, ptr, bytes))
            weight_casts[i].src = NULL;
}

// a buffer for the copy of x (n), valid from now: x's own buffer from before if it has one, else
// the smallest stale buffer that holds it, else a new one
static __nv_bfloat16 *new_copy(const float *x, size_t n) {
    bf16_copies_stale(x, n * sizeof(float)); // what overlaps x is replaced by this copy
    size_t bytes = n * sizeof(__nv_bfloat16);
    int slot = -1;
    for (int i = 0; i < num_copies && slot < 0; i++)
        if (copies[i].src == x) slot = i;
    for (int i = 0; i < num_copies && slot < 0; i++)
        if (!copies[i].valid && copies[i].copy.bytes >= bytes &&
            (slot < 0 || copies[i].copy.bytes < copies[slot].copy.bytes))
            slot = i;
    if (slot < 0) {
        if (num_copies == copies_cap) {
            copies_cap = copies_cap ? 2 * copies_cap : 256;
            copies = (Copy *)realloc(copies, copies_cap * sizeof(Copy));
            if (!copies) FAIL("out of host memory", "cannot grow the table of bf16 copies");
        }
        slot = num_copies++;
        copies[slot] = Copy{};
    }
    copies[slot].src = x, copies[slot].n = n, copies[slot].valid = 1;
    return (__nv_bfloat16 *)device_scratch(&copies[slot].copy, bytes);
}

__nv_bfloat16 *bf16_copy_to_write(const float *x, size_t n) {
    bf16_copies_stale(x, n * sizeof(float)); // the kernel writes x: its old copies go
    if (!compute_bf16 || n == 0 || cast_at_every_product()) return NULL;
    return new_copy(x, n);
}

// an input x (n), operand k of its product, in bf16: the valid copy that holds it (x may be rows
// of a copied tensor), or cast now into a copy of its own
static const void *input_bf16(int k, const float *x, size_t n) {
    if (cast_at_every_product()) return cast_into_scratch(k, x, n);
    for (int i = 0; i < num_copies; i++)
        if (copies[i].valid && x >= copies[i].src && x + n <= copies[i].src + copies[i].n)
            return (const __nv_bfloat16 *)copies[i].copy.ptr + (x - copies[i].src);
    return to_bf16(new_copy(x, n), x, n);
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
    bf16_copies_stale(out, (size_t)N * OC * sizeof(float));
    const void *a = weight, *b = inp;
    cudaDataType type = CUDA_R_32F;
    if (compute_bf16) {
        b = input_bf16(0, inp, (size_t)N * C);
        a = weight_bf16(weight, (size_t)OC * C);
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
    if (dinp) bf16_copies_stale(dinp, (size_t)N * C * sizeof(float));
    if (dweight) bf16_copies_stale(dweight, (size_t)OC * C * sizeof(float));
    const void *w = weight, *x = inp, *dy = dout;
    cudaDataType type = CUDA_R_32F;
    if (compute_bf16) {
        dy = input_bf16(0, dout, (size_t)N * OC);
        if (dinp) w = weight_bf16(weight, (size_t)OC * C);
        if (dweight) x = input_bf16(2, inp, (size_t)N * C);
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
