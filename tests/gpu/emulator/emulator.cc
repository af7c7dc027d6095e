// The CPU emulator of CUDA, cuBLAS and NCCL behind `make GPU=emulate`: see emulator.h for what it
// proves and what it cannot. x86-64 only (the thread switch below is assembly).
#include "tests/gpu/emulator/emulator.h"
#include <algorithm>
#include <cblas.h>
#include <map>
#include <memory>
#include <sched.h>
#include <string>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <vector>

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

// a broken rule of the programming model: say which, and end the job as a GPU fault would
static void __attribute__((noreturn, format(printf, 1, 2))) emu_fail(const char *fmt, ...) {
    int rank = 0, initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "[rank %d] CUDA emulator: ", rank);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    fflush(stderr);
    if (initialized) MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

// ---------------------------------------------------------------------------------------------
// PICOTRON_EMU_CENSUS=FILE: how many times the program launched each kernel and called each
// cuBLAS GEMM, memset and device-to-device copy, written at exit to FILE (FILE.RANK under
// mpirun), a "count name" line each: what bench/roofline.c's rows must add up to
// (tests/t_83_roofline.sh)
static std::map<std::string, long> census;

static void write_census(void) {
    const char *path = getenv("PICOTRON_EMU_CENSUS"), *rank = getenv("PMI_RANK");
    std::string name = std::string(path) + (rank ? std::string(".") + rank : "");
    FILE *f = fopen(name.c_str(), "w");
    if (!f) {
        fprintf(stderr, "CUDA emulator: cannot write the census to %s\n", name.c_str());
        return;
    }
    for (auto &entry : census) fprintf(f, "%ld %s\n", entry.second, entry.first.c_str());
    if (fclose(f) != 0) fprintf(stderr, "CUDA emulator: writing %s failed\n", name.c_str());
}

// one more call of `name` (a kernel's template arguments dropped)
static void count_call(const char *name) {
    static int on = -1;
    if (on < 0) {
        const char *path = getenv("PICOTRON_EMU_CENSUS");
        on = path && path[0];
        if (on) atexit(write_census);
    }
    if (on) census[std::string(name, strcspn(name, "<"))]++;
}

// ---------------------------------------------------------------------------------------------
// device memory: host memory from cudaMalloc, remembered by range
static std::map<uintptr_t, size_t> allocations; // start -> bytes
static size_t allocated_bytes = 0;
static cudaError_t last_error = cudaSuccess;
static const size_t EMU_TOTAL_MEMORY = (size_t)141 << 30; // an H200's

// does [ptr, ptr + bytes) lie inside one allocation?
static bool is_device(const void *ptr, size_t bytes) {
    uintptr_t p = (uintptr_t)ptr;
    auto it = allocations.upper_bound(p);
    if (it == allocations.begin()) return false;
    --it;
    return p >= it->first && p + bytes <= it->first + it->second;
}

const char *cudaGetErrorString(cudaError_t err) {
    switch (err) {
    case cudaSuccess:
        return "no error";
    case cudaErrorInvalidValue:
        return "invalid argument";
    case cudaErrorMemoryAllocation:
        return "out of memory";
    case cudaErrorInvalidConfiguration:
        return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer:
        return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection:
        return "invalid copy direction for memcpy";
    case cudaErrorInsufficientDriver:
        return "CUDA driver version is insufficient";
    case cudaErrorNoDevice:
        return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice:
        return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
        return "invalid resource handle";
    case cudaErrorNotReady:
        return "device not ready";
    case cudaErrorLaunchFailure:
        return "unspecified launch failure";
    }
    return "unknown error";
}

cudaError_t cudaGetLastError(void) {
    cudaError_t err = last_error;
    last_error = cudaSuccess;
    return err;
}

static int device_count(void) {
    const char *env = getenv("PICOTRON_EMU_DEVICES");
    int n = env && env[0] ? atoi(env) : 1;
    return n > 0 ? n : 1;
}
static int current_device = 0;

cudaError_t cudaGetDeviceCount(int *count) {
    *count = device_count();
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= device_count()) return cudaErrorInvalidDevice;
    current_device = device;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *device) {
    *device = current_device;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device) {
    if (device < 0 || device >= device_count()) return cudaErrorInvalidDevice;
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "picotron CUDA emulator");
    prop->major = 9; // the limits below are an H100's (sm_90)
    prop->minor = 0;
    prop->totalGlobalMem = EMU_TOTAL_MEMORY;
    prop->sharedMemPerBlock = 48 * 1024;
    prop->sharedMemPerBlockOptin = 227 * 1024;
    prop->multiProcessorCount = 132;
    prop->maxThreadsPerBlock = 1024;
    return cudaSuccess;
}

