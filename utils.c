// Errors that end the whole job, timing, threads and signals.
#define _GNU_SOURCE // CPU_COUNT
#include "utils.h"
#include <mpi.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>
#include <stdarg.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

int world_rank(void) {
    int initialized = 0, finalized = 0, rank = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
}

// MPI_Abort, not exit: a rank that returns while its peers wait in a collective would hang them
static void __attribute__((noreturn)) end_job(int code) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    fflush(stdout);
    fflush(stderr);
    // mpirun's proxy stops forwarding output once the abort reaches it: give the line time to
    // leave first (t_61 lost it 2 times in 6 without this)
    if (initialized && !finalized) usleep(200 * 1000);
    if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

// the message, as long as it needs to be (a path may be long): malloc'd
static char *format_message(const char *fmt, va_list ap) {
    va_list again;
    va_copy(again, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    char *msg = malloc(n > 0 ? (size_t)n + 1 : 1);
    if (!msg) return (char *)fmt; // out of memory: the format, unfilled, still says what failed
    vsnprintf(msg, (size_t)n + 1, fmt, again);
    va_end(again);
    return msg;
}

void fail_at(const char *file, int line, const char *hint, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *msg = format_message(fmt, ap);
    va_end(ap);
    fprintf(stderr, "[rank %d] %s:%d %s\n", world_rank(), file, line, msg);
    if (hint && hint[0]) fprintf(stderr, "    hint: %s\n", hint);
    end_job(1);
}

void fail_job(const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "[rank %d] %s\n", world_rank(), msg);
    end_job(1);
}

// where ranks that hit bad input find each other, apart from every other message
static MPI_Comm error_comm = MPI_COMM_NULL;

void user_errors_init(void) {
    mpiCheck(MPI_Comm_dup(MPI_COMM_WORLD, &error_comm));
}

// Bad input is usually seen by every rank at once (the same config): then rank 0 alone speaks and
// all exit cleanly. A rank that alone sees it (its own checkpoint file) is not joined within 2 s,
// speaks itself and ends the job. The wait tests and yields, like every wait here.
void user_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *msg = format_message(fmt, ap);
    va_end(ap);
    int all_here = 0;
    if (error_comm != MPI_COMM_NULL) {
        MPI_Request req;
        double deadline = now_seconds() + 2.0;
        mpiCheck(MPI_Ibarrier(error_comm, &req));
        while (!all_here && now_seconds() < deadline) {
            mpiCheck(MPI_Test(&req, &all_here, MPI_STATUS_IGNORE));
            if (!all_here) sched_yield();
        }
    }
    if (!all_here) {
        fprintf(stderr, "%s\n", msg);
        end_job(1);
    }
    if (world_rank() == 0) fprintf(stderr, "%s\n", msg);
    fflush(stderr);
    // after a stop signal mpirun (MPICH's hydra) may report 0 for ranks that finalize and exit 1:
    // the job ends by MPI_Abort then, whose status it always reports (tests/t_61)
    if (stop_signal_caught()) end_job(1);
    MPI_Finalize();
    exit(1);
}

// MPICH 4.0.2 over UCX 1.13 can hang inside MPI_Finalize, closing its connections: a rank whose
// closes are done waits in the process manager's barrier and stops answering a peer whose close
// still waits for it (seen on one node once in about 135 runs of 8 ranks, and in half the runs
// across two nodes over TCP: tests/finalize_shim.c). By then the run's work is done, so
// a finalize that has not returned within distributed.timeout_s says so and ends the job, rather
// than hold its nodes until the time limit. write() and _exit() are all a signal handler may call.
static char finalize_hung_line[256];
static void on_finalize_timeout(int sig) {
    (void)sig;
    (void)!write(STDERR_FILENO, finalize_hung_line, strlen(finalize_hung_line));
    _exit(1);
}

void mpi_finalize_watched(double timeout_s) {
    unsigned seconds = timeout_s < 1 ? 1 : (unsigned)(timeout_s + 0.999);
    snprintf(finalize_hung_line, sizeof finalize_hung_line,
             "[rank %d] MPI_Finalize has not returned after %u s (distributed.timeout_s): the run's "
             "work is done; MPI hung closing its connections, so this rank ends the job\n",
             world_rank(), seconds);
    fflush(stdout);
    fflush(stderr);
    struct sigaction sa = {.sa_handler = on_finalize_timeout}, stop = {.sa_handler = SIG_DFL};
    // the run is over: a stop signal (Slurm's, or a user's kill) ends the rank now, where
    // on_stop_signal would only note it for a step that never comes
    if (sigaction(SIGALRM, &sa, NULL) != 0 || sigaction(SIGTERM, &stop, NULL) != 0 ||
        sigaction(SIGUSR1, &stop, NULL) != 0)
        FAIL("", "cannot install the SIGALRM handler or reset SIGTERM/SIGUSR1 for MPI_Finalize");
    alarm(seconds);
    if (test_switch("HANG_IN_FINALIZE"))
        for (;;) pause(); // what the hang looks like to this rank: a call that never returns
    mpiCheck(MPI_Finalize());
    alarm(0);
}

