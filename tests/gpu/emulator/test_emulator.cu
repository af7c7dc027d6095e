// The emulator's own test: it runs correct CUDA as a GPU would, and it refuses what a GPU would
// get wrong. `test_emulator CASE` runs one case; tests/t_81_gpu_emulated.sh runs them all.
//   reduce              a block sum through shared memory and warp shuffles (2-D block): exact
//   race                a shared-memory read with no __syncthreads before it: with
//                       PICOTRON_EMU_RACECHECK=1 the emulator names the kernel
//   grid_y              grid.y = 65536: cudaErrorInvalidConfiguration
//   smem                64 KiB of dynamic shared memory without cudaFuncSetAttribute: refused;
//                       granted after it
//   host_pointer        a malloc'd pointer passed to a kernel: refused
//   shfl_after_exit     a full-mask shuffle after half the warp returned: refused
//   deadlock            thread 0 at __syncthreads while its warp waits at __syncwarp: named
//   gemm_ld             cublasGemmEx with lda < m: CUBLAS_STATUS_INVALID_VALUE
//   deferred            an all-reduce on a created stream: its output is NaN until an event
//                       recorded after it has been waited for, then the result
//   wmma                bf16 tensor-core tiles: 2 * (A @ B + C) with A row-major and B
//                       column-major, and A^T @ B^T stored column-major, against a host loop;
//                       exact (small integers: every product and sum is exact in fp32)
//   wmma_divergent      half the warp at mma_sync, the other half at __syncwarp: refused
//   wmma_misaligned     a tile loaded from a pointer 2 bytes past a 32-byte boundary: refused
// Exit 0 when the case behaved as stated (the refusals end the process with status 1 and a
// message, which the script checks).
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <math.h>
#include <mma.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__device__ static float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// out[blockIdx.x] = sum of in over the block's (32, 8) threads
__global__ static void block_sum_kernel(float *out, const float *in) {
    __shared__ float warp_sums[8];
    int tid = threadIdx.y * blockDim.x + threadIdx.x;
    float x = warp_sum(in[blockIdx.x * 256 + tid]);
    if (tid % 32 == 0) warp_sums[tid / 32] = x;
    __syncthreads();
    if (tid < 32) {
        x = warp_sum(tid < 8 ? warp_sums[tid] : 0.0f);
        if (tid == 0) out[blockIdx.x] = x;
    }
}

__global__ static void racy_kernel(float *out) {
    __shared__ float s[64];
    s[threadIdx.x] = (float)threadIdx.x;
    out[threadIdx.x] = s[(threadIdx.x + 1) % 64]; // the neighbour may not have written yet
}

__global__ static void dynamic_smem_kernel(float *out) {
    extern __shared__ float big[];
    big[threadIdx.x] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = big[(threadIdx.x + 1) % 32];
}

__global__ static void shfl_after_exit_kernel(float *out) {
    if (threadIdx.x >= 16) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

__global__ static void deadlock_kernel(float *out) {
    if (threadIdx.x == 0)
        __syncthreads();
    else
        __syncwarp();
    out[threadIdx.x] = 0.0f;
}

using namespace nvcuda;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> Accumulator;

// one warp: d (16, 16) = 2 * (a @ b + c), a row-major, b column-major, all with ld 16; then
// d + 256 = a^T @ b^T, reading a column-major and b row-major, stored column-major
__global__ static void wmma_kernel(float *d, const __nv_bfloat16 *a, const __nv_bfloat16 *b,
                                   const float *c) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a_rows;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b_cols;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::col_major> a_cols;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b_rows;
    Accumulator acc;
    wmma::load_matrix_sync(a_rows, a, 16);
    wmma::load_matrix_sync(b_cols, b, 16);
    wmma::load_matrix_sync(acc, c, 16, wmma::mem_row_major);
    wmma::mma_sync(acc, a_rows, b_cols, acc);
    for (int i = 0; i < acc.num_elements; i++) acc.x[i] *= 2.0f; // element-wise: any layout
    wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
    wmma::load_matrix_sync(a_cols, a, 16);
    wmma::load_matrix_sync(b_rows, b, 16);
    wmma::fill_fragment(acc, 0.0f);
    wmma::mma_sync(acc, a_cols, b_rows, acc);
    wmma::store_matrix_sync(d + 256, acc, 16, wmma::mem_col_major);
}

