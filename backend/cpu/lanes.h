// Sums over a row in a fixed number of lanes, whatever the vector width: element i goes to lane
// i % SUM_LANES and the lanes are added in one fixed order. The compiler keeps the lanes in one
// AVX-512 vector or two AVX2 ones, with the same bits either way, where an `omp simd reduction`
// sums in as many lanes as the vectors hold: a run on an AVX2 CPU then drifted from the same run
// on an AVX-512 one (a 100-step run: the fourth digit of its losses).
#pragma once

#define SUM_LANES 16

// The pattern, for sum_c x[c] * y[c]:
//     float lane[SUM_LANES] = {0};
//     int c = 0;
//     for (; c + SUM_LANES <= C; c += SUM_LANES)
//         for (int l = 0; l < SUM_LANES; l++) lane[l] += x[c + l] * y[c + l];
//     for (; c < C; c++) lane[c % SUM_LANES] += x[c] * y[c];
//     float sum = sum_lanes(lane);

// lane[0] + ... + lane[15], pairwise, in place
static inline float sum_lanes(float lane[SUM_LANES]) {
    for (int width = SUM_LANES / 2; width > 0; width /= 2)
        for (int l = 0; l < width; l++) lane[l] += lane[l + width];
    return lane[0];
}
