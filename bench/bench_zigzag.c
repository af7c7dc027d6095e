// Zig-zag against contiguous sequence chunks in causal ring attention at cp=4: B=1, S=2048, H=8,
// KV=4, D=64, random inputs. Each rank times ring_attention_forward + ring_attention_backward
// (the whole calls, REPS repetitions after one warm-up, the mean) in wall time and in process
// CPU time, and counts the forward attention blocks it computed. Prints them per rank, the
// imbalance (max/min) of each, and the slowest rank's time without zig-zag over with it.
// With more ranks than cores the wall time includes waiting for a core; comm_wait() yields, so
// waiting costs little CPU when a peer is runnable - but a rank alone on a core spins in its
// yield loop, so CPU time also over-counts the waiting; the causal (query, key) pairs each
// rank's queries see (from the positions) are the exact measure of its attention work.
// A benchmark, not a test: it asserts nothing.
// usage: mpirun -np 4 build/bench/bench_zigzag [reps]
#include <time.h>
#include "backend/backend.h"
#include "context_parallel.h"
#include "process_group_manager.h"
#include "utils.h"

#define CP 4
#define B  1
#define S  2048
#define H  8
#define KV 4
#define D  64

typedef struct {
    double wall, cpu; // mean seconds per forward + backward
    long blocks;      // forward blocks computed per call
    double pairs;     // causal (query, key) pairs this rank's queries see, in millions
} Timing;

// the work a rank's attention does, independent of block counting: with tile skipping, the
// cost follows the visible (query, key) pairs, not the number of blocks touched
static double visible_pairs(const RingAttention *ra) {
    int T = ra->T, cp = ra->cp->size;
    const int *qp = ra->positions_host + ra->cp->rank * T;
    long n = 0;
    for (int src = 0; src < cp; src++)
        for (int i = 0; i < T; i++)
            for (int j = 0; j < T; j++) n += ra->positions_host[src * T + j] <= qp[i];
    return n * 1e-6;
}

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// n uniform values in [-1, 1) on the device, from a per-rank seed
static float *random_device(size_t n, unsigned long long *state) {
    float *host = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
        host[i] = (float)((*state >> 40) / (double)(1ULL << 24)) * 2.0f - 1.0f;
    }
    float *dev = device_malloc(n * sizeof(float));
    host_to_device(dev, host, n * sizeof(float));
    free(host);
    return dev;
}

static Timing time_ring(Group *cp, int zigzag, int reps) {
    int T = S / cp->size;
    size_t nq = (size_t)B * T * H * D, nkv = 2 * (size_t)B * T * KV * D, nl = (size_t)B * H * T;
    unsigned long long state = 1234 + cp->rank;
    float *q = random_device(nq, &state), *kv = random_device(nkv, &state);
    float *dout = random_device(nq, &state);
    float *out = device_malloc(nq * sizeof(float)), *lse = device_malloc(nl * sizeof(float));
    float *dq = device_malloc(nq * sizeof(float)), *dkv = device_malloc(nkv * sizeof(float));
    RingAttention ra;
    ring_attention_init(&ra, cp, B, S, H, KV, D, zigzag);
    Timing t = {.pairs = visible_pairs(&ra)};
    for (int rep = -1; rep < reps; rep++) { // rep -1 warms up
        barrier(cp);
        long blocks = ra.blocks_computed;
        double wall = now_seconds(), cpu = cpu_seconds();
        ring_attention_forward(out, lse, q, kv, &ra);
        ring_attention_backward(dq, dkv, dout, q, kv, out, lse, &ra);
        device_synchronize();
        if (rep < 0) continue;
        t.wall += (now_seconds() - wall) / reps;
        t.cpu += (cpu_seconds() - cpu) / reps;
        t.blocks = ra.blocks_computed - blocks;
    }
    ring_attention_free(&ra);
    void *dev[] = {q, kv, dout, out, lse, dq, dkv};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) device_free(dev[i]);
    return t;
}

// prints one layout's per-rank figures; returns the slowest rank's wall and CPU time
static void report(const char *name, Timing t, Group *cp, double *max_wall, double *max_cpu) {
    double mine[4] = {t.wall, t.cpu, (double)t.blocks, t.pairs}, all[4 * CP];
    mpiCheck(MPI_Gather(mine, 4, MPI_DOUBLE, all, 4, MPI_DOUBLE, 0, cp->comm));
    if (cp->rank != 0) return;
    double lo[4], hi[4];
    for (int k = 0; k < 4; k++) lo[k] = hi[k] = all[k];
    printf("%s\n", name);
    for (int r = 0; r < cp->size; r++) {
        const double *a = all + 4 * r;
        printf("  rank %d: wall %8.2f ms  cpu %8.2f ms  blocks %2.0f  causal pairs %6.3fM\n", r,
               a[0] * 1e3, a[1] * 1e3, a[2], a[3]);
        for (int k = 0; k < 4; k++) {
            if (a[k] < lo[k]) lo[k] = a[k];
            if (a[k] > hi[k]) hi[k] = a[k];
        }
    }
    printf("  imbalance max/min: wall %.2fx  cpu %.2fx  blocks %.2fx  causal pairs %.2fx\n",
           hi[0] / lo[0], hi[1] / lo[1], hi[2] / lo[2], hi[3] / lo[3]);
    *max_wall = hi[0];
    *max_cpu = hi[1];
}

int main(int argc, char **argv) {
    mpiCheck(MPI_Init(&argc, &argv));
    int reps = argc > 1 ? atoi(argv[1]) : 5;
    if (reps < 1) user_error("usage: bench_zigzag [reps]: reps = %s must be >= 1", argv[1]);
    ProcessGroupManager pgm;
    process_group_manager_init(&pgm, 1, CP, 1, 1, 1);
    MPI_Comm node;
    int local;
    mpiCheck(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    mpiCheck(MPI_Comm_rank(node, &local));
    mpiCheck(MPI_Comm_free(&node));
    backend_init(local);
    if (pgm.global_rank == 0)
        printf("ring attention cp=%d, B=%d S=%d H=%d KV=%d D=%d: forward + backward, mean of %d "
               "after 1 warm-up (blocks: forward blocks computed per call)\n",
               CP, B, S, H, KV, D, reps);
    double wall[2], cpu[2];
    for (int zigzag = 0; zigzag < 2; zigzag++) {
        Timing t = time_ring(&pgm.cp, zigzag, reps);
        report(zigzag ? "zig-zag chunks" : "contiguous chunks", t, &pgm.cp, &wall[zigzag],
               &cpu[zigzag]);
    }
    if (pgm.global_rank == 0)
        printf("slowest rank, contiguous / zig-zag: wall %.2fx  cpu %.2fx\n", wall[0] / wall[1],
               cpu[0] / cpu[1]);
    process_group_manager_free(&pgm);
    MPI_Finalize();
    return 0;
}