// one emulated GPU per index, each on its own bus
cudaError_t cudaDeviceGetPCIBusId(char *bus_id, int len, int device) {
    if (device < 0 || device >= device_count() || len < 13) return cudaErrorInvalidValue;
    snprintf(bus_id, (size_t)len, "0000:%02x:00.0", 0x10 + device);
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **ptr, size_t bytes) {
    *ptr = NULL;
    if (bytes == 0) return cudaErrorInvalidValue; // cudaMalloc(0) hands out no usable memory
    size_t rounded = (bytes + 255) / 256 * 256;   // cudaMalloc aligns to 256 bytes
    if (allocated_bytes + rounded > EMU_TOTAL_MEMORY) return cudaErrorMemoryAllocation;
    void *p = aligned_alloc(256, rounded);
    if (!p) return cudaErrorMemoryAllocation;
    memset(p, 0xff, rounded); // fresh GPU memory is not zero: all-ones floats are NaN
    allocations[(uintptr_t)p] = bytes;
    allocated_bytes += rounded;
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaFree(void *ptr) {
    if (!ptr) return cudaSuccess;
    auto it = allocations.find((uintptr_t)ptr);
    if (it == allocations.end()) return cudaErrorInvalidValue; // not the start of an allocation
    allocated_bytes -= (it->second + 255) / 256 * 256;
    allocations.erase(it);
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMallocAsync(void **ptr, size_t bytes, cudaStream_t) {
    return cudaMalloc(ptr, bytes);
}
cudaError_t cudaFreeAsync(void *ptr, cudaStream_t) {
    return cudaFree(ptr);
}

cudaError_t cudaMemset(void *ptr, int value, size_t bytes) {
    if (!is_device(ptr, bytes)) return cudaErrorInvalidValue;
    count_call("cudaMemset");
    memset(ptr, value, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *ptr, int value, size_t bytes, cudaStream_t) {
    return cudaMemset(ptr, value, bytes);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    bool dst_dev = is_device(dst, bytes), src_dev = is_device(src, bytes);
    bool ok = kind == cudaMemcpyDefault ||
              (kind == cudaMemcpyHostToDevice && dst_dev && !src_dev) ||
              (kind == cudaMemcpyDeviceToHost && !dst_dev && src_dev) ||
              (kind == cudaMemcpyDeviceToDevice && dst_dev && src_dev) ||
              (kind == cudaMemcpyHostToHost && !dst_dev && !src_dev);
    if (!ok) return cudaErrorInvalidValue;
    if (dst_dev && src_dev) count_call("cudaMemcpyDeviceToDevice");
    memmove(dst, src, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t) {
    return cudaMemcpy(dst, src, bytes, kind);
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    *total_bytes = EMU_TOTAL_MEMORY;
    *free_bytes = EMU_TOTAL_MEMORY - allocated_bytes;
    return cudaSuccess;
}

// Streams. Kernels, copies, GEMMs and everything on the default stream run when issued, in
// program order. A collective issued on a created stream (a group's own, comm_nccl.cu) behaves
// as on a GPU: it starts when issued (its input is read then and its MPI request posted), but
// its output lands only once the host has seen it finish: cudaEventQuery or
// cudaEventSynchronize on an event recorded after it, or a synchronisation of its stream or the
// device. Until then the output buffer holds NaN, so code that reads it early computes NaN
// instead of a lucky right answer.
struct PendingOp {
    MPI_Request req;
    std::vector<float> staging; // the input copy; for a reduction or a receive, the result
    float *dst;                 // where the result lands (NULL for a send)
    size_t dst_n;               // floats that land there; 0: all of staging
    bool done;
};
typedef std::vector<std::shared_ptr<PendingOp>> OpList;
struct EmuStream {
    unsigned int flags;
    OpList pending;
};
struct EmuEvent {
    double seconds;
    bool recorded, timing;
    OpList waits_for; // the ops of its stream issued before it was recorded
};
static std::vector<EmuStream *> streams;

// have all of them finished? Lands the results of those that have.
static bool test_ops(OpList &ops) {
    bool all = true;
    for (auto &op : ops) {
        if (op->done) continue;
        int flag = 0;
        MPI_Test(&op->req, &flag, MPI_STATUS_IGNORE);
        if (!flag) {
            all = false;
            continue;
        }
        size_t n = op->dst_n ? op->dst_n : op->staging.size();
        if (op->dst) memcpy(op->dst, op->staging.data(), n * sizeof(float));
        op->done = true;
    }
    if (all) ops.clear();
    return all;
}

static void finish_ops(OpList &ops) {
    while (!test_ops(ops)) sched_yield();
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}
cudaError_t cudaDeviceSynchronize(void) {
    for (EmuStream *s : streams) finish_ops(s->pending);
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
    *stream = new EmuStream{flags, {}};
    streams.push_back(*stream);
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    auto it = std::find(streams.begin(), streams.end(), stream);
    if (!stream || it == streams.end()) return cudaErrorInvalidResourceHandle;
    finish_ops(stream->pending); // queued work still completes, as on a GPU
    streams.erase(it);
    delete stream;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    if (stream) finish_ops(stream->pending);
    return cudaSuccess;
}
// the waiting stream's later work must see the event's ops done: the host waits for them
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t event, unsigned int) {
    if (!event) return cudaErrorInvalidResourceHandle;
    finish_ops(event->waits_for);
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    *event = new EmuEvent{0.0, false, !(flags & cudaEventDisableTiming), {}};
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *event) {
    return cudaEventCreateWithFlags(event, 0);
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    if (!event) return cudaErrorInvalidResourceHandle;
    event->seconds = now();
    event->recorded = true;
    event->waits_for.clear();
    if (stream) {
        test_ops(stream->pending);
        event->waits_for = stream->pending;
    }
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
    if (!event) return cudaErrorInvalidResourceHandle;
    return test_ops(event->waits_for) ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    if (!event) return cudaErrorInvalidResourceHandle;
    finish_ops(event->waits_for);
    return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    if (!start || !end || !start->recorded || !end->recorded) return cudaErrorInvalidResourceHandle;
    if (!start->timing || !end->timing) return cudaErrorInvalidResourceHandle;
    *ms = (float)(1e3 * (end->seconds - start->seconds));
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
    if (!event) return cudaErrorInvalidResourceHandle;
    delete event;
    return cudaSuccess;
}

// dynamic shared memory above 48 KiB is granted per kernel, up to an H100's 227 KiB
static std::map<const void *, size_t> smem_limit;
static const size_t SMEM_DEFAULT = 48 * 1024, SMEM_OPTIN = 227 * 1024;
cudaError_t emu_func_set_attribute(const void *func, cudaFuncAttribute attr, int value) {
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
        (size_t)value > SMEM_OPTIN)
        return cudaErrorInvalidValue;
    smem_limit[func] = (size_t)value;
    return cudaSuccess;
}

// ---------------------------------------------------------------------------------------------
// threads: coroutines on their own stacks, switched by saving the callee-saved registers
extern "C" void emu_switch(void **save_sp, void *new_sp);
asm(R"(
    .text
    .globl emu_switch
    .type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch, .-emu_switch
)");

enum { READY, WAITING, DONE };
struct EmuThread {
    void *sp; // saved stack pointer while another thread runs
    uint3 idx;
    int state;
    const int *wait_gen; // WAITING: until *wait_gen != wait_value
    int wait_value;
};
struct Barrier {
    int arrived, gen;
};
#define MAX_THREADS 1024
#define MAX_WARPS   (MAX_THREADS / 32)
#define STACK_BYTES (192 * 1024)
static EmuThread threads[MAX_THREADS];
static char *stacks[MAX_THREADS];
static void *scheduler_sp;
static EmuThread *current;
static int block_size; // threads in the running block
static Barrier block_barrier, warp_barrier[MAX_WARPS];
static int exited, warp_exited[MAX_WARPS];
// a warp's shuffle slots, two sets: a shuffle writes the set of its barrier's generation parity.
// A lane can write a set again only two warp operations later, and the one between cannot open
// before every lane has read this one's: one barrier a shuffle instead of two
static uint64_t warp_slots[MAX_WARPS][2][32];
// a block's dynamic shared memory, 1024-byte aligned (as a GPU's shared window starts)
static struct {
    unsigned char *ptr;
    size_t bytes, capacity;
} dynamic_shared;
static void (*thread_body)(void *);
static void *thread_ctx;
static const char *running_kernel;
static long progress; // arrivals and exits: a scheduler pass without any is a deadlock
static const char *warp_waits_at[MAX_WARPS]; // the warp operation a warp's lanes last met at

static int linear_id(void) {
    return (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
}
static int lanes_in_warp(int w) {
    return std::min(32, block_size - 32 * w);
}

// A scheduler pass visits the block's live threads in its order (run_block); each runs until it
// waits or returns. A thread that stops switches straight to the next that can run, and only the
// pass's last goes back to the scheduler: one switch per thread run, not two.
static const std::vector<int> *pass_threads; // the pass's threads, in order
static size_t pass_next;                     // the next of them to visit
static bool pass_ran;                        // whether any ran in this pass

static EmuThread *next_in_pass(void) { // the next that can run, or NULL at the pass's end
    while (pass_next < pass_threads->size()) {
        EmuThread *th = &threads[(*pass_threads)[pass_next++]];
        if (th->state == WAITING && *th->wait_gen != th->wait_value) th->state = READY;
        if (th->state == READY) return th;
    }
    return NULL;
}

static void switch_to_next(void **save_sp) { // saves the caller's stack pointer in save_sp
    EmuThread *next = next_in_pass();
    if (!next) {
        if (save_sp != &scheduler_sp) emu_switch(save_sp, scheduler_sp); // the scheduler: none ran
        return;
    }
    current = next;
    threadIdx = next->idx;
    pass_ran = true;
    emu_switch(save_sp, next->sp);
}

static void yield_to_scheduler(void) {
    switch_to_next(&current->sp);
}

// the last of `expected` arrivals opens the barrier; the others wait for its generation to move
static void barrier_wait(Barrier *b, int expected) {
    progress++;
    if (++b->arrived >= expected) {
        b->arrived = 0;
        b->gen++;
        return;
    }
    current->state = WAITING;
    current->wait_gen = &b->gen;
    current->wait_value = b->gen;
    yield_to_scheduler();
}

// a thread that leaves counts as arrived at every later barrier, as on Volta and newer GPUs
static void release_if_complete(Barrier *b, int expected) {
    if (b->arrived > 0 && b->arrived >= expected) {
        b->arrived = 0;
        b->gen++;
    }
}

static void thread_entry(void) {
    thread_body(thread_ctx);
    int w = linear_id() / 32;
    current->state = DONE;
    exited++;
    warp_exited[w]++;
    progress++;
    release_if_complete(&block_barrier, block_size - exited);
    if (warp_barrier[w].arrived > 0)
        emu_fail("%s in kernel %s: a lane of warp %d returned while the others waited for it "
                 "(undefined behaviour on a GPU)",
                 warp_waits_at[w], running_kernel, w);
    yield_to_scheduler(); // never resumed
    __builtin_unreachable();
}

void __syncthreads(void) {
    barrier_wait(&block_barrier, block_size - exited);
}

// A full-mask warp operation needs all 32 lanes present and none exited: anything else is
// undefined on a GPU (it may hang or read garbage), so the emulator refuses it.
static int warp_check(unsigned int mask, const char *what) {
    int w = linear_id() / 32;
    if (mask != 0xffffffffu)
        emu_fail("%s in kernel %s: mask 0x%x; only full-mask warp operations are emulated", what,
                 running_kernel, mask);
    if (lanes_in_warp(w) != 32)
        emu_fail("%s in kernel %s: warp %d has only %d lanes (the block's %d threads are not a "
                 "multiple of 32)",
                 what, running_kernel, w, lanes_in_warp(w), block_size);
    if (warp_exited[w] > 0)
        emu_fail("%s in kernel %s: %d lanes of warp %d already returned, but the full mask names "
                 "them (undefined behaviour on a GPU)",
                 what, running_kernel, warp_exited[w], w);
    return w;
}

static const char *lane_waits_at[MAX_WARPS][32]; // the warp operation each lane is at
static void warp_met(int w);

// all 32 lanes meet; thread_entry refuses a lane that returns while others wait here
static void warp_barrier_wait(int w, const char *what) {
    warp_waits_at[w] = what;
    lane_waits_at[w][linear_id() % 32] = what;
    if (warp_barrier[w].arrived == 31) warp_met(w); // the last lane: the other 31 wait here
    barrier_wait(&warp_barrier[w], 32);
}

void __syncwarp(unsigned int mask) {
    int w = warp_check(mask, "__syncwarp");
    warp_barrier_wait(w, "__syncwarp");
}

uint64_t emu_warp_exchange(unsigned int mask, uint64_t value, int lane_mask, const char *what) {
    int w = warp_check(mask, what);
    int me = linear_id() % 32;
    uint64_t *slots = warp_slots[w][warp_barrier[w].gen & 1];
    slots[me] = value;
    warp_barrier_wait(w, what); // every lane has posted
    return slots[(me ^ lane_mask) & 31];
}

// ---------------------------------------------------------------------------------------------
// WMMA (emulator.h): each lane posts its call and waits at the warp barrier; the last lane to
// arrive checks that the 32 calls agree and runs them all, while the other lanes wait.
struct WmmaCall {
    void *x;               // the lane's fragment: loaded into, stored from, or mma's d
    const void *a, *b, *c; // mma_sync's operands
    const void *ptr;       // load and store: the tile
    unsigned ldm;          // its leading dimension, in elements
    bool col_major;        // its layout
    EmuFragKind kind;      // the fragment's use
};
static WmmaCall wmma_calls[MAX_WARPS][32];

// where element e of a lane's fragment sits in the 16x16 tile (row * 16 + column): a permutation
// of the emulator's own, different per use, so no code can rely on a layout CUDA leaves open
static int wmma_slot(EmuFragKind kind, int lane, int e) {
    return ((lane * 8 + e) * 73 + 59 * ((int)kind + 1)) & 255;
}

static float frag_value(EmuFragKind kind, const void *x, int e) {
    return kind == EMU_FRAG_ACC ? ((const float *)x)[e]
                                : __bfloat162float(((const __nv_bfloat16 *)x)[e]);
}

static void wmma_call(const char *what, const WmmaCall &call) {
    int w = warp_check(0xffffffffu, what);
    wmma_calls[w][linear_id() % 32] = call;
    warp_barrier_wait(w, what);
}

// load or store of a tile by the whole warp: one tile, aligned as the hardware needs it
static void wmma_run_memory(int w, bool store) {
    const char *what = store ? "wmma::store_matrix_sync" : "wmma::load_matrix_sync";
    const WmmaCall &c0 = wmma_calls[w][0];
    for (int l = 1; l < 32; l++) {
        const WmmaCall &c = wmma_calls[w][l];
        if (c.ptr != c0.ptr || c.ldm != c0.ldm || c.col_major != c0.col_major || c.kind != c0.kind)
            emu_fail("%s in kernel %s: lanes 0 and %d of warp %d name different tiles (%p, ldm "
                     "%u and %p, ldm %u); the warp's 32 lanes load or store one tile together",
                     what, running_kernel, l, w, c0.ptr, c0.ldm, c.ptr, c.ldm);
    }
    size_t elem = c0.kind == EMU_FRAG_ACC ? 4 : 2;
    if ((uintptr_t)c0.ptr % 32 != 0 || c0.ldm * elem % 16 != 0)
        emu_fail("%s in kernel %s: the tile at %p with ldm %u (%zu-byte elements) breaks WMMA's "
                 "alignment: the pointer must be 32-byte aligned, ldm a multiple of 16 bytes",
                 what, running_kernel, c0.ptr, c0.ldm, elem);
    for (int l = 0; l < 32; l++)
        for (int e = 0; e < 8; e++) {
            int rc = wmma_slot(c0.kind, l, e), r = rc / 16, c = rc % 16;
            size_t at = (c0.col_major ? (size_t)c * c0.ldm + r : (size_t)r * c0.ldm + c) * elem;
            unsigned char *mem = (unsigned char *)c0.ptr + at;
            unsigned char *frag = (unsigned char *)wmma_calls[w][l].x + e * elem;
            if (store)
                memcpy(mem, frag, elem);
            else
                memcpy(frag, mem, elem);
        }
}

// d = a @ b + c for the warp's 16x16 tiles, gathered from every lane's fragments
static void wmma_run_mma(int w) {
    float a[256], b[256], c[256];
    for (int l = 0; l < 32; l++)
        for (int e = 0; e < 8; e++) {
            const WmmaCall &call = wmma_calls[w][l];
            a[wmma_slot(EMU_FRAG_A, l, e)] = frag_value(EMU_FRAG_A, call.a, e);
            b[wmma_slot(EMU_FRAG_B, l, e)] = frag_value(EMU_FRAG_B, call.b, e);
            c[wmma_slot(EMU_FRAG_ACC, l, e)] = frag_value(EMU_FRAG_ACC, call.c, e);
        }
    for (int l = 0; l < 32; l++) // c is read whole above: d may be c
        for (int e = 0; e < 8; e++) {
            int rc = wmma_slot(EMU_FRAG_ACC, l, e), r = rc / 16, col = rc % 16;
            float sum = c[rc];
            for (int k = 0; k < 16; k++) sum += a[r * 16 + k] * b[k * 16 + col];
            ((float *)wmma_calls[w][l].x)[e] = sum;
        }
}

void emu_wmma_load(void *x, EmuFragKind kind, const void *ptr, unsigned ldm, bool col_major) {
    wmma_call("wmma::load_matrix_sync", WmmaCall{x, NULL, NULL, NULL, ptr, ldm, col_major, kind});
}
void emu_wmma_store(void *ptr, const float *x, unsigned ldm, bool col_major) {
    wmma_call("wmma::store_matrix_sync",
              WmmaCall{(void *)x, NULL, NULL, NULL, ptr, ldm, col_major, EMU_FRAG_ACC});
}
void emu_wmma_mma(float *d, const __nv_bfloat16 *a, const __nv_bfloat16 *b, const float *c) {
    wmma_call("wmma::mma_sync", WmmaCall{d, a, b, c, NULL, 0, false, EMU_FRAG_ACC});
}

// The last lane to reach a warp operation, while the other 31 wait there: all must be at the
// same operation (a lane at __syncwarp while the others shuffle or multiply is divergent use of
// a warp-collective call, undefined on a GPU); a WMMA call then runs for the whole warp.
static void warp_met(int w) {
    const char *what = lane_waits_at[w][0];
    for (int l = 1; l < 32; l++) // the same call site passes the same literal: compare it first
        if (lane_waits_at[w][l] != what && strcmp(lane_waits_at[w][l], what) != 0)
            emu_fail("kernel %s: the lanes of warp %d meet at different warp operations (lane 0 "
                     "at %s, lane %d at %s): a warp-collective call in divergent code",
                     running_kernel, w, what, l, lane_waits_at[w][l]);
    if (strcmp(what, "wmma::mma_sync") == 0)
        wmma_run_mma(w);
    else if (strcmp(what, "wmma::load_matrix_sync") == 0)
        wmma_run_memory(w, false);
    else if (strcmp(what, "wmma::store_matrix_sync") == 0)
        wmma_run_memory(w, true);
}

void *emu_dynamic_shared(void) {
    return dynamic_shared.bytes ? dynamic_shared.ptr : NULL;
}

// a launch's dynamic shared memory: `bytes` of garbage (all-ones floats are NaN)
static void dynamic_shared_reset(size_t bytes) {
    if (bytes > dynamic_shared.capacity) {
        free(dynamic_shared.ptr);
        size_t capacity = (bytes + 1023) / 1024 * 1024;
        dynamic_shared.ptr = (unsigned char *)aligned_alloc(1024, capacity);
        if (!dynamic_shared.ptr) emu_fail("out of memory for %zu bytes of shared memory", bytes);
        dynamic_shared.capacity = capacity;
    }
    dynamic_shared.bytes = bytes;
    memset(dynamic_shared.ptr, 0xff, bytes);
}

static char *thread_stack(int t) {
    if (!stacks[t]) {
        void *p =
            mmap(NULL, STACK_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) emu_fail("out of memory for thread stacks");
        mprotect(p, 4096, PROT_NONE); // a guard page: an overflow faults instead of corrupting
        stacks[t] = (char *)p;
    }
    return stacks[t];
}

// a fresh stack that "returns" into thread_entry on the first switch to it. Each thread's top
// sits at its own offset below the end, cache line t % 64 of page t / 64: stacks a power of two
// apart would put every thread's top words in the same cache sets, and each switch would miss
static void *initial_sp(int t) {
    size_t offset = (size_t)(t % 64) * 64 + (size_t)(t / 64) * 4096; // < 64 KiB of STACK_BYTES
    uintptr_t top = ((uintptr_t)thread_stack(t) + STACK_BYTES - offset) & ~(uintptr_t)15;
    void **sp = (void **)top;
    *--sp = NULL;                             // thread_entry's return address: it never returns
    *--sp = (void *)thread_entry;             // popped by emu_switch's ret
    for (int r = 0; r < 6; r++) *--sp = NULL; // rbp rbx r12 r13 r14 r15
    return sp;
}

static uint64_t shuffle_state = 0x9E3779B97F4A7C15ull;
static void order_of(std::vector<int> &order, int n, int kind) { // 0 forward, 1 reverse, 2 shuffle
    order.resize(n);
    for (int i = 0; i < n; i++) order[i] = kind == 1 ? n - 1 - i : i;
    if (kind == 2)
        for (int i = n - 1; i > 0; i--) {
            shuffle_state = shuffle_state * 6364136223846793005ull + 1442695040888963407ull;
            std::swap(order[i], order[(int)((shuffle_state >> 33) % (uint64_t)(i + 1))]);
        }
}

// `live`: scratch for the threads not yet returned, in `order`; a pass visits only those, so a
// block whose other warps returned early does not scan them at every barrier of the last one
static void run_block(const EmuConfig &c, const std::vector<int> &order, std::vector<int> &live) {
    block_size = (int)(c.block.x * c.block.y * c.block.z);
    block_barrier = Barrier{0, 0};
    exited = 0;
    for (int w = 0; w < MAX_WARPS; w++) warp_barrier[w] = Barrier{0, 0}, warp_exited[w] = 0;
    dynamic_shared_reset(dynamic_shared.bytes); // garbage, as on a GPU
    for (int t = 0; t < block_size; t++) {
        threads[t].sp = initial_sp(t);
        threads[t].idx =
            uint3{t % c.block.x, (t / c.block.x) % c.block.y, t / (c.block.x * c.block.y)};
        threads[t].state = READY;
    }
    live = order;
    while (!live.empty()) {
        long before = progress;
        pass_threads = &live, pass_next = 0, pass_ran = false;
        switch_to_next(&scheduler_sp); // back when the pass has visited every live thread
        size_t kept = 0;
        for (int t : live)
            if (threads[t].state != DONE) live[kept++] = t;
        live.resize(kept);
        if (!pass_ran || (progress == before && !live.empty()))
            emu_fail("kernel %s, block (%u, %u, %u): every thread waits at a barrier that not all "
                     "of them reach (a __syncthreads or warp operation in divergent code)",
                     running_kernel, blockIdx.x, blockIdx.y, blockIdx.z);
    }
}

static void run_blocks(const EmuConfig &c, int kind) {
    size_t nblocks = (size_t)c.grid.x * c.grid.y * c.grid.z;
    std::vector<int> thread_order, block_order, live;
    order_of(thread_order, (int)(c.block.x * c.block.y * c.block.z), kind);
    // blocks: forward, reverse or shuffled within each 2^20 blocks
    for (size_t b0 = 0; b0 < nblocks; b0 += 1 << 20) {
        int chunk = (int)std::min(nblocks - b0, (size_t)1 << 20);
        order_of(block_order, chunk, kind);
        for (int i : block_order) {
            size_t b = b0 + (size_t)i;
            blockIdx = uint3{(unsigned)(b % c.grid.x), (unsigned)((b / c.grid.x) % c.grid.y),
                             (unsigned)(b / ((size_t)c.grid.x * c.grid.y))};
            run_block(c, thread_order, live);
        }
    }
}

static int order_from_env(void) {
    const char *env = getenv("PICOTRON_EMU_ORDER");
    if (!env || !env[0] || strcmp(env, "forward") == 0) return 0;
    if (strcmp(env, "reverse") == 0) return 1;
    if (strcmp(env, "shuffle") == 0) return 2;
    emu_fail("PICOTRON_EMU_ORDER = '%s': use forward, reverse or shuffle", env);
}

// a copy of every allocation, to run one launch twice from the same inputs
static std::vector<std::vector<unsigned char>> snapshot(void) {
    std::vector<std::vector<unsigned char>> copy;
    for (auto &a : allocations) {
        const unsigned char *p = (const unsigned char *)a.first;
        copy.emplace_back(p, p + a.second);
    }
    return copy;
}
static void restore(const std::vector<std::vector<unsigned char>> &copy) {
    size_t i = 0;
    for (auto &a : allocations) memcpy((void *)a.first, copy[i++].data(), a.second);
}

// PICOTRON_EMU_SKIP_COMPUTE=1: check every launch and GEMM, run none (the numbers are garbage):
// a step at sizes too large to emulate still meets every launch limit on the way
static bool skip_compute(void) {
    static int skip = -1;
    if (skip < 0) {
        const char *env = getenv("PICOTRON_EMU_SKIP_COMPUTE");
        skip = env && env[0] && strcmp(env, "0") != 0;
    }
    return skip;
}

int emu_run_grid(const EmuConfig &c, const char *name, const void *kernel, void (*body)(void *),
                 void *ctx) {
    size_t threads_per_block = (size_t)c.block.x * c.block.y * c.block.z;
    bool config_ok = threads_per_block >= 1 && threads_per_block <= MAX_THREADS &&
                     c.block.x <= 1024 && c.block.y <= 1024 && c.block.z >= 1 && c.block.z <= 64 &&
                     c.grid.x >= 1 && c.grid.x <= 2147483647u && c.grid.y >= 1 &&
                     c.grid.y <= 65535 && c.grid.z >= 1 && c.grid.z <= 65535;
    if (!config_ok) {
        last_error = cudaErrorInvalidConfiguration;
        return 0;
    }
    auto granted = smem_limit.find(kernel);
    size_t limit = granted == smem_limit.end() ? SMEM_DEFAULT : granted->second;
    if (c.smem > std::max(limit, SMEM_DEFAULT)) {
        last_error = cudaErrorInvalidValue;
        return 0;
    }
    thread_body = body;
    thread_ctx = ctx;
    running_kernel = name;
    blockDim = c.block;
    gridDim = c.grid;
    dynamic_shared_reset(c.smem);
    count_call(name);
    if (skip_compute()) return 1;
    static const char *racecheck = getenv("PICOTRON_EMU_RACECHECK");
    if (racecheck && racecheck[0] && strcmp(racecheck, "0") != 0) {
        // the same launch in reverse order of threads and blocks must write the same bytes
        auto inputs = snapshot();
        run_blocks(c, 0);
        auto forward = snapshot();
        restore(inputs);
        run_blocks(c, 1);
        size_t i = 0;
        for (auto &a : allocations) {
            const unsigned char *p = (const unsigned char *)a.first;
            if (memcmp(p, forward[i].data(), a.second) != 0) {
                size_t off = 0;
                while (p[off] == forward[i][off]) off++;
                emu_fail("kernel %s is not deterministic: run with threads and blocks in reverse "
                         "order it wrote different bytes at offset %zu of a %zu-byte allocation "
                         "(a missing __syncthreads/__syncwarp, or blocks racing on one address)",
                         name, off, a.second);
            }
            i++;
        }
    } else {
        run_blocks(c, order_from_env());
    }
    return 1;
}

void emu_check_pointer_arg(const char *kernel, int index, const void *ptr) {
    if (ptr && !is_device(ptr, 1))
        emu_fail("kernel %s: argument %d (%p) is not device memory from cudaMalloc (a host "
                 "pointer faults on a GPU)",
                 kernel, index, ptr);
}

// ---------------------------------------------------------------------------------------------
// cuBLAS: the column-major GEMM of the BLAS standard, checked as cuBLAS checks it, computed by
// the CPU's BLAS on fp32 copies of the operands (a bf16 product is exact in fp32)
struct EmuCublas {
    int math_mode;
};
cublasStatus_t cublasCreate(cublasHandle_t *handle) {
    *handle = new EmuCublas{0};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t handle) {
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->math_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t) {
    return handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}
const char *cublasGetStatusString(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS:
        return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "CUBLAS_STATUS_NOT_SUPPORTED";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

// a (rows, cols) column-major operand with leading dimension ld, as fp32; TF32 keeps 10 bits of
// mantissa (rounded to nearest, ties away, as the tensor cores' conversion)
static std::vector<float> operand(const char *call, const char *what, const void *ptr,
                                  cudaDataType type, int rows, int cols, int ld, bool tf32) {
    size_t elems = cols == 0 || rows == 0 ? 0 : (size_t)(cols - 1) * ld + rows;
    size_t bytes = elems * (type == CUDA_R_16BF ? 2 : 4);
    if (elems && !is_device(ptr, bytes))
        emu_fail("%s: operand %s (%d x %d, ld %d) is not inside one cudaMalloc allocation", call,
                 what, rows, cols, ld);
    if (skip_compute()) return {};
    std::vector<float> out(elems);
    if (type == CUDA_R_32F)
        memcpy(out.data(), ptr, bytes);
    else
        for (size_t i = 0; i < elems; i++)
            out[i] = __bfloat162float(((const __nv_bfloat16 *)ptr)[i]);
    if (tf32)
        for (float &x : out) {
            uint32_t u;
            memcpy(&u, &x, 4);
            if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
            memcpy(&x, &u, 4);
        }
    return out;
}

// One GEMM of cublasGemmEx or of a batch: checked as cuBLAS checks it, computed by the CPU's
// BLAS on fp32 copies of the operands (a bf16 product is exact in fp32).
static cublasStatus_t gemm(const char *call, cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const void *alpha,
                           const void *A, cudaDataType Atype, int lda, const void *B,
                           cudaDataType Btype, int ldb, const void *beta, void *C,
                           cudaDataType Ctype, int ldc, cublasComputeType_t compute) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    int a_rows = transa == CUBLAS_OP_N ? m : k, a_cols = transa == CUBLAS_OP_N ? k : m;
    int b_rows = transb == CUBLAS_OP_N ? k : n, b_cols = transb == CUBLAS_OP_N ? n : k;
    if (m < 0 || n < 0 || k < 0 || lda < std::max(1, a_rows) || ldb < std::max(1, b_rows) ||
        ldc < std::max(1, m))
        return CUBLAS_STATUS_INVALID_VALUE;
    bool tf32 = compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    bool types_ok = Atype == Btype && Ctype == CUDA_R_32F &&
                    ((Atype == CUDA_R_32F && (compute == CUBLAS_COMPUTE_32F || tf32)) ||
                     (Atype == CUDA_R_16BF && compute == CUBLAS_COMPUTE_32F));
    if (!types_ok) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    std::vector<float> a = operand(call, "A", A, Atype, a_rows, a_cols, lda, tf32);
    std::vector<float> b = operand(call, "B", B, Btype, b_rows, b_cols, ldb, tf32);
    if (!is_device(C, ((size_t)(n - 1) * ldc + m) * sizeof(float)))
        emu_fail("%s: C (%d x %d, ld %d) is not inside one cudaMalloc allocation", call, m, n, ldc);
    float al = *(const float *)alpha, be = *(const float *)beta;
    if (skip_compute()) return CUBLAS_STATUS_SUCCESS;
    if (k == 0) { // beta = 0 writes C without reading it, as cuBLAS (a NaN there stays out)
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                float *c = (float *)C + (size_t)j * ldc + i;
                *c = be == 0.0f ? 0.0f : *c * be;
            }
        return CUBLAS_STATUS_SUCCESS;
    }
    cblas_sgemm(CblasColMajor, transa == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                transb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, m, n, k, al, a.data(), lda,
                b.data(), ldb, be, (float *)C, ldc);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t) {
    count_call("cublasGemmEx");
    return gemm("cublasGemmEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype,
                ldb, beta, C, Ctype, ldc, compute);
}

// the batch's GEMMs one after another: the emulator has no concurrency for a shared C to show
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void *alpha, const void *A, cudaDataType Atype,
                                          int lda, long long stride_a, const void *B,
                                          cudaDataType Btype, int ldb, long long stride_b,
                                          const void *beta, void *C, cudaDataType Ctype, int ldc,
                                          long long stride_c, int count,
                                          cublasComputeType_t compute, cublasGemmAlgo_t) {
    if (count < 0) return CUBLAS_STATUS_INVALID_VALUE;
    count_call("cublasGemmStridedBatchedEx");
    size_t a_size = Atype == CUDA_R_16BF ? 2 : 4, b_size = Btype == CUDA_R_16BF ? 2 : 4;
    for (int i = 0; i < count; i++) {
        cublasStatus_t st = gemm("cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k,
                                 alpha, (const char *)A + i * stride_a * a_size, Atype, lda,
                                 (const char *)B + i * stride_b * b_size, Btype, ldb, beta,
                                 (float *)C + i * stride_c, Ctype, ldc, compute);
        if (st != CUBLAS_STATUS_SUCCESS) return st;
    }
    return CUBLAS_STATUS_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// NCCL over MPI. A collective on the default stream has finished when its call returns; an
// all-reduce, send or receive on a created stream is deferred (see the streams above). Waits
// test and yield, never busy-poll, so 8 ranks share 2 cores.
struct EmuNccl {
    MPI_Comm comm;
    int rank, size;
};
#define ID_MAGIC 0x6e63636c // "nccl"
#define ID_TAG   30000      // + the id's counter, on MPI_COMM_WORLD while the group forms

static void wait_all(int n, MPI_Request *req) {
    for (int done = 0;;) {
        MPI_Testall(n, req, &done, MPI_STATUSES_IGNORE);
        if (done) return;
        sched_yield();
    }
}

const char *ncclGetErrorString(ncclResult_t result) {
    switch (result) {
    case ncclSuccess:
        return "no error";
    case ncclUnhandledCudaError:
        return "unhandled cuda error";
    case ncclSystemError:
        return "unhandled system error";
    case ncclInternalError:
        return "internal error";
    case ncclInvalidArgument:
        return "invalid argument";
    case ncclInvalidUsage:
        return "invalid usage";
    }
    return "unknown result code";
}

// the id names its root (world rank) and a counter, so the members can find each other
ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    static int counter = 0;
    int world_rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    memset(id, 0, sizeof *id);
    int words[3] = {ID_MAGIC, world_rank, counter++ % 2000};
    memcpy(id->internal, words, sizeof words);
    return ncclSuccess;
}

// Only the members call it, so the communicator is made over them alone: each tells the root its
// world rank, the root answers with the list in group-rank order, and MPI_Comm_create_group
// (collective over the members only) makes the communicator.
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    int words[3];
    memcpy(words, id.internal, sizeof words);
    if (words[0] != ID_MAGIC || nranks < 1 || rank < 0 || rank >= nranks)
        return ncclInvalidArgument;
    int root = words[1], tag = ID_TAG + words[2], world_rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    std::vector<int> members(nranks, -1);
    if (rank == 0) {
        if (world_rank != root) return ncclInvalidUsage; // rank 0 must be the id's creator
        members[0] = world_rank;
        for (int got = 1; got < nranks; got++) {
            int pair[2];
            MPI_Request req;
            MPI_Irecv(pair, 2, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, &req);
            wait_all(1, &req);
            if (pair[0] <= 0 || pair[0] >= nranks || members[pair[0]] != -1)
                emu_fail("ncclCommInitRank: two ranks claim rank %d of one communicator", pair[0]);
            members[pair[0]] = pair[1];
        }
        std::vector<MPI_Request> reqs(nranks - 1);
        for (int r = 1; r < nranks; r++)
            MPI_Isend(members.data(), nranks, MPI_INT, members[r], tag, MPI_COMM_WORLD,
                      &reqs[r - 1]);
        wait_all(nranks - 1, reqs.data());
    } else {
        int pair[2] = {rank, world_rank};
        MPI_Request req[2];
        MPI_Isend(pair, 2, MPI_INT, root, tag, MPI_COMM_WORLD, &req[0]);
        MPI_Irecv(members.data(), nranks, MPI_INT, root, tag, MPI_COMM_WORLD, &req[1]);
        wait_all(2, req);
    }
    MPI_Group world_group, group;
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    MPI_Group_incl(world_group, nranks, members.data(), &group);
    EmuNccl *c = new EmuNccl{MPI_COMM_NULL, rank, nranks};
    MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &c->comm);
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    *comm = c;
    return ncclSuccess;
}

