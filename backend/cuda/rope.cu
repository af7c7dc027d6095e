// Rotary position embedding on the GPU, Hugging Face Llama's rotate-half layout: element i of a
// head pairs with element i + D/2. One thread per pair.
#include "backend/cuda/common.h"

// Rotates each (x[i], x[i + D/2]) pair by +theta (dir = 1) or -theta (dir = -1).
__global__ static void rotate_kernel(float *x, const float *cos, const float *sin, int T, int NH,
                                     int D, float dir, size_t pairs) {
    size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (idx >= pairs) return;
    int half = D / 2;
    int i = (int)(idx % half);
    size_t head = idx / half; // (b, t, h) flattened
    int t = (int)((head / NH) % T);
    float *xh = x + head * D;
    float c = cos[(size_t)t * half + i], s = dir * sin[(size_t)t * half + i];
    float x1 = xh[i], x2 = xh[i + half];
    xh[i] = x1 * c - x2 * s;
    xh[i + half] = x2 * c + x1 * s;
}

static void rotate(float *x, const float *cos, const float *sin, int B, int T, int NH, int D,
                   float dir) {
    size_t pairs = (size_t)B * T * NH * (D / 2);
    bf16_copies_stale(x, (size_t)B * T * NH * D * sizeof(float));
    if (pairs == 0) return;
    rotate_kernel<<<blocks_for(pairs, 256), 256>>>(x, cos, sin, T, NH, D, dir, pairs);
    cudaCheckLaunch();
}

// x: (B, T, NH, D) in place; cos, sin: (T, D/2)
// out[i] = x[i] cos - x[i + D/2] sin;  out[i + D/2] = x[i + D/2] cos + x[i] sin
void rope_forward(float *x, const float *cos, const float *sin, int B, int T, int NH, int D) {
    PROFILE(PROFILE_OTHER);
    rotate(x, cos, sin, B, T, NH, D, 1.0f);
}

// forward: out = R(theta) x, R orthogonal  =>  dx = R(theta)^T dout = R(-theta) dout
void rope_backward(float *dx, const float *cos, const float *sin, int B, int T, int NH, int D) {
    PROFILE(PROFILE_OTHER);
    rotate(dx, cos, sin, B, T, NH, D, -1.0f);
}
