// SwiGLU on the GPU: out = silu(gate) * up, one thread per element.
#include "backend/cuda/common.h"

__global__ static void swiglu_forward_kernel(float *out, const float *gate, const float *up,
                                             size_t N) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= N) return;
    float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
}

__global__ static void swiglu_backward_kernel(float *dgate, float *dup, const float *dout,
                                              const float *gate, const float *up, size_t N) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= N) return;
    // forward: out = g * sigmoid(g) * up
    // dgate = dout * up * sigmoid(g) * (1 + g * (1 - sigmoid(g))); dup = dout * silu(g)
    float g = gate[i];
    float sig = 1.0f / (1.0f + expf(-g));
    dgate[i] = dout[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
    dup[i] = dout[i] * g * sig;
}

void swiglu_forward(float *out, const float *gate, const float *up, size_t N) {
    PROFILE(PROFILE_OTHER);
    if (N == 0) return;
    swiglu_forward_kernel<<<blocks_for(N, 256), 256>>>(out, gate, up, N);
    cudaCheckLaunch();
}

void swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                     const float *up, size_t N) {
    PROFILE(PROFILE_OTHER);
    if (N == 0) return;
    swiglu_backward_kernel<<<blocks_for(N, 256), 256>>>(dgate, dup, dout, gate, up, N);
    cudaCheckLaunch();
}