// collectives finish inside their calls, so an error is never left pending
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error) {
    if (!comm) return ncclInvalidArgument;
    *async_error = ncclSuccess;
    return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
    return ncclCommDestroy(comm);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclInvalidArgument;
    MPI_Comm_free(&comm->comm);
    delete comm;
    return ncclSuccess;
}

static bool floats_on_device(const void *buf, size_t count) {
    return count == 0 || is_device(buf, count * sizeof(float));
}

static MPI_Op mpi_op(ncclRedOp_t op) {
    return op == ncclMax ? MPI_MAX : op == ncclMin ? MPI_MIN : op == ncclProd ? MPI_PROD : MPI_SUM;
}

static int mpi_count(size_t count) {
    if (count > 2147483647u)
        emu_fail("a collective of %zu floats: the emulator passes ints", count);
    return (int)count;
}

// an op on a created stream: input staged now, output NaN until the host sees it finish
static std::shared_ptr<PendingOp> deferred(cudaStream_t stream, const void *in, float *out,
                                           size_t count) {
    auto op = std::make_shared<PendingOp>();
    if (in)
        op->staging.assign((const float *)in, (const float *)in + count);
    else
        op->staging.resize(count);
    op->dst = out;
    op->dst_n = 0;
    op->done = false;
    if (out) memset(out, 0xff, count * sizeof(float));
    stream->pending.push_back(op);
    return op;
}

