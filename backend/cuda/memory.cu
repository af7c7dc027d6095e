// Device selection and device memory on the GPU: cudaMalloc (never managed memory), copies on the
// compute stream, memory in use from cudaMemGetInfo and the peak FLOP/s for MFU.
#include "backend/cuda/common.h"
#include <sched.h>
#include <string.h>

cublasHandle_t cublas_handle;
int device_selected = 0;

// ---------------------------------------------------------------------------------------------
// The profiler (PICOTRON_PROFILE=1, see common.h). Event pairs wait in a pool and are read in
// one synchronization when it fills and at exit, so profiling adds no synchronization per call.
#define PROFILE_POOL 4096
int profile_enabled = 0;
static struct {
    cudaEvent_t start[PROFILE_POOL], end[PROFILE_POOL];
    int category[PROFILE_POOL];
    int used;                      // pairs recorded since the last drain
    int depth;                     // nesting of the backend call in progress
    int started;                   // `first` was recorded
    cudaEvent_t first;             // the start of the first profiled call
    double ms[PROFILE_CATEGORIES]; // GPU milliseconds per category
    long calls[PROFILE_CATEGORIES];
    double span_ms; // first profiled call to the end of the last one drained
    int rank;
} prof;

// reads and recycles the pairs recorded so far; returns the first CUDA error instead of ending
// the job, since the report at exit must not call exit again
static cudaError_t profile_drain(void) {
    if (prof.used == 0) return cudaSuccess;
    cudaError_t err = cudaEventSynchronize(prof.end[prof.used - 1]);
    for (int i = 0; i < prof.used && err == cudaSuccess; i++) {
        float ms = 0.0f;
        err = cudaEventElapsedTime(&ms, prof.start[i], prof.end[i]);
        prof.ms[prof.category[i]] += ms;
    }
    float span = 0.0f;
    if (err == cudaSuccess) err = cudaEventElapsedTime(&span, prof.first, prof.end[prof.used - 1]);
    prof.span_ms = span;
    prof.used = 0;
    return err;
}

void profile_begin(int category) {
    if (prof.depth++ > 0) return; // inside another backend call: that one counts
    if (prof.used == PROFILE_POOL) cudaCheck(profile_drain());
    prof.category[prof.used] = category;
    prof.calls[category]++;
    cudaCheck(cudaEventRecord(prof.start[prof.used], 0));
    if (!prof.started) cudaCheck(cudaEventRecord(prof.first, 0));
    prof.started = 1;
}

void profile_end(void) {
    if (--prof.depth > 0) return;
    cudaCheck(cudaEventRecord(prof.end[prof.used], 0));
    prof.used++;
}

// at exit, from world rank 0: the time the compute stream spent in each kind of backend call.
// Overlapped NCCL work on the groups' streams is not in it; only the time the compute stream spent
// issuing or waiting for communication is, i.e. the exposed communication.
static void profile_report(void) {
    // exiting from inside a call, or after a CUDA error: the job failed, no report
    if (prof.depth > 0 || profile_drain() != cudaSuccess) return;
    if (prof.rank != 0 || prof.span_ms <= 0.0) return;
    static const char *names[PROFILE_CATEGORIES] = {"GEMM", "attention", "other kernels",
                                                    "communication"};
    double in_calls = 0.0;
    printf("profile: GPU time of rank 0's backend calls on the compute stream\n");
    for (int c = 0; c < PROFILE_CATEGORIES; c++) {
        in_calls += prof.ms[c];
        printf("profile: %-15s %11.2f ms %6.2f%% %9ld calls\n", names[c], prof.ms[c],
               100.0 * prof.ms[c] / prof.span_ms, prof.calls[c]);
    }
    double outside = prof.span_ms - in_calls;
    printf("profile: %-15s %11.2f ms %6.2f%% (host time between calls: the GPU idles)\n",
           "outside calls", outside, 100.0 * outside / prof.span_ms);
    printf("profile: span %.2f ms, from the first profiled call to the end of the last\n",
           prof.span_ms);
    fflush(stdout);
}

static void profile_init(void) {
    for (int i = 0; i < PROFILE_POOL; i++) {
        cudaCheck(cudaEventCreate(&prof.start[i]));
        cudaCheck(cudaEventCreate(&prof.end[i]));
    }
    cudaCheck(cudaEventCreate(&prof.first));
    prof.rank = world_rank();
    atexit(profile_report); // after the CUDA runtime's own handlers were registered: runs first
    profile_enabled = 1;
}