__global__ static void wmma_divergent_kernel(float *d) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
    Accumulator acc;
    wmma::fill_fragment(a, __float2bfloat16_rn(1.0f));
    wmma::fill_fragment(b, __float2bfloat16_rn(1.0f));
    wmma::fill_fragment(acc, 0.0f);
    if (threadIdx.x < 16)
        wmma::mma_sync(acc, a, b, acc);
    else
        __syncwarp();
    wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
}

__global__ static void wmma_misaligned_kernel(float *d, const __nv_bfloat16 *a) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> frag;
    wmma::load_matrix_sync(frag, a + 1, 16);
    d[threadIdx.x] = __bfloat162float(frag.x[0]);
}

static float *device_floats(size_t n) {
    float *p = NULL;
    if (cudaMalloc(&p, n * sizeof(float)) != cudaSuccess) exit(2);
    return p;
}

static int expect(int ok, const char *what) {
    printf("%s: %s\n", ok ? "ok" : "WRONG", what);
    return ok ? 0 : 1;
}

int main(int argc, char **argv) {
    const char *c = argc > 1 ? argv[1] : "";
    float *d = device_floats(4096);
    if (!strcmp(c, "reduce")) {
        float in[4 * 256], out[4];
        for (int i = 0; i < 4 * 256; i++) in[i] = (float)(i % 97); // integers: sums are exact
        cudaMemcpy(d, in, sizeof in, cudaMemcpyHostToDevice);
        block_sum_kernel<<<4, dim3(32, 8)>>>(d + 2048, d);
        cudaMemcpy(out, d + 2048, sizeof out, cudaMemcpyDeviceToHost);
        int bad = cudaGetLastError() != cudaSuccess;
        for (int b = 0; b < 4; b++) {
            double want = 0;
            for (int i = 0; i < 256; i++) want += in[b * 256 + i];
            bad |= out[b] != (float)want;
        }
        return expect(!bad, "4 block sums of 256 through shared memory and shuffles are exact");
    }
    if (!strcmp(c, "race")) {
        racy_kernel<<<1, 64>>>(d);
        return expect(1, "the racy kernel ran (it passes only without PICOTRON_EMU_RACECHECK)");
    }
    if (!strcmp(c, "grid_y")) {
        racy_kernel<<<dim3(1, 65536), 64>>>(d);
        return expect(cudaGetLastError() == cudaErrorInvalidConfiguration,
                      "grid.y = 65536 is an invalid configuration");
    }
    if (!strcmp(c, "smem")) {
        dynamic_smem_kernel<<<1, 32, 64 * 1024>>>(d);
        int refused = cudaGetLastError() != cudaSuccess;
        cudaFuncSetAttribute(dynamic_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             64 * 1024);
        dynamic_smem_kernel<<<1, 32, 64 * 1024>>>(d);
        int granted = cudaGetLastError() == cudaSuccess;
        return expect(refused && granted, "64 KiB refused by default, granted by the attribute");
    }
    if (!strcmp(c, "host_pointer")) {
        float *host = (float *)malloc(64 * sizeof(float));
        racy_kernel<<<1, 64>>>(host);
        return expect(0, "a host pointer reached a kernel");
    }
    if (!strcmp(c, "shfl_after_exit")) {
        shfl_after_exit_kernel<<<1, 32>>>(d);
        return expect(0, "a shuffle after lanes exited ran");
    }
    if (!strcmp(c, "deadlock")) {
        deadlock_kernel<<<1, 32>>>(d);
        return expect(0, "a deadlocked block finished");
    }
    if (!strcmp(c, "gemm_ld")) {
        cublasHandle_t h;
        cublasCreate(&h);
        const float one = 1.0f, zero = 0.0f;
        // C (8, 8) = A (8, 8) @ B (8, 8), but lda = 4 < m = 8
        cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, d, CUDA_R_32F,
                                         4, d + 64, CUDA_R_32F, 8, &zero, d + 128, CUDA_R_32F, 8,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        return expect(st == CUBLAS_STATUS_INVALID_VALUE, "lda < m is CUBLAS_STATUS_INVALID_VALUE");
    }
    if (!strcmp(c, "deferred")) {
        MPI_Init(&argc, &argv);
        ncclUniqueId id;
        ncclComm_t comm;
        cudaStream_t stream;
        cudaEvent_t done;
        ncclGetUniqueId(&id);
        ncclCommInitRank(&comm, 1, id, 0);
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        cudaEventCreate(&done);
        float in[4] = {1, 2, 3, 4}, early[4], late[4];
        cudaMemcpy(d, in, sizeof in, cudaMemcpyHostToDevice);
        ncclAllReduce(d, d, 4, ncclFloat, ncclSum, comm, stream);
        cudaMemcpy(early, d, sizeof early, cudaMemcpyDeviceToHost); // too soon: nothing waited
        cudaEventRecord(done, stream);
        cudaEventSynchronize(done);
        cudaMemcpy(late, d, sizeof late, cudaMemcpyDeviceToHost);
        int ok = 1;
        for (int i = 0; i < 4; i++) ok &= isnan(early[i]) && late[i] == in[i];
        ncclCommDestroy(comm);
        MPI_Finalize();
        return expect(ok, "an all-reduce's output reads NaN before its event is waited for");
    }
    if (!strcmp(c, "wmma")) {
        __nv_bfloat16 a[256], b[256];
        float fa[256], fb[256], fc[256], got[512];
        for (int i = 0; i < 256; i++) {
            fa[i] = (float)(i * 7 % 9 - 4), fb[i] = (float)(i * 5 % 7 - 3);
            fc[i] = (float)(i % 11 - 5);
            a[i] = __float2bfloat16_rn(fa[i]), b[i] = __float2bfloat16_rn(fb[i]);
        }
        __nv_bfloat16 *da = (__nv_bfloat16 *)(d + 1024), *db = (__nv_bfloat16 *)(d + 1280);
        cudaMemcpy(da, a, sizeof a, cudaMemcpyHostToDevice);
        cudaMemcpy(db, b, sizeof b, cudaMemcpyHostToDevice);
        cudaMemcpy(d + 1536, fc, sizeof fc, cudaMemcpyHostToDevice);
        wmma_kernel<<<1, 32>>>(d, da, db, d + 1536);
        cudaMemcpy(got, d, sizeof got, cudaMemcpyDeviceToHost);
        int bad = cudaGetLastError() != cudaSuccess;
        for (int r = 0; r < 16; r++)
            for (int n = 0; n < 16; n++) {
                float first = fc[r * 16 + n], second = 0.0f;
                for (int k = 0; k < 16; k++) {
                    first += fa[r * 16 + k] * fb[n * 16 + k];  // a (r, k) row-major, b col-major
                    second += fa[k * 16 + r] * fb[k * 16 + n]; // a^T (r, k), b^T (k, n)
                }
                bad |= got[r * 16 + n] != 2.0f * first || got[256 + n * 16 + r] != second;
            }
        return expect(!bad, "WMMA's 16x16x16 bf16 products equal the host's loops exactly");
    }
    if (!strcmp(c, "wmma_divergent")) {
        wmma_divergent_kernel<<<1, 32>>>(d);
        return expect(0, "an mma_sync met by half a warp ran");
    }
    if (!strcmp(c, "wmma_misaligned")) {
        wmma_misaligned_kernel<<<1, 32>>>(d, (const __nv_bfloat16 *)d);
        return expect(0, "a misaligned WMMA load ran");
    }
    fprintf(stderr, "unknown case '%s'\n", c);
    return 2;
}
