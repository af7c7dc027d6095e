// Rotary position embedding (Su et al., RoFormer) in Hugging Face Llama's rotate-half layout:
// element i of a head pairs with element i + D/2, not with its neighbour.
#include "backend/backend.h"
#include "backend/kernel_time.h"

// Rotates each (x[i], x[i + D/2]) pair by +theta (dir = 1) or -theta (dir = -1).
static void rotate(float *x, const float *cos, const float *sin, int B, int T, int NH, int D,
                   float dir) {
    int half = D / 2;
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const float *cs = cos + (size_t)t * half;
            const float *sn = sin + (size_t)t * half;
            for (int h = 0; h < NH; h++) {
                float *xh = x + (((size_t)b * T + t) * NH + h) * D;
#pragma omp simd
                for (int i = 0; i < half; i++) {
                    float x1 = xh[i], x2 = xh[i + half], s = dir * sn[i];
                    xh[i] = x1 * cs[i] - x2 * s;
                    xh[i + half] = x2 * cs[i] + x1 * s;
                }
            }
        }
    }
}

// x: (B, T, NH, D) in place; cos, sin: (T, D/2)
// out[i] = x[i] cos - x[i + D/2] sin;  out[i + D/2] = x[i + D/2] cos + x[i] sin
void rope_forward(float *x, const float *cos, const float *sin, int B, int T, int NH, int D) {
    KERNEL_TIME(KT_ELEMENTWISE, 0, 8.0 * B * T * NH * D);
    rotate(x, cos, sin, B, T, NH, D, 1.0f);
}

// forward: out = R(theta) x, R orthogonal  =>  dx = R(theta)^T dout = R(-theta) dout
void rope_backward(float *dx, const float *cos, const float *sin, int B, int T, int NH, int D) {
    KERNEL_TIME(KT_ELEMENTWISE, 0, 8.0 * B * T * NH * D);
    rotate(dx, cos, sin, B, T, NH, D, -1.0f);
}