// ---------------------------------------------------------------------------------------------
// Rank -> GPU: ranks on one node (local_rank, from MPI_Comm_split_type in train.c) take the GPUs
// in turn; more ranks than GPUs share them, which only the "mpi" communication backend allows
// (group_init refuses it for "nccl").
void backend_init(int local_rank) {
    // every kernel loaded at start: CUDA's lazy loading would load one at its first launch, a
    // device-wide synchronisation that can stall behind an NCCL kernel waiting for its peers
    setenv("CUDA_MODULE_LOADING", "EAGER", 0);
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0)
        user_error("no CUDA GPU found (%s): build for the CPU with `make` and set "
                   "distributed.use_cpu to true",
                   cudaGetErrorString(err));
    cudaCheck(cudaSetDevice(local_rank % count));
    cublasCheck(cublasCreate(&cublas_handle));
    // fp32 GEMMs stay fp32: no TF32 tensor cores, so the GPU matches the CPU build to 1e-5
    cublasCheck(cublasSetMathMode(cublas_handle, CUBLAS_DEFAULT_MATH));
    cublasCheck(cublasSetStream(cublas_handle, 0));
    device_selected = 1;
    const char *profile = getenv("PICOTRON_PROFILE");
    if (profile && profile[0] && strcmp(profile, "0") != 0) profile_init();
}

void backend_set_dtype(const char *dtype) {
    if (strcmp(dtype, "float32") == 0) {
        compute_bf16 = 0;
        return;
    }
    if (strcmp(dtype, "bfloat16") != 0)
        user_error("model.dtype = \"%s\" must be \"float32\" or \"bfloat16\"", dtype);
    if (!device_selected)
        FAIL("call backend_init(local_rank) first",
             "backend_set_dtype before the GPU was selected");
    int dev = 0;
    cudaDeviceProp prop;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaGetDeviceProperties(&prop, dev));
    if (prop.major < 8) // cuBLAS's bf16 GEMMs need Ampere's tensor cores
        user_error("model.dtype = \"bfloat16\" needs a GPU of compute capability 8.0 or newer, "
                   "%s is %d.%d: set model.dtype to \"float32\"",
                   prop.name, prop.major, prop.minor);
    compute_bf16 = 1;
}

// device_malloc's own count: the live allocations and their sizes (a few hundred; freed at the end)
static struct {
    void *ptr;
    size_t bytes;
} *live;
static int num_live, live_cap;
static size_t allocated, allocated_peak;

void *device_malloc(size_t bytes) {
    void *ptr = NULL;
    // never NULL: callers pass NULL to mean "no such output" (matmul_backward)
    cudaCheck(cudaMalloc(&ptr, bytes ? bytes : 1));
    cudaCheck(cudaMemset(ptr, 0, bytes ? bytes : 1));
    bf16_copies_stale(ptr, bytes);
    if (num_live == live_cap) {
        live_cap = live_cap ? 2 * live_cap : 256;
        live = (decltype(live))realloc(live, live_cap * sizeof *live);
        if (!live) FAIL("out of host memory", "cannot grow the table of device allocations");
    }
    live[num_live++] = {ptr, bytes};
    allocated += bytes;
    if (allocated > allocated_peak) allocated_peak = allocated;
    return ptr;
}

size_t device_allocated_peak(void) {
    return allocated_peak;
}

void *device_scratch(DeviceScratch *s, size_t bytes) {
    if (bytes > s->bytes) {
        if (s->ptr) cudaCheck(cudaFreeAsync(s->ptr, 0));
        cudaCheck(cudaMallocAsync(&s->ptr, bytes, 0));
        s->bytes = bytes;
    }
    return s->ptr;
}

void device_free(void *ptr) {
    if (!ptr) return;
    for (int i = 0; i < num_live; i++)
        if (live[i].ptr == ptr) {
            bf16_memory_freed(ptr, live[i].bytes);
            allocated -= live[i].bytes;
            live[i] = live[--num_live];
            break;
        }
    cudaCheck(cudaFree(ptr));
}

void device_zero(void *ptr, size_t bytes) {
    PROFILE(PROFILE_OTHER);
    bf16_copies_stale(ptr, bytes);
    if (bytes) cudaCheck(cudaMemsetAsync(ptr, 0, bytes, 0));
}

