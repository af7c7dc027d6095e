// SwiGLU (Shazeer, "GLU Variants Improve Transformer"): the gated MLP activation of Llama.
#include "backend/backend.h"
#include "backend/kernel_time.h"
#include "backend/cpu/fast_exp.h"

// out = silu(gate) * up, silu(g) = g * sigmoid(g); all (N)
void swiglu_forward(float *out, const float *gate, const float *up, size_t N) {
    KERNEL_TIME(KT_ELEMENTWISE, 0, 12.0 * N);
#pragma omp parallel for simd
    for (size_t i = 0; i < N; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + exp_approx(-g)) * up[i];
    }
}

void swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                     const float *up, size_t N) {
    KERNEL_TIME(KT_ELEMENTWISE, 0, 20.0 * N);
    // forward: out = g * sigmoid(g) * up
    // dgate = dout * up * sigmoid(g) * (1 + g * (1 - sigmoid(g))); dup = dout * silu(g)
#pragma omp parallel for simd
    for (size_t i = 0; i < N; i++) {
        float g = gate[i];
        float sig = 1.0f / (1.0f + exp_approx(-g));
        dgate[i] = dout[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
        dup[i] = dout[i] * g * sig;
    }
}
