// Every collective of backend/comm.h gives what a local reference computes from the values each
// rank holds (sums and means within TOL_REDUCE, relative to the sum of magnitudes; maxima and
// messages exactly), on the world group, on a half-world group whose ranks
// are in reverse order, and on a group of one rank, which must do no MPI. Run with mpirun -np 4
// and -np 8.
// Modes for tests/t_40_comm.sh:
//   --fail-rank R   rank R calls FAIL() while the others wait in all_reduce: the job must end
//   --huge          an all_reduce of 2^31 floats must be refused with a message, not truncated
#include "backend/comm.h"
#include "utils.h"
#include <limits.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

// a float sum of 8 terms, in any order, rounds at most 7 times by 2^-24 of the sum of magnitudes
#define TOL_REDUCE 1e-6
#define NSIZES     3
static const size_t SIZES[NSIZES] = {1, 7, 100003}; // the last one is above the eager limit

static int failures;

// what group rank r holds at element i: a hash in [-1, 1) scaled by 2^(r % 4), different for
// every rank, element and check. Integer arithmetic, not sinf: a vectorised sinf in one loop and a
// scalar one in another may differ in the last bits. The scale is a power of two so that the
// product is exact: a compiler that fuses it into the next add (an FMA, under -march=native) in
// one loop and not in another still rounds the sum the same.
static float value(int r, size_t i, int salt) {
    uint64_t h = ((uint64_t)r * 1000003u + i) * 0x9E3779B97F4A7C15ull + (uint64_t)salt;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    return ((float)(h >> 40) / (float)(1 << 23) - 1.0f) * (float)(1 << (r % 4));
}

static double rel_err(float got, double ref) {
    return fabs(got - ref) / fmax(1.0, fabs(ref));
}
// a sum's error relative to the sum of the magnitudes of its terms: what float rounding bounds
static double sum_err(float got, double ref, double magnitude) {
    return fabs(got - ref) / fmax(1e-30, magnitude);
}