ncclResult_t ncclAllReduce(const void *sendbuf, void *recvbuf, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    if (!comm || type != ncclFloat) return ncclInvalidArgument;
    if (!floats_on_device(sendbuf, count) || !floats_on_device(recvbuf, count))
        return ncclInvalidArgument;
    if (stream) {
        auto pending = deferred(stream, sendbuf, (float *)recvbuf, count);
        MPI_Iallreduce(MPI_IN_PLACE, pending->staging.data(), mpi_count(count), MPI_FLOAT,
                       mpi_op(op), comm->comm, &pending->req);
        return ncclSuccess;
    }
    MPI_Request req;
    MPI_Iallreduce(sendbuf == recvbuf ? MPI_IN_PLACE : sendbuf, recvbuf, mpi_count(count),
                   MPI_FLOAT, mpi_op(op), comm->comm, &req);
    wait_all(1, &req);
    return ncclSuccess;
}

// ZeRO-1's pair, through a host copy of the whole buffer: MPI_IN_PLACE leaves a reduce-scatter's
// piece at the copy's front and takes an all-gather's own piece from its place in the copy
ncclResult_t ncclReduceScatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                               ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
    size_t count = recvcount * (size_t)(comm ? comm->size : 1);
    if (!comm || type != ncclFloat) return ncclInvalidArgument;
    if (!floats_on_device(sendbuf, count) || !floats_on_device(recvbuf, recvcount))
        return ncclInvalidArgument;
    auto pending = std::make_shared<PendingOp>();
    pending->staging.assign((const float *)sendbuf, (const float *)sendbuf + count);
    pending->dst = NULL;
    pending->dst_n = 0;
    pending->done = false;
    MPI_Ireduce_scatter_block(MPI_IN_PLACE, pending->staging.data(), mpi_count(recvcount),
                              MPI_FLOAT, mpi_op(op), comm->comm, &pending->req);
    if (stream) {
        pending->dst = (float *)recvbuf;
        pending->dst_n = recvcount;
        memset(recvbuf, 0xff, recvcount * sizeof(float));
        stream->pending.push_back(pending);
        return ncclSuccess;
    }
    wait_all(1, &pending->req);
    memcpy(recvbuf, pending->staging.data(), recvcount * sizeof(float));
    return ncclSuccess;
}

