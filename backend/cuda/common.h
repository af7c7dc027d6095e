// What every CUDA file of the backend shares: the C interface (extern "C", so the C files of the
// model link against these definitions), the checking macros, the cuBLAS handle and the streams.
#pragma once
#include <mpi.h> // before the extern "C" block: it has its own C++ guards
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublas_v2.h>
#include <nccl.h>

extern "C" {
#include "utils.h"
#include "backend/backend.h"
#include "backend/comm.h"
#include "backend/comm_log.h"
}

// Every CUDA, cuBLAS and NCCL call goes through one of these: a failure prints
// "[rank r] file:line call failed: reason", a hint, and ends the whole job (fail_at: MPI_Abort).
#define cudaCheck(call)   cuda_check((call), #call, __FILE__, __LINE__)
#define cublasCheck(call) cublas_check((call), #call, __FILE__, __LINE__)
#define ncclCheck(call)   nccl_check((call), #call, __FILE__, __LINE__)
// after a kernel launch: a bad launch configuration shows up here, a fault at the next sync
#define cudaCheckLaunch() cudaCheck(cudaGetLastError())

static inline void cuda_check(cudaError_t err, const char *what, const char *file, int line) {
    if (err == cudaSuccess) return;
    const char *hint = "run with CUDA_LAUNCH_BLOCKING=1 (and compute-sanitizer) to find the kernel";
    if (err == cudaErrorMemoryAllocation)
        hint = "out of GPU memory: lower training.micro_batch_size or seq_length, or raise tp/pp";
    else if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver)
        hint = "no usable GPU here: build for the CPU with `make` and set distributed.use_cpu true";
    fail_at(file, line, hint, "%s failed: %s", what, cudaGetErrorString(err));
}

static inline void cublas_check(cublasStatus_t st, const char *what, const char *file, int line) {
    if (st == CUBLAS_STATUS_SUCCESS) return;
    fail_at(file, line, "a GEMM size or pointer is wrong, or the GPU is out of memory",
            "%s failed: %s", what, cublasGetStatusString(st));
}

static inline void nccl_check(ncclResult_t r, const char *what, const char *file, int line) {
    if (r == ncclSuccess) return;
    fail_at(file, line,
            "rerun with NCCL_DEBUG=WARN; several ranks on one GPU need distributed.backend \"mpi\"",
            "%s failed: %s", what, ncclGetErrorString(r));
}

// The compute stream is the legacy default stream: cudaMemcpy orders with it and every kernel,
// cuBLAS call and blocking collective runs on it in program order, as the CPU code runs.
// Each NCCL group has its own non-blocking stream for its asynchronous collectives, ordered
// after the compute stream by events (backend/cuda/comm_nccl.cu).
extern cublasHandle_t cublas_handle;
extern int device_selected; // backend_init() has run: the GPU, the handle and the stream exist

// a 1-D launch of n threads
static inline unsigned int blocks_for(size_t n, int threads) {
    size_t b = (n + threads - 1) / threads;
    return (unsigned int)(b > 0 ? b : 1);
}

// warp-level sums and maxima (all 32 lanes take part)
__device__ static inline float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ static inline double warp_sum_double(double x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ static inline float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// The row kernels (RMSNorm, cross-entropy, softmax) give each row a block of ROW_THREADS threads.
// block_reduce<IS_MAX>: fmaxf or + of x over such a block, returned to every thread: each warp
// reduces in registers, then the first warp reduces the warps' results from shared memory.
#define ROW_THREADS 256
template <bool IS_MAX> __device__ static inline float block_reduce(float x) {
    __shared__ float warp_vals[ROW_THREADS / 32];
    __shared__ float total;
    x = IS_MAX ? warp_max(x) : warp_sum(x);
    if (threadIdx.x % 32 == 0) warp_vals[threadIdx.x / 32] = x;
    __syncthreads();
    if (threadIdx.x < 32) {
        x = threadIdx.x < ROW_THREADS / 32 ? warp_vals[threadIdx.x] : (IS_MAX ? -INFINITY : 0.0f);
        x = IS_MAX ? warp_max(x) : warp_sum(x);
        if (threadIdx.x == 0) total = x;
    }
    __syncthreads();
    return total;
}

// A device buffer reused from call to call, grown when a call needs more. Stream-ordered
// (cudaMallocAsync/cudaFreeAsync on the compute stream): the old buffer goes after the work
// queued before has read it, with no device-wide synchronisation (cudaFree's), which could wait
// on an NCCL kernel that waits on a peer.
typedef struct {
    void *ptr;
    size_t bytes;
} DeviceScratch;
void *device_scratch(DeviceScratch *s, size_t bytes);

// ---------------------------------------------------------------------------------------------
// The opt-in profiler (environment PICOTRON_PROFILE=1, read by backend_init): a pair of CUDA
// events on the compute stream around each backend call, summed per category and printed by
// world rank 0 at exit (backend/cuda/memory.cu). A call made inside another (comm_wait inside
// all_reduce, scale_inplace inside comm_wait) counts once, for the outer one. When it is off, a
// call pays one load and one branch.
enum ProfileCategory {
    PROFILE_GEMM,      // matmul_forward/backward, including the bf16 casts of autocast
    PROFILE_ATTENTION, // attention_* kernels
    PROFILE_OTHER,     // every other kernel, memset and copy
    PROFILE_COMM,      // collectives and point-to-point, and waiting for them
    PROFILE_CATEGORIES
};
extern int profile_enabled;
void profile_begin(int category);
void profile_end(void);

struct ProfileScope {
    int on;
    explicit ProfileScope(int category) : on(profile_enabled) {
        if (on) profile_begin(category);
    }
    ~ProfileScope() {
        if (on) profile_end();
    }
};
#define PROFILE(category) ProfileScope profile_scope_(category)

// "bfloat16": the matrix products read bf16 copies of their operands (backend/cuda/matmul.cu)
extern int compute_bf16;
// The copies stay sound inside the backend, with no rule on its callers: every backend call that
// writes device memory first tells bf16_copies_stale what it writes (dst, bytes), and the copies
// of memory it overlaps are not read again; device_free tells bf16_memory_freed, which forgets
// the copies and the weights' casts of what it frees (freed memory may become any tensor).
void bf16_copies_stale(const void *ptr, size_t bytes);
void bf16_memory_freed(const void *ptr, size_t bytes);
// A kernel that writes a product's input x (n floats) whole calls this instead (it counts as the
// write): it returns x's bf16 copy to write beside x (each element rounded as the products' casts
// round it), or NULL when none is wanted (float32, or the test switch CAST_AT_EVERY_PRODUCT).
__nv_bfloat16 *bf16_copy_to_write(const float *x, size_t n);
