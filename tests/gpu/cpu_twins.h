// The CPU twin of every kernel in backend/backend.h, under the name cpu_<name>, so one test binary
// holds both devices. tests/gpu/build_test.sh compiles backend/cpu/<file>.c with
// -D<name>=cpu_<name> for each X(<name>) line below (it reads them from this file); here each
// twin is declared with its CUDA twin's own type, so a signature that drifts fails to compile.
#pragma once
#include "backend/backend.h"

#define CPU_TWINS(X)                                                                               \
    X(fill)                                                                                        \
    X(add_inplace)                                                                                 \
    X(scale_inplace)                                                                               \
    X(scale_rows)                                                                                  \
    X(sum_squares)                                                                                 \
    X(sum_reduce)                                                                                  \
    X(matmul_forward)                                                                              \
    X(matmul_backward)                                                                             \
    X(matmul_backward_write)                                                                       \
    X(embedding_forward)                                                                           \
    X(embedding_backward)                                                                          \
    X(rmsnorm_forward)                                                                             \
    X(rmsnorm_backward)                                                                            \
    X(rope_forward)                                                                                \
    X(rope_backward)                                                                               \
    X(attention_forward_block)                                                                     \
    X(attention_backward_delta)                                                                    \
    X(attention_backward_block)                                                                    \
    X(swiglu_forward)                                                                              \
    X(swiglu_backward)                                                                             \
    X(moe_router_forward)                                                                          \
    X(moe_dispatch)                                                                                \
    X(moe_load)                                                                                    \
    X(moe_gather_forward)                                                                          \
    X(moe_gather_backward)                                                                         \
    X(moe_combine_forward)                                                                         \
    X(moe_combine_backward)                                                                        \
    X(moe_router_backward)                                                                         \
    X(cross_entropy_stats)                                                                         \
    X(cross_entropy_rescale)                                                                       \
    X(cross_entropy_loss)                                                                          \
    X(cross_entropy_backward)                                                                      \
    X(adamw_update)                                                                                \
    X(init_tensor)

// Settings, not kernels: the CPU build computes in float32 only and keeps no bf16 copies, so no
// twin is linked for
//   X(backend_set_dtype)
//   X(backend_step_begin)
// (listed for t_80_gpu_build.sh, which wants every function of backend.h here); the bf16
// products they select are compared in test_matmul_bf16 and test_bf16_copies of
// tests/gpu/test_kernels_vs_cpu.c, and the copies against casting at every product by t_81 (4b).

#define DECLARE_CPU_TWIN(name) extern __typeof__(name) cpu_##name;
CPU_TWINS(DECLARE_CPU_TWIN)
#undef DECLARE_CPU_TWIN