ncclResult_t ncclAllGather(const void *sendbuf, void *recvbuf, size_t sendcount,
                           ncclDataType_t type, ncclComm_t comm, cudaStream_t stream) {
    size_t count = sendcount * (size_t)(comm ? comm->size : 1);
    if (!comm || type != ncclFloat) return ncclInvalidArgument;
    if (!floats_on_device(sendbuf, sendcount) || !floats_on_device(recvbuf, count))
        return ncclInvalidArgument;
    auto pending = std::make_shared<PendingOp>();
    pending->staging.resize(count);
    memcpy(pending->staging.data() + (size_t)comm->rank * sendcount, sendbuf,
           sendcount * sizeof(float));
    pending->dst = (float *)recvbuf;
    pending->dst_n = 0;
    pending->done = false;
    MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, pending->staging.data(),
                   mpi_count(sendcount), MPI_FLOAT, comm->comm, &pending->req);
    if (stream) {
        memset(recvbuf, 0xff, count * sizeof(float));
        stream->pending.push_back(pending);
        return ncclSuccess;
    }
    wait_all(1, &pending->req);
    memcpy(recvbuf, pending->staging.data(), count * sizeof(float));
    return ncclSuccess;
}

// point-to-point: inside ncclGroupStart/End the calls are posted together at the end
struct PendingP2P {
    bool is_send;
    void *buf;
    int count, peer;
    MPI_Comm comm;
    cudaStream_t stream; // a created stream: deferred as in ncclAllReduce
};
static int group_depth = 0;
static std::vector<PendingP2P> pending;

