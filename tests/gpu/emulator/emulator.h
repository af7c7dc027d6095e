// A CPU emulator of the parts of CUDA, cuBLAS and NCCL that backend/cuda uses, so the GPU build's
// own sources run on a machine without a GPU: `make GPU=emulate` (tests/t_81_gpu_emulated.sh).
// What it proves: the kernels' index arithmetic and their block and warp synchronisation
// (every lane of a warp at the same warp operation), the tensor-core tiles of WMMA used as CUDA
// specifies them (warp-collective, aligned, no reliance on the fragments' layout), the cuBLAS
// argument conventions (column-major, leading dimensions, transposes), the NCCL calls'
// arguments and pairing, and the launch limits of a real GPU (H100: 1024 threads a block,
// grid.y and grid.z <= 65535, 48 KiB of dynamic shared memory unless a kernel asks for up to
// 227 KiB), and the waits of asynchronous communication: a collective on a created stream
// delivers its output only once the host has waited for it, and reads NaN before. What it cannot
// prove: speed, memory coalescing, concurrency between blocks or between kernels (each launch
// runs to completion when it is issued), NCCL's own progress rules, and CUDA's libm: a real GPU
// run is still needed before calling the GPU path working.
//
// How a kernel runs: the blocks one after another; inside a block, every CUDA thread is a
// coroutine with its own stack, and the threads take turns between synchronisation points
// (__syncthreads, __syncwarp, the warp shuffles, WMMA's calls), so shared memory and warp exchanges
// behave as the programming model promises and no more. Environment:
//   PICOTRON_EMU_ORDER=forward|reverse|shuffle   the order threads and blocks take turns in
//   PICOTRON_EMU_RACECHECK=1   run every launch in two orders on the same inputs and fail if any
//                              byte of device memory differs: a missing barrier shows up there
//   PICOTRON_EMU_DEVICES=N     the number of emulated GPUs (default 1)
//   PICOTRON_EMU_SKIP_COMPUTE=1  check every launch and GEMM but run none: a step at sizes too
//                              large to emulate still meets every launch limit
// Host code sees device memory as host memory; the emulator keeps a table of cudaMalloc'd
// ranges and refuses copies, GEMM operands and kernel pointer arguments outside them.
#pragma once
#include <math.h>
#include <mpi.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <type_traits>

// ---------------------------------------------------------------------------------------------
// CUDA C++ keywords
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __shared__ static // blocks run one at a time: a static is one block's shared memory

struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
    dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};
// the running thread's coordinates, set by the emulator at every switch between threads
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
static const int warpSize = 32;

void __syncthreads(void);
void __syncwarp(unsigned int mask = 0xffffffffu);
// every lane of the warp posts `value` and gets that of lane (own lane ^ lane_mask)
uint64_t emu_warp_exchange(unsigned int mask, uint64_t value, int lane_mask, const char *what);
void *emu_dynamic_shared(void); // `extern __shared__ T name[]` (rewritten by translate.pl)