// the worst error over every rank of the job, with an independent (blocking) MPI call
static void report(const char *what, size_t n, Group *g, double err, double tol) {
    double worst = 0;
    mpiCheck(MPI_Allreduce(&err, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    int bad = !(worst <= tol);
    failures += bad;
    if (world_rank() == 0)
        printf("%-5s %-28s n=%-6zu group of %d: max rel err %.1e (tol %.0e)\n", bad ? "FAIL" : "ok",
               what, n, g->size, worst, tol);
}

static void fill_values(float *x, size_t n, int r, int salt) {
    for (size_t i = 0; i < n; i++) x[i] = value(r, i, salt);
}

static void check_all_reduce(Group *g, size_t n, int salt) {
    static const char *names[] = {"all_reduce sum", "all_reduce avg", "all_reduce max"};
    float *x = xmalloc(n * sizeof(float));
    for (int op = REDUCE_SUM; op <= REDUCE_MAX; op++) {
        fill_values(x, n, g->rank, salt + op);
        all_reduce(x, n, (ReduceOp)op, g);
        double err = 0;
        for (size_t i = 0; i < n; i++) {
            double sum = 0, mag = 0, max = -INFINITY;
            for (int r = 0; r < g->size; r++) {
                sum += value(r, i, salt + op);
                mag += fabs(value(r, i, salt + op));
                max = fmax(max, value(r, i, salt + op));
            }
            if (op == REDUCE_SUM) err = fmax(err, sum_err(x[i], sum, mag));
            if (op == REDUCE_AVG) err = fmax(err, sum_err(x[i], sum / g->size, mag / g->size));
            if (op == REDUCE_MAX) err = fmax(err, rel_err(x[i], max));
        }
        report(names[op], n, g, err, op == REDUCE_MAX ? 0 : TOL_REDUCE);
        // tensor parallelism keeps replicas that must stay alike: the same bits on every rank
        float *first = xmalloc(n * sizeof(float));
        memcpy(first, x, n * sizeof(float));
        mpiCheck(MPI_Bcast(first, (int)n, MPI_FLOAT, 0, g->comm));
        report("  same bits on every rank", n, g, memcmp(first, x, n * sizeof(float)) != 0, 0);
        free(first);
    }
    free(x);
}

// ZeRO-1's pair: reduce_scatter leaves this rank's piece of n = pieces * size floats reduced (sum
// or mean over the group), then all_gather hands every rank every piece: the all-reduce, in two
static void check_reduce_scatter_all_gather(Group *g, size_t pieces, int salt) {
    static const char *names[] = {"reduce_scatter sum", "reduce_scatter avg"};
    size_t n = pieces * g->size, mine = pieces * g->rank;
    float *x = xmalloc(n * sizeof(float));
    for (int op = REDUCE_SUM; op <= REDUCE_AVG; op++) {
        fill_values(x, n, g->rank, salt + op);
        reduce_scatter(x, n, (ReduceOp)op, g);
        double err = 0, gathered = 0;
        for (size_t i = mine; i < mine + pieces; i++) {
            double sum = 0, mag = 0;
            for (int r = 0; r < g->size; r++) {
                sum += value(r, i, salt + op);
                mag += fabs(value(r, i, salt + op));
            }
            double scale = op == REDUCE_AVG ? 1.0 / g->size : 1.0;
            err = fmax(err, sum_err(x[i], sum * scale, mag * scale));
        }
        report(names[op], n, g, err, TOL_REDUCE);
        // every rank's piece, as that rank now holds it, must arrive whole and exact
        for (size_t i = mine; i < mine + pieces; i++) x[i] = value(g->rank, i, salt + 7);
        all_gather(x, n, g);
        for (size_t i = 0; i < n; i++)
            gathered = fmax(gathered, rel_err(x[i], value((int)(i / pieces), i, salt + 7)));
        report(op == REDUCE_SUM ? "all_gather (after sum)" : "all_gather (after avg)", n, g,
               gathered, 0);
    }
    free(x);
}

// two reductions in flight at once, with a message to the next rank of the same group started
// after the first on even ranks and before it on odd ones (MPI lets the two orders meet; a pair's
// reduction is messages too, and they must not take each other's), completed in reverse order
static void check_overlap(Group *g, size_t n, int salt) {
    float *a = xmalloc(n * sizeof(float)), *b = xmalloc(n * sizeof(float));
    float *mine = xmalloc(n * sizeof(float)), *from_prev = xmalloc(n * sizeof(float));
    int next = (g->rank + 1) % g->size, prev = (g->rank - 1 + g->size) % g->size;
    fill_values(a, n, g->rank, salt);
    fill_values(b, n, g->rank, salt + 1);
    fill_values(mine, n, g->rank, salt + 2);
    Handle hm, ha;
    if (g->rank % 2 == 1) hm = send_recv_start(mine, next, from_prev, prev, n, g);
    ha = all_reduce_start(a, n, REDUCE_AVG, g);
    if (g->rank % 2 == 0) hm = send_recv_start(mine, next, from_prev, prev, n, g);
    Handle hb = all_reduce_start(b, n, REDUCE_MAX, g);
    comm_wait(&hb);
    comm_wait(&hm);
    comm_wait(&ha);
    comm_wait(&ha); // waiting on a finished handle is harmless and does not scale twice
    double err = 0;
    for (size_t i = 0; i < n; i++) {
        double sum = 0, mag = 0, max = -INFINITY;
        for (int r = 0; r < g->size; r++) {
            sum += value(r, i, salt);
            mag += fabs(value(r, i, salt));
            max = fmax(max, value(r, i, salt + 1));
        }
        err = fmax(err, sum_err(a[i], sum / g->size, mag / g->size));
        err = fmax(err, rel_err(b[i], max));
        err = fmax(err, rel_err(from_prev[i], value(prev, i, salt + 2)));
    }
    report("2 all_reduce_start, rev wait", n, g, err, TOL_REDUCE);
    free(a);
    free(b);
    free(mine);
    free(from_prev);
}

// A running sum travels once round the ring with send/recv: rank 0 starts it, rank r adds its
// values, rank 0 gets the total back. Each rank checks the partial sum it receives.
static void check_send_recv_chain(Group *g, size_t n, int salt) {
    float *x = xmalloc(n * sizeof(float)), *ref = xmalloc(n * sizeof(float));
    int next = (g->rank + 1) % g->size, prev = (g->rank - 1 + g->size) % g->size;
    if (g->rank == 0) {
        fill_values(x, n, 0, salt);
        send(x, n, next, g);
    }
    recv(x, n, prev, g);
    // the same float additions, in the same order, as the ranks before this one made
    int upto = g->rank == 0 ? g->size : g->rank;
    for (size_t i = 0; i < n; i++) {
        ref[i] = 0;
        for (int r = 0; r < upto; r++) ref[i] += value(r, i, salt);
    }
    double err = 0;
    for (size_t i = 0; i < n; i++) err = fmax(err, rel_err(x[i], ref[i]));
    if (g->rank != 0) {
        for (size_t i = 0; i < n; i++) x[i] += value(g->rank, i, salt);
        send(x, n, next, g);
    }
    report("send/recv round the ring", n, g, err, 0);
    free(x);
    free(ref);
}

// Both directions of the ring at once (ring attention's K/V and their gradients), the second
// started before the first is waited on.
static void check_send_recv_ring(Group *g, size_t n, int salt) {
    float *mine = xmalloc(n * sizeof(float)), *mine2 = xmalloc(n * sizeof(float));
    float *from_prev = xmalloc(n * sizeof(float)), *from_next = xmalloc(n * sizeof(float));
    int next = (g->rank + 1) % g->size, prev = (g->rank - 1 + g->size) % g->size;
    fill_values(mine, n, g->rank, salt);
    fill_values(mine2, n, g->rank, salt + 1);
    send_recv(mine, next, from_prev, prev, n, g);
    double err = 0;
    for (size_t i = 0; i < n; i++) err = fmax(err, rel_err(from_prev[i], value(prev, i, salt)));
    report("send_recv to next", n, g, err, 0);

    Handle fwd = send_recv_start(mine, next, from_prev, prev, n, g);
    Handle bwd = send_recv_start(mine2, prev, from_next, next, n, g);
    comm_wait(&bwd);
    comm_wait(&fwd);
    err = 0;
    for (size_t i = 0; i < n; i++)
        err = fmax(err, fmax(rel_err(from_prev[i], value(prev, i, salt)),
                             rel_err(from_next[i], value(next, i, salt + 1))));
    report("2 send_recv_start, both ways", n, g, err, 0);
    free(mine);
    free(mine2);
    free(from_prev);
    free(from_next);
}

// expert parallelism's per-pair counts: up to n floats from rank src to rank dst, none from a rank
// to the next one (an expert no token of that rank chose) and none for a quarter of the others
static size_t a2a_count(int src, int dst, size_t n, int size, int salt) {
    float u = value(src, (size_t)dst, salt) / (float)(1 + src); // in [-1, 1)
    if (size > 1 && dst == (src + 1) % size) return 0;
    return u < -0.5f ? 0 : 1 + (size_t)((u + 0.5f) / 1.5f * (float)n) % n;
}

// the float at index i of what rank src sends rank dst: no two senders, receivers or places alike
static float a2a_value(int src, int dst, size_t i, int salt) {
    return value(src, i, salt + 1000 * (dst + 1));
}

// every rank sends every rank (itself too) its own count of floats: the counts go first
// (all_to_all_host_counts must hand each rank what its senders chose), then all_to_all, blocking
// and started then waited, must put each sender's floats in its place exactly, and count for
// trace.c the bytes to the other ranks only
static void check_all_to_all(Group *g, size_t n, int salt) {
    int me = g->rank, size = g->size;
    size_t *send_counts = xmalloc(size * sizeof(size_t)),
           *recv_counts = xmalloc(size * sizeof(size_t));
    size_t send_n = 0, recv_n = 0, bytes = 0, zeros = 0;
    for (int r = 0; r < size; r++) {
        send_counts[r] = a2a_count(me, r, n, size, salt);
        send_n += send_counts[r];
        bytes += r == me ? 0 : send_counts[r] * sizeof(float);
    }
    for (int src = 0; src < size; src++)
        for (int dst = 0; dst < size; dst++) zeros += a2a_count(src, dst, n, size, salt) == 0;
    all_to_all_host_counts(recv_counts, send_counts, 1, g);
    double bad_counts = 0;
    for (int r = 0; r < size; r++) {
        bad_counts += recv_counts[r] != a2a_count(r, me, n, size, salt);
        recv_n += recv_counts[r];
    }
    report("all_to_all_host_counts", (size_t)size, g, bad_counts, 0);
    float *sendbuf = xmalloc(send_n * sizeof(float)), *recvbuf = xmalloc(recv_n * sizeof(float));
    for (int pass = 0; pass < 2; pass++) {
        int s = salt + pass;
        float *x = sendbuf;
        for (int r = 0; r < size; r++)
            for (size_t i = 0; i < send_counts[r]; i++) *x++ = a2a_value(me, r, i, s);
        for (size_t i = 0; i < recv_n; i++) recvbuf[i] = NAN; // a float never written shows
        double bad = 0;
        if (pass == 0) {
            all_to_all(recvbuf, recv_counts, sendbuf, send_counts, g);
        } else {
            Handle h = all_to_all_start(recvbuf, recv_counts, sendbuf, send_counts, g);
            bad += h.bytes != (size > 1 ? bytes : 0); // a group of one sends nothing
            comm_wait(&h);
        }
        x = recvbuf;
        for (int r = 0; r < size; r++)
            for (size_t i = 0; i < recv_counts[r]; i++) bad += *x++ != a2a_value(r, me, i, s);
        char what[64];
        snprintf(what, sizeof what, "all_to_all%s (%zu/%d pairs 0)", pass ? "_start" : "", zeros,
                 size * size);
        report(what, n, g, bad, 0);
    }
    free(sendbuf);
    free(recvbuf);
    free(send_counts);
    free(recv_counts);
}

static void check_group(Group *g, int salt) {
    for (int s = 0; s < NSIZES; s++) {
        size_t n = SIZES[s];
        check_all_reduce(g, n, salt);
        check_overlap(g, n, salt + 3);
        if (g->size > 1) check_send_recv_chain(g, n, salt + 9);
        check_send_recv_ring(g, n, salt + 10);
        check_reduce_scatter_all_gather(g, n, salt + 11);
        check_all_to_all(g, n, salt + 12);
    }
    barrier(g);
}

// a group of one answers every call itself: the handle comes back already complete
static void check_group_of_one(Group *g) {
    float x = 3.5f;
    Handle h = all_reduce_start(&x, 1, REDUCE_AVG, g);
    int bad = h.count != 0 || x != 3.5f;
    comm_wait(&h);
    bad |= x != 3.5f;
    double err = bad;
    report("group of one: handle done", 1, g, err, 0);
    check_group(g, 100);
}

// world ranks 2i and 2i + 1 as a tensor-parallel group
static void tp_pair(Group *pair) {
    MPI_Comm comm;
    mpiCheck(MPI_Comm_split(MPI_COMM_WORLD, world_rank() / 2, world_rank(), &comm));
    group_init(pair, comm);
    pair->kind = GROUP_TP;
}

int main(int argc, char **argv) {
    mpiCheck(MPI_Init(&argc, &argv));
    Group world;
    group_init(&world, MPI_COMM_WORLD);

    if (argc == 3 && strcmp(argv[1], "--fail-rank") == 0) {
        float x = 1.0f;
        if (world.rank == atoi(argv[2])) {
            sleep(1); // the others are inside all_reduce by now
            FAIL("this is test_comm --fail-rank: the failure is on purpose",
                 "rank %d fails while %d ranks wait in all_reduce", world.rank, world.size - 1);
        }
        all_reduce(&x, 1, REDUCE_SUM, &world);
        fprintf(stderr, "[rank %d] all_reduce returned although a rank failed\n", world.rank);
        return 0; // the script fails the test when it sees this line or a zero exit code
    }
    if (argc == 2 && strcmp(argv[1], "--three-in-flight") == 0) {
        Group pair; // a tp pair's third all-reduce in flight would wait for ever
        tp_pair(&pair);
        float x[3] = {1, 2, 3};
        Handle h[3];
        for (int i = 0; i < 3; i++) h[i] = all_reduce_start(&x[i], 1, REDUCE_SUM, &pair);
        fprintf(stderr, "[rank %d] a third all-reduce started\n", world.rank);
        for (int i = 0; i < 3; i++) comm_wait(&h[i]);
        return 0;
    }
    if (argc == 2 && strcmp(argv[1], "--huge") == 0) {
        float x = 0; // never read: the count is refused before MPI sees the pointer
        all_reduce(&x, (size_t)INT_MAX + 1, REDUCE_SUM, &world);
        fprintf(stderr, "[rank %d] all_reduce accepted 2^31 floats\n", world.rank);
        return 0;
    }

    check_group(&world, 0);
    MPI_Comm half_comm, one_comm;
    // even and odd world ranks, each in reverse order, so a group rank is not a world rank
    mpiCheck(MPI_Comm_split(MPI_COMM_WORLD, world.rank % 2, -world.rank, &half_comm));
    Group half;
    group_init(&half, half_comm);
    check_group(&half, 20);
    // tensor-parallel pairs on one node reduce through shared memory (comm_shared_pair.c), which
    // holds as much as their first all-reduce: here 1 float (65536 at least), so 100003 goes over
    // MPI; in the second pair 100003 first, so every size goes through shared memory
    for (int first = 0; first < 2; first++) {
        Group pair;
        tp_pair(&pair);
        if (first) check_all_reduce(&pair, SIZES[NSIZES - 1], 40);
        check_group(&pair, 30 + 20 * first);
        group_free(&pair);
    }
    mpiCheck(MPI_Comm_split(MPI_COMM_WORLD, world.rank, 0, &one_comm));
    Group one;
    group_init(&one, one_comm);
    check_group_of_one(&one);

    group_free(&one);
    group_free(&half);
    group_free(&world);
    if (world.rank == 0) printf("%d ranks: %d failed checks\n", world.size, failures);
    mpiCheck(MPI_Finalize());
    return failures ? 1 : 0;
}
