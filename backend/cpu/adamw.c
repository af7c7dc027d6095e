// AdamW (Loshchilov & Hutter) exactly as torch.optim.AdamW's default single-tensor path on the
// CPU computes it, operation by operation and in float, so trained weights match PyTorch's:
//   p *= 1 - lr * wd                      param.mul_(1 - lr * weight_decay)
//   m += (1 - b1) * (g - m)               exp_avg.lerp_(grad, 1 - beta1)
//   v = v * b2 + (1 - b2) * g * g         exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2)
//   p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)      bc = 1 - beta^t
// The bias corrections and the scalar products are formed in double, as Python does before
// torch casts them to the tensor's float. Same order of operations, not guaranteed the same
// bits: torch's vectorised kernels may fuse a multiply-add where this loop does not, or back.
#include "backend/backend.h"
#include "backend/kernel_time.h"
#include <math.h>

// fp-contract=off: every operation rounded on its own, as the formula reads. A multiply-add
// fused or not is the compiler's choice otherwise, and it chose differently in the vectorised
// loop than in the scalar one: an AVX2 build (scalar here) moved a quarter of the weights by an
// ulp against an AVX-512 build after one step.
__attribute__((optimize("fp-contract=off"))) void
adamw_update(float *params, const float *grads, float *m, float *v, size_t n, float lr,
             float beta1, float beta2, float eps, float weight_decay, int t) {
    KERNEL_TIME(KT_ADAMW, 0, 28.0 * n);
    float decay = (float)(1.0 - (double)lr * weight_decay);
    float w1 = (float)(1.0 - (double)beta1);
    float w2 = (float)(1.0 - (double)beta2);
    double bc1 = 1.0 - pow(beta1, t), bc2 = 1.0 - pow(beta2, t);
    float step_size = (float)(lr / bc1);
    float bc2_sqrt = (float)sqrt(bc2);
#pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) {
        float g = grads[i];
        float p = params[i] * decay;
        // torch's lerp switches formula at weight 0.5 for accuracy; we follow it
        m[i] = w1 < 0.5f ? m[i] + w1 * (g - m[i]) : g - (g - m[i]) * (1.0f - w1);
        v[i] = v[i] * beta2 + w2 * g * g;
        float denom = sqrtf(v[i]) / bc2_sqrt + eps;
        params[i] = p + (-step_size) * m[i] / denom;
    }
}