template <typename T> static inline T __shfl_xor_sync(unsigned int mask, T v, int lane_mask) {
    static_assert(sizeof(T) <= 8, "a shuffled value is at most 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof(T));
    bits = emu_warp_exchange(mask, bits, lane_mask, "__shfl_xor_sync");
    memcpy(&v, &bits, sizeof(T));
    return v;
}

// ---------------------------------------------------------------------------------------------
// bf16 (cuda_bf16.h)
struct __nv_bfloat16 {
    uint16_t x;
};
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    __nv_bfloat16 b;
    if ((u & 0x7fffffffu) > 0x7f800000u)
        b.x = 0x7fc0; // NaN stays a NaN
    else
        b.x = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); // nearest, ties to even
    return b;
}
static inline float __bfloat162float(__nv_bfloat16 b) {
    uint32_t u = (uint32_t)b.x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// ---------------------------------------------------------------------------------------------
// Warp matrix multiply-accumulate (mma.h, nvcuda::wmma): the m16n16k16 shape, bf16 operands and
// fp32 accumulators. A fragment holds each lane's 8 elements of a 16x16 tile. Which lane holds
// which element CUDA leaves unspecified, so the emulator scatters them by permutations of its own
// (one for matrix_a, one for matrix_b, one for accumulators): code that reads or writes elements
// by position, instead of through load/store_matrix_sync, computes garbage here as it would on
// some GPU; element-wise work on a whole fragment (scaling every x[i]) is portable and works.
// load_matrix_sync, store_matrix_sync and mma_sync are warp-collective: the 32 lanes must meet
// at the same call with the same pointer, leading dimension and layout (or the launch is
// refused); the pointer must be 32-byte aligned and ldm a multiple of 16 bytes, as CUDA requires.
// A product is exact in fp32 (bf16 has 8 significant bits) and the emulator sums the 16 of each
// element in k order, in fp32, after the accumulator's value.
enum EmuFragKind { EMU_FRAG_A, EMU_FRAG_B, EMU_FRAG_ACC };
void emu_wmma_load(void *x, EmuFragKind kind, const void *ptr, unsigned ldm, bool col_major);
void emu_wmma_store(void *ptr, const float *x, unsigned ldm, bool col_major);
void emu_wmma_mma(float *d, const __nv_bfloat16 *a, const __nv_bfloat16 *b, const float *c);

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename T, int size> struct __frag_base {
    T x[size];
    enum { num_elements = size };
};
template <typename Use, int m, int n, int k, typename T, typename Layout = void>
struct fragment : __frag_base<T, 8> {
    static_assert(m == 16 && n == 16 && k == 16, "the emulator has WMMA's m16n16k16 shape only");
    static_assert(std::is_same<Use, accumulator>::value ? std::is_same<T, float>::value
                                                        : std::is_same<T, __nv_bfloat16>::value,
                  "the emulator has bf16 operands and fp32 accumulators only");
};

template <typename Use, typename T, typename Layout>
static inline void fill_fragment(fragment<Use, 16, 16, 16, T, Layout> &f, const T &v) {
    for (int i = 0; i < f.num_elements; i++) f.x[i] = v;
}
template <typename Use, typename Layout>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, Layout> &f,
                                    const __nv_bfloat16 *ptr, unsigned ldm) {
    static_assert(std::is_same<Layout, row_major>::value || std::is_same<Layout, col_major>::value,
                  "an operand fragment names its layout");
    emu_wmma_load(f.x, std::is_same<Use, matrix_a>::value ? EMU_FRAG_A : EMU_FRAG_B, ptr, ldm,
                  std::is_same<Layout, col_major>::value);
}
static inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *ptr,
                                    unsigned ldm, layout_t layout) {
    emu_wmma_load(f.x, EMU_FRAG_ACC, ptr, ldm, layout == mem_col_major);
}
static inline void store_matrix_sync(float *ptr, const fragment<accumulator, 16, 16, 16, float> &f,
                                     unsigned ldm, layout_t layout) {
    emu_wmma_store(ptr, f.x, ldm, layout == mem_col_major);
}
template <typename LayoutA, typename LayoutB>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                            const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LayoutA> &a,
                            const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LayoutB> &b,
                            const fragment<accumulator, 16, 16, 16, float> &c) {
    emu_wmma_mma(d.x, a.x, b.x, c.x);
}
} // namespace wmma
} // namespace nvcuda

// ---------------------------------------------------------------------------------------------
// the CUDA runtime (cuda_runtime.h)
typedef enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorLaunchFailure = 719,
} cudaError_t;
typedef enum {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
} cudaMemcpyKind;
typedef enum { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 } cudaFuncAttribute;
typedef struct EmuStream *cudaStream_t;
typedef struct EmuEvent *cudaEvent_t;
#define cudaStreamNonBlocking  0x01
#define cudaEventDisableTiming 0x02
struct cudaDeviceProp {
    char name[256];
    int major, minor;
    size_t totalGlobalMem, sharedMemPerBlock, sharedMemPerBlockOptin;
    int multiProcessorCount, maxThreadsPerBlock;
};

