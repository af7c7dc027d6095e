// AdamW on the GPU, torch.optim.AdamW's update in the CPU twin's order of operations (see
// backend/cpu/adamw.c): the scalars are formed on the host, in double, exactly as there.
#include "backend/cuda/common.h"
#include <math.h>

__global__ static void adamw_kernel(float *params, const float *grads, float *m, float *v, size_t n,
                                    float decay, float w1, float w2, float beta2, float eps,
                                    float step_size, float bc2_sqrt) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = grads[i];
    float p = params[i] * decay; // p *= 1 - lr * wd
    // torch's lerp switches formula at weight 0.5 for accuracy
    float mi = m[i];
    mi = w1 < 0.5f ? mi + w1 * (g - mi) : g - (g - mi) * (1.0f - w1);
    float vi = v[i] * beta2 + w2 * g * g;
    float denom = sqrtf(vi) / bc2_sqrt + eps;
    params[i] = p + (-step_size) * mi / denom;
    m[i] = mi;
    v[i] = vi;
}

void adamw_update(float *params, const float *grads, float *m, float *v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int t) {
    PROFILE(PROFILE_OTHER);
    bf16_copies_stale(params, n * sizeof(float));
    bf16_copies_stale(m, n * sizeof(float));
    bf16_copies_stale(v, n * sizeof(float));
    if (n == 0) return;
    float decay = (float)(1.0 - (double)lr * weight_decay);
    float w1 = (float)(1.0 - (double)beta1);
    float w2 = (float)(1.0 - (double)beta2);
    double bc1 = 1.0 - pow(beta1, t), bc2 = 1.0 - pow(beta2, t);
    float step_size = (float)(lr / bc1);
    float bc2_sqrt = (float)sqrt(bc2);
    adamw_kernel<<<blocks_for(n, 256), 256>>>(params, grads, m, v, n, decay, w1, w2, beta2, eps,
                                              step_size, bc2_sqrt);
    cudaCheckLaunch();
}
