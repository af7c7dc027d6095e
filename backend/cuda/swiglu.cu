// SwiGLU on the GPU: out = silu(gate) * up, one thread per element. Both directions write what
// the products read next (out for down_proj; dgate and dup for gate_proj and up_proj), so each
// writes its bf16 copy beside it too (out16, dgate16, dup16: NULL when not wanted).
#include "backend/cuda/common.h"

__global__ static void swiglu_forward_kernel(float *out, __nv_bfloat16 *out16, const float *gate,
                                             const float *up, size_t N) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= N) return;
    float g = gate[i];
    float y = g / (1.0f + expf(-g)) * up[i];
    out[i] = y;
    if (out16) out16[i] = __float2bfloat16_rn(y);
}

__global__ static void swiglu_backward_kernel(float *dgate, float *dup, __nv_bfloat16 *dgate16,
                                              __nv_bfloat16 *dup16, const float *dout,
                                              const float *gate, const float *up, size_t N) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= N) return;
    // forward: out = g * sigmoid(g) * up
    // dgate = dout * up * sigmoid(g) * (1 + g * (1 - sigmoid(g))); dup = dout * silu(g)
    float g = gate[i];
    float sig = 1.0f / (1.0f + expf(-g));
    float dg = dout[i] * up[i] * sig * (1.0f + g * (1.0f - sig)), du = dout[i] * g * sig;
    dgate[i] = dg, dup[i] = du;
    if (dgate16) dgate16[i] = __float2bfloat16_rn(dg), dup16[i] = __float2bfloat16_rn(du);
}

void swiglu_forward(float *out, const float *gate, const float *up, size_t N) {
    PROFILE(PROFILE_OTHER);
    if (N == 0) return;
    __nv_bfloat16 *out16 = bf16_copy_to_write(out, N);
    swiglu_forward_kernel<<<blocks_for(N, 256), 256>>>(out, out16, gate, up, N);
    cudaCheckLaunch();
}

void swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                     const float *up, size_t N) {
    PROFILE(PROFILE_OTHER);
    if (N == 0) return;
    __nv_bfloat16 *dgate16 = bf16_copy_to_write(dgate, N), *dup16 = bf16_copy_to_write(dup, N);
    swiglu_backward_kernel<<<blocks_for(N, 256), 256>>>(dgate, dup, dgate16, dup16, dout, gate,
                                                         up, N);
    cudaCheckLaunch();
}