static ncclResult_t run_p2p(const std::vector<PendingP2P> &ops) {
    std::vector<MPI_Request> reqs;
    reqs.reserve(ops.size());
    // receives first, so a ring that sends all at once never waits on itself
    for (int pass = 0; pass < 2; pass++)
        for (const PendingP2P &p : ops) {
            if (p.is_send == (pass == 0)) continue;
            void *buf = p.buf;
            MPI_Request *req;
            if (p.stream) {
                auto op = deferred(p.stream, p.is_send ? p.buf : NULL,
                                   p.is_send ? NULL : (float *)p.buf, (size_t)p.count);
                buf = op->staging.data();
                req = &op->req;
            } else {
                reqs.emplace_back();
                req = &reqs.back();
            }
            if (p.is_send)
                MPI_Isend(buf, p.count, MPI_FLOAT, p.peer, 0, p.comm, req);
            else
                MPI_Irecv(buf, p.count, MPI_FLOAT, p.peer, 0, p.comm, req);
        }
    wait_all((int)reqs.size(), reqs.data());
    return ncclSuccess;
}

static ncclResult_t p2p(bool is_send, const void *buf, size_t count, ncclDataType_t type, int peer,
                        ncclComm_t comm, cudaStream_t stream) {
    if (!comm || type != ncclFloat || peer < 0 || peer >= comm->size || peer == comm->rank)
        return ncclInvalidArgument;
    if (!floats_on_device(buf, count)) return ncclInvalidArgument;
    PendingP2P op{is_send, (void *)buf, mpi_count(count), peer, comm->comm, stream};
    if (group_depth > 0) {
        pending.push_back(op);
        return ncclSuccess;
    }
    return run_p2p(std::vector<PendingP2P>{op});
}

ncclResult_t ncclSend(const void *sendbuf, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
    return p2p(true, sendbuf, count, type, peer, comm, stream);
}
ncclResult_t ncclRecv(void *recvbuf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    return p2p(false, recvbuf, count, type, peer, comm, stream);
}
ncclResult_t ncclGroupStart(void) {
    group_depth++;
    return ncclSuccess;
}
ncclResult_t ncclGroupEnd(void) {
    if (group_depth == 0) return ncclInvalidUsage;
    if (--group_depth > 0) return ncclSuccess;
    std::vector<PendingP2P> ops;
    ops.swap(pending);
    return run_p2p(ops);
}
