// A vectorisable exp() for the CPU kernels' softmax (attention) and sigmoid (SwiGLU) loops.
#pragma once
#include <stdint.h>

// exp(x) written so that gcc vectorises the softmax loops (libm's expf is a call per element
// there, which cost as much as both GEMMs). Cephes' expf: x = n ln2 + r, |r| <= ln2/2, exp(r) by
// a minimax polynomial, 2^n put into the exponent bits. Within 1.02 ulp of exp on [-87, 1]
// (checked against double exp on every third float); 0 below -87, where exp < 1.7e-38, so the
// causal mask's exp(-inf) is exactly 0; a NaN stays a NaN. Above 88 it saturates at exp(88),
// which leaves SwiGLU's sigmoid(g) = 1/(1 + exp(-g)) at 0 to float precision.
static inline float exp_approx(float x) {
    union {
        float f;
        uint32_t u;
    } t, scale;
    float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    // n = round(x / ln2) by the 1.5 * 2^23 trick: the low mantissa bits of t hold n + 127
    t.f = xc * 1.44269504f + (12582912.0f + 127.0f);
    float n = t.f - (12582912.0f + 127.0f);
    float r = xc - n * 0.693359375f - n * -2.12194440e-4f; // ln2 in two parts (Cody-Waite)
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    scale.u = (t.u & 0xff) << 23; // 2^n as a float: exponent field n + 127
    return x < -87.0f ? 0.0f : p * scale.f;
}
