// Errors that end the whole job, checked I/O, timing, threads and signals.
#define _GNU_SOURCE // CPU_COUNT
#include "utils.h"
#include <cjson/cJSON.h>
#include <mpi.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>
#include <stdarg.h>
#include <errno.h>
#include <fcntl.h>
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
    MPI_Finalize();
    exit(1);
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

// why the last open_regular_file (or read_whole_file, xfopen) failed, worded to follow the path
static char file_problem[160];

const char *file_error(void) {
    return file_problem;
}

static int refuse(int err, const char *why) {
    snprintf(file_problem, sizeof file_problem, "%s", why);
    errno = err;
    return -1;
}

// O_NONBLOCK: opening a FIFO for reading returns at once instead of waiting for a writer, so
// fstat can refuse it; a regular file ignores the flag, which is cleared before any read
int open_regular_file(const char *path, int flags) {
    int fd = open(path, flags | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        int err = errno;
        if (err == EISDIR) return refuse(err, "is a directory, not a file (name a file)");
        snprintf(file_problem, sizeof file_problem, "cannot be opened: %s", strerror(err));
        errno = err;
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        snprintf(file_problem, sizeof file_problem, "cannot be read: %s", strerror(err));
        errno = err;
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return refuse(S_ISDIR(st.st_mode) ? EISDIR : EINVAL,
                      S_ISDIR(st.st_mode)    ? "is a directory, not a file (name a file)"
                      : S_ISFIFO(st.st_mode) ? "is a FIFO (named pipe), not a regular file "
                                               "(name a file)"
                      : S_ISSOCK(st.st_mode) ? "is a socket, not a regular file (name a file)"
                                             : "is a device, not a regular file (name a file)");
    }
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
        close(fd);
        return refuse(errno, "cannot be read: fcntl failed");
    }
    return fd;
}

// the path an open stream writes to, for messages ("?" when /proc cannot say)
static const char *stream_path(FILE *f, char *buf, size_t size) {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fileno(f));
    ssize_t n = readlink(link, buf, size - 1);
    if (n < 0) return "?";
    buf[n] = '\0';
    return buf;
}

FILE *xfopen_at(const char *path, const char *mode, const char *file, int line) {
    (void)file, (void)line;
    if (mode[0] == 'r') { // reading: regular files only, through the one check
        int fd = open_regular_file(path, strchr(mode, '+') ? O_RDWR : O_RDONLY);
        if (fd < 0) user_error("%s: %s %s", program_invocation_short_name, path, file_error());
        FILE *f = fdopen(fd, mode);
        if (!f)
            user_error("%s: %s cannot be opened: %s", program_invocation_short_name, path,
                       strerror(errno));
        return f;
    }
    FILE *f = fopen(path, mode);
    if (!f)
        user_error("%s: %s cannot be opened for writing: %s", program_invocation_short_name, path,
                   strerror(errno));
    return f;
}

void xfread_at(void *ptr, size_t size, size_t count, FILE *f, const char *file, int line) {
    if (fread(ptr, size, count, f) == count) return;
    char buf[4096];
    fail_at(file, line, "the file is truncated or not in the expected format",
            "short read from %s (%zu items of %zu bytes): %s", stream_path(f, buf, sizeof buf),
            count, size, ferror(f) ? strerror(errno) : "the file ended early");
}

void xfwrite_at(const void *ptr, size_t size, size_t count, FILE *f, const char *file, int line) {
    if (fwrite(ptr, size, count, f) == count) return;
    char buf[4096];
    fail_at(file, line, "is the disk full?", "short write to %s (%zu items of %zu bytes): %s",
            stream_path(f, buf, sizeof buf), count, size, strerror(errno));
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

char *read_whole_file(const char *path, size_t *size) {
    int fd = open_regular_file(path, O_RDONLY);
    if (fd < 0) return NULL;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        snprintf(file_problem, sizeof file_problem, "cannot be read: %s", strerror(err));
        errno = err;
        return NULL;
    }
    size_t n = (size_t)st.st_size, got = 0;
    char *bytes = xmalloc(n + 1); // zeroed: text ends in '\0'
    while (got < n) {
        ssize_t r = read(fd, bytes + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int err = r < 0 ? errno : EIO;
            close(fd);
            free(bytes);
            snprintf(file_problem, sizeof file_problem, "cannot be read: %s",
                     r < 0 ? strerror(err) : "it ended early (did it change while it was read?)");
            errno = err;
            return NULL;
        }
        got += (size_t)r;
    }
    close(fd);
    if (size) *size = n;
    return bytes;
}