const char *cudaGetErrorString(cudaError_t err);
cudaError_t cudaGetLastError(void);
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device);
cudaError_t cudaMalloc(void **ptr, size_t bytes);
template <typename T> static inline cudaError_t cudaMalloc(T **ptr, size_t bytes) {
    return cudaMalloc((void **)ptr, bytes);
}
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMallocAsync(void **ptr, size_t bytes, cudaStream_t stream);
cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream);
cudaError_t cudaDeviceGetPCIBusId(char *bus_id, int len, int device);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaMemset(void *ptr, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void *ptr, int value, size_t bytes, cudaStream_t stream);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags);
cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t emu_func_set_attribute(const void *func, cudaFuncAttribute attr, int value);
template <typename F>
static inline cudaError_t cudaFuncSetAttribute(F *func, cudaFuncAttribute attr, int value) {
    return emu_func_set_attribute((const void *)func, attr, value);
}

// ---------------------------------------------------------------------------------------------
// kernel launches: translate.pl rewrites `k<<<grid, block, smem, stream>>>(args)` into
// `emu_launch(emu_config(grid, block, smem, stream), "k", k, args)`
struct EmuConfig {
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
};
static inline EmuConfig emu_config(dim3 grid, dim3 block, size_t smem = 0, cudaStream_t s = 0) {
    return EmuConfig{grid, block, smem, s};
}
// runs body(ctx) as every thread of the grid; returns 0 when the launch was refused
int emu_run_grid(const EmuConfig &c, const char *name, const void *kernel, void (*body)(void *),
                 void *ctx);
// a kernel's pointer argument must point into memory from cudaMalloc
void emu_check_pointer_arg(const char *kernel, int index, const void *ptr);

template <typename T> static inline void emu_check_arg(const char *kernel, int index, const T &a) {
    if constexpr (std::is_pointer<T>::value) emu_check_pointer_arg(kernel, index, (const void *)a);
    (void)kernel, (void)index, (void)a;
}

template <typename... P, typename... A>
static inline void emu_launch(EmuConfig c, const char *name, void (*kernel)(P...), A... args) {
    int index = 0;
    (emu_check_arg(name, index++, args), ...);
    auto packed = [&]() { kernel(args...); };
    using Packed = decltype(packed);
    emu_run_grid(
        c, name, (const void *)kernel, [](void *p) { (*(Packed *)p)(); }, (void *)&packed);
}

// ---------------------------------------------------------------------------------------------
// cuBLAS (cublas_v2.h): GEMMs, single and strided-batched; fp32 or bf16 operands (fp32 ones
// optionally rounded to TF32), fp32 output and accumulation
typedef struct EmuCublas *cublasHandle_t;
typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15
} cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUBLAS_DEFAULT_MATH = 0, CUBLAS_TF32_TENSOR_OP_MATH = 3 } cublasMath_t;
typedef enum { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_TF32 = 77 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16BF = 14 } cudaDataType;

cublasStatus_t cublasCreate(cublasHandle_t *handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
const char *cublasGetStatusString(cublasStatus_t status);
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo);
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void *alpha, const void *A, cudaDataType Atype,
                                          int lda, long long stride_a, const void *B,
                                          cudaDataType Btype, int ldb, long long stride_b,
                                          const void *beta, void *C, cudaDataType Ctype, int ldc,
                                          long long stride_c, int count,
                                          cublasComputeType_t compute, cublasGemmAlgo_t algo);

// ---------------------------------------------------------------------------------------------
// NCCL (nccl.h) over MPI: a communicator is an MPI communicator of the same ranks
typedef struct EmuNccl *ncclComm_t;
typedef struct {
    char internal[128];
} ncclUniqueId;
typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5
} ncclResult_t;
typedef enum { ncclFloat = 7 } ncclDataType_t;
typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3 } ncclRedOp_t;

const char *ncclGetErrorString(ncclResult_t result);
ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error);
ncclResult_t ncclAllReduce(const void *sendbuf, void *recvbuf, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                               ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t ncclAllGather(const void *sendbuf, void *recvbuf, size_t sendcount,
                           ncclDataType_t type, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void *sendbuf, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