void device_copy(void *dst, const void *src, size_t bytes) {
    PROFILE(PROFILE_OTHER);
    bf16_copies_stale(dst, bytes);
    if (bytes) cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0));
}

// synchronous on pageable host memory, so the host buffer may be reused on return, as on the CPU
void host_to_device(void *dst, const void *src, size_t bytes) {
    PROFILE(PROFILE_OTHER);
    bf16_copies_stale(dst, bytes);
    if (bytes) cudaCheck(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

// The watchdog's wait for the compute stream: an event polled, since cudaMemcpy and
// cudaDeviceSynchronize would block forever behind a kernel (or an NCCL collective whose peer
// stopped) that never ends
static void wait_for_compute_stream(void) {
    static cudaEvent_t queued_so_far;
    if (!queued_so_far)
        cudaCheck(cudaEventCreateWithFlags(&queued_so_far, cudaEventDisableTiming));
    cudaCheck(cudaEventRecord(queued_so_far, 0));
    double started = now_seconds();
    cudaError_t st;
    while ((st = cudaEventQuery(queued_so_far)) == cudaErrorNotReady) {
        comm_watchdog_device(started);
        sched_yield();
    }
    cudaCheck(st);
}

void device_to_host(void *dst, const void *src, size_t bytes) {
    PROFILE(PROFILE_OTHER);
    if (!bytes) return;
    wait_for_compute_stream();
    cudaCheck(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

void device_synchronize(void) {
    wait_for_compute_stream();
    cudaCheck(cudaDeviceSynchronize()); // the groups' own streams: their waits poll in comm_wait
}

// Memory in use on this GPU as nvidia-smi shows it (total - free): it includes the CUDA context
// and cuBLAS/NCCL workspaces, and every process when several ranks share the GPU.
size_t device_memory_used(void) {
    size_t free_bytes = 0, total_bytes = 0;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    return total_bytes - free_bytes;
}

// Dense peaks from the vendors' data sheets, FLOP/s. MFU is measured against the bf16 tensor-core
// peak, as picotron does, whatever dtype the model computes in (an fp32 run therefore shows a
// low MFU: its real ceiling is the fp32 column). The first matching name wins.
typedef struct {
    const char *name;  // substring of cudaDeviceProp.name
    double bf16, fp32; // bf16 dense tensor core; fp32 without tensor cores
} PeakFlops;

static const PeakFlops peak_table[] = {
    {"H100 PCIe", 756.0e12, 51.2e12}, {"H100", 989.5e12, 67.0e12}, // SXM, NVL
    {"H200", 989.5e12, 67.0e12},      {"H800", 989.5e12, 67.0e12}, {"GH200", 989.5e12, 67.0e12},
    {"A100", 312.0e12, 19.5e12},      {"A800", 312.0e12, 19.5e12}, {"L40S", 362.05e12, 91.6e12},
    {"A10G", 70.0e12, 31.2e12},       {"A10", 125.0e12, 31.2e12},
};

// PICOTRON_PEAK_FLOPS (FLOP/s) overrides the table; an unknown GPU without it gives 0 (no MFU)
// after one line saying how to set it. A rank has a GPU of its own (NCCL's rule): ranks_on_node
// does not change its peak (ranks that share one GPU through "mpi" each report the whole peak).
double device_peak_flops(int ranks_on_node) {
    (void)ranks_on_node;
    const char *env = getenv("PICOTRON_PEAK_FLOPS");
    if (env && env[0]) {
        char *end;
        double value = strtod(env, &end);
        if (*end != '\0' || !(value > 0.0))
            user_error("PICOTRON_PEAK_FLOPS = '%s' is not a positive number of FLOP/s (e.g. "
                       "989.5e12), unset it to use the table of known GPUs",
                       env);
        return value;
    }
    int dev = 0;
    cudaDeviceProp prop;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaGetDeviceProperties(&prop, dev));
    for (size_t i = 0; i < sizeof peak_table / sizeof peak_table[0]; i++)
        if (strstr(prop.name, peak_table[i].name)) return peak_table[i].bf16;
    static int warned = 0;
    if (!warned && world_rank() == 0)
        fprintf(stderr,
                "unknown GPU \"%s\": MFU needs its peak; set environment.PEAK_FLOPS in the "
                "config or PICOTRON_PEAK_FLOPS (FLOP/s)\n",
                prop.name);
    warned = 1;
    return 0.0;
}