int make_dirs(const char *path) {
    char *dir = xmalloc(strlen(path) + 1);
    strcpy(dir, path);
    for (char *p = dir + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char end = *p;
        *p = '\0';
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
            int err = errno;
            free(dir);
            errno = err;
            return -1;
        }
        *p = end;
        if (end == '\0') break;
    }
    free(dir);
    return 0;
}

// The marker a "\u0000" becomes before parsing: U+FFFF, the same six characters long, which no
// text needs (Unicode's noncharacter), so the tree shows which string held the NUL
#define NUL_MARK "\xEF\xBF\xBF"

// the dotted key of the first string (or key) holding the marker, into path; 1 when found
static int find_marked(const cJSON *item, char *path, size_t size) {
    int index = 0;
    for (const cJSON *c = item->child; c; c = c->next, index++) {
        size_t len = strlen(path);
        if (cJSON_IsArray(item))
            snprintf(path + len, size - len, "[%d]", index);
        else
            snprintf(path + len, size - len, "%s%s", len ? "." : "", c->string);
        if ((c->string && strstr(c->string, NUL_MARK)) ||
            (cJSON_IsString(c) && strstr(c->valuestring, NUL_MARK)) || find_marked(c, path, size))
            return 1;
        path[len] = '\0';
    }
    return 0;
}

cJSON *json_parse(const char *text, size_t size, const char **error_at, const char *where) {
    if (strlen(text) < size)
        user_error("%s: byte %zu is a NUL byte, which JSON text cannot hold (is it a binary "
                   "file?)",
                   where, strlen(text));
    // every backslash in valid JSON starts an escape inside a string: two characters at least
    const char *nul = NULL;
    for (const char *p = text; *p && !nul; p++)
        if (*p == '\\' && p[1] == 'u' && strncmp(p + 2, "0000", 4) == 0)
            nul = p;
        else if (*p == '\\' && p[1])
            p++;
    // size + 1: the '\0' after the text, which tells cJSON that nothing follows the value
    if (!nul) return cJSON_ParseWithLengthOpts(text, size + 1, error_at, 1);
    char *marked = xmalloc(size + 1);
    memcpy(marked, text, size);
    memcpy(marked + (nul - text), "\\uFFFF", 6);
    cJSON *root = cJSON_ParseWithLengthOpts(marked, size + 1, NULL, 1);
    char key[4096] = "";
    // one marker, 3 bytes that become 6 below: room kept for them
    if (root && !find_marked(root, key, sizeof key - 8)) key[0] = '\0';
    cJSON_Delete(root);
    free(marked);
    for (char *m; (m = strstr(key, NUL_MARK));) // the key as the file writes it
        memmove(m + 6, m + 3, strlen(m + 3) + 1), memcpy(m, "\\u0000", 6);
    long line = 1;
    for (const char *p = text; p < nul; p++) line += *p == '\n';
    char at[32] = ""; // a text of one line (a JSON Lines document): where names the line
    if (memchr(text, '\n', size ? size - 1 : 0)) snprintf(at, sizeof at, " (line %ld)", line);
    user_error("%s: %s%s holds \"\\u0000\"%s, a NUL character that would cut the string short; "
               "remove it",
               where, key[0] ? "key " : "a string", key, at);
}

// picotron's MFU: 6 FLOPs per parameter per token (forward and backward) plus attention's
// 12*L*H*D*S; train.c divides by the peak of the device this rank runs on
double flops_per_token(const Config *c) {
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

// More threads than the node's cores make every step wait on the scheduler's time slices
int threads_per_rank(int wanted, int ranks_on_node) {
    cpu_set_t set;
    int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                            : (int)sysconf(_SC_NPROCESSORS_ONLN);
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
