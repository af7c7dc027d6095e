// HOST_DEVICE marks a function that backend/cpu/*.c and backend/cuda/*.cu both compile from one
// source (the CPU twin and its CUDA kernel then share the formula, not a copy of it).
#pragma once

#ifdef __CUDACC__
#define HOST_DEVICE __host__ __device__
#else
#define HOST_DEVICE
#endif