void mpi_check(int err, const char *what, const char *file, int line) {
    if (err == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(err, msg, &len);
    fail_at(file, line,
            "another rank may have failed first (see its message), or mpirun -np is wrong",
            "%s failed: %s", what, msg);
}

void *xmalloc_at(size_t bytes, const char *file, int line) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p)
        fail_at(file, line, "the model or batch is too large for this machine's memory",
                "out of memory allocating %zu bytes", bytes);
    return p;
}

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

uint64_t hash_string(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

char *readable(char *buf, double x) {
    const char *suffix[] = {"", "K", "M", "B", "T"};
    int i = 0;
    while (x >= 1000.0 && i < 4) {
        x /= 1000.0;
        i++;
    }
    sprintf(buf, "%.2f%s", x, suffix[i]);
    return buf;
}

// Levenshtein distance (first 63 characters): names the closest key to a misspelt one
int edit_distance(const char *a, const char *b) {
    int la = strlen(a) < 63 ? strlen(a) : 63, lb = strlen(b) < 63 ? strlen(b) : 63;
    int prev[64], cur[64];
    for (int j = 0; j <= lb; j++) prev[j] = j;
    for (int i = 1; i <= la; i++) {
        cur[0] = i;
        for (int j = 1; j <= lb; j++) {
            int best = prev[j - 1] + (a[i - 1] != b[j - 1]);
            if (prev[j] + 1 < best) best = prev[j] + 1;
            if (cur[j - 1] + 1 < best) best = cur[j - 1] + 1;
            cur[j] = best;
        }
        memcpy(prev, cur, sizeof prev);
    }
    return prev[lb];
}

// picotron's MFU: 6 FLOPs per parameter per token (forward and backward) plus attention's
// 12*L*H*D*S; train.c divides by the peak of the device this rank runs on
double flops_per_token(const Config *c) {
    if (strcmp(c->model_type, "mamba") == 0) { // 6 per parameter; the scan's few per state left
        double C = c->hidden_size, I = c->expand * C, S = c->state_size, W = c->conv_kernel;
        double R = c->time_step_rank > 0 ? c->time_step_rank : (int)(C + 15) / 16; // 0: auto
        double layer = C + 2 * I * C + I * W + I + (R + 2 * S) * I + I * R + I + I * S + I + C * I;
        return 6 * (c->num_hidden_layers * layer + C +
                    (double)c->vocab_size * C * (c->tie_word_embeddings ? 1 : 2));
    }
    double C = c->hidden_size, D = C / c->num_attention_heads, I = c->intermediate_size;
    double HD = c->num_attention_heads * D, KVD = c->num_key_value_heads * D;
    double layer = 2 * C + 2 * C * HD + 2 * C * KVD + 3 * C * I;
    if (c->num_experts > 0) // a token passes the router and K experts: the parameters it uses
        layer += c->num_experts * C +
                 3 * C * ((double)c->num_experts_per_tok * c->moe_intermediate_size - I);
    double params = c->num_hidden_layers * layer + C +
                    (double)c->vocab_size * C * (c->tie_word_embeddings ? 1 : 2);
    return 6 * params + 12.0 * c->num_hidden_layers * HD * c->seq_length;
}

const char *test_switch(const char *name) {
    char var[96];
    snprintf(var, sizeof var, "PICOTRON_TEST_%s", name);
    return getenv(var);
}

// More ranks than cores take turns on them (8 ranks on a 2-core laptop). A waiting rank naps
// (comm_common.h), and under the default policy each wake-up takes the core from the rank that
// computes; SCHED_BATCH (no privilege needed to lower one's own) lets the waker wait for its turn,
// so a rank keeps its core until it waits itself: half the context switches, and 8 ranks on 2
// cores train about 5% faster (bench/bench_ranks.sh, docs/speed.md).
static void take_turns_on_cores(void) {
#ifdef SCHED_BATCH
    struct sched_param none = {0};
    if (sched_setscheduler(0, SCHED_BATCH, &none) != 0 && world_rank() == 0)
        printf("note: SCHED_BATCH refused (%s): ranks sharing cores run under the default "
               "policy\n",
               strerror(errno));
#endif
}

// More threads than the node's cores make every step wait on the scheduler's time slices
int threads_per_rank(int wanted, int ranks_on_node) {
    cpu_set_t set;
    int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                            : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (ranks_on_node > cores) take_turns_on_cores();
    int fit = cores / ranks_on_node > 1 ? cores / ranks_on_node : 1;
    if (wanted <= fit) return wanted;
    if (world_rank() == 0)
        printf("note: environment.OMP_NUM_THREADS = %d with %d ranks on this node's %d cores: "
               "using %d thread%s per rank\n",
               wanted, ranks_on_node, cores, fit, fit > 1 ? "s" : "");
    return fit;
}

static volatile sig_atomic_t stop_signal = 0;
static void on_stop_signal(int sig) {
    stop_signal = sig;
}

void catch_stop_signals(void) {
    struct sigaction sa = {.sa_handler = on_stop_signal, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGTERM, &sa, NULL) != 0 || sigaction(SIGUSR1, &sa, NULL) != 0)
        FAIL("", "cannot install the SIGTERM/SIGUSR1 handler");
}

int stop_signal_caught(void) {
    return stop_signal;
}
