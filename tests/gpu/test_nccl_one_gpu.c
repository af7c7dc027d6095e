// The NCCL path of backend/cuda/comm_nccl.cu runs on a machine with one GPU: with the test switch
// PICOTRON_TEST_NCCL_GROUP_OF_ONE=1 (set here; utils.h) a group of one rank gets an NCCL
// communicator of one rank, and every all-reduce goes through NCCL: the blocking calls on the
// compute stream (sum, mean, max), the *_start calls on the group's own stream behind an event,
// finished by comm_test() polling the op's event and by comm_wait(). Over one rank each result
// must equal its input bit for bit, so any byte NCCL, a stream or an event gets wrong shows. A
// ring of one (send_recv to oneself) stays a device copy and is checked too.
// Runs as one MPI rank (no mpirun needed); prints one line per check, "N passed, N failed" last.
// Built by tests/gpu/build_test.sh; run by tests/gpu/check.sh.
#include "backend/backend.h"
#include "backend/comm.h"
#include "utils.h"
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed = 0, failed = 0;

// n floats of a reproducible pattern, some negative, none equal to its neighbour
static float *pattern(size_t n, float offset) {
    float *x = (float *)xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = offset + (float)((i * 2654435761u) % 1000003) * 1e-3f - 500;
    return x;
}

// the device buffer's n floats against want: the count of differing elements
static size_t differing(const float *dev, const float *want, size_t n) {
    float *got = (float *)xmalloc(n * sizeof(float));
    device_to_host(got, dev, n * sizeof(float));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += memcmp(&got[i], &want[i], sizeof(float)) != 0;
    free(got);
    return bad;
}

static void report(const char *what, size_t n, size_t bad, double ms) {
    int ok = bad == 0;
    printf("  %-4s %-52s %9zu floats, %zu differ, %.2f ms\n", ok ? "ok" : "FAIL", what, n, bad, ms);
    ok ? passed++ : failed++;
}

// op through a blocking all_reduce or a started one finished by comm_test polling, then comm_wait
static void check_all_reduce(Group *g, ReduceOp op, int started, size_t n, const char *what) {
    float *host = pattern(n, (float)op);
    float *dev = (float *)device_malloc(n * sizeof(float));
    host_to_device(dev, host, n * sizeof(float));
    double t0 = now_seconds();
    if (started) {
        Handle h = all_reduce_start(dev, n, op, g);
        while (!comm_test(&h)) {
        }
        comm_wait(&h); // already finished: must be harmless
    } else {
        all_reduce(dev, n, op, g);
    }
    device_synchronize();
    report(what, n, differing(dev, host, n), 1e3 * (now_seconds() - t0));
    device_free(dev);
    free(host);
}

// expert parallelism's all_to_all over one rank: the part to oneself, a device copy on the
// compute stream (blocking) or on the group's stream behind an event (started)
static void check_all_to_all(Group *g, int started, size_t n, const char *what) {
    float *host = pattern(n, 3);
    float *send_dev = (float *)device_malloc(n * sizeof(float));
    float *recv_dev = (float *)device_malloc(n * sizeof(float));
    host_to_device(send_dev, host, n * sizeof(float));
    size_t counts[1] = {n};
    double t0 = now_seconds();
    if (started) {
        Handle h = all_to_all_start(recv_dev, counts, send_dev, counts, g);
        while (!comm_test(&h)) {
        }
        comm_wait(&h);
    } else {
        all_to_all(recv_dev, counts, send_dev, counts, g);
    }
    device_synchronize();
    report(what, n, differing(recv_dev, host, n), 1e3 * (now_seconds() - t0));
    device_free(send_dev);
    device_free(recv_dev);
    free(host);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    setenv("PICOTRON_TEST_NCCL_GROUP_OF_ONE", "1", 1);
    backend_init(0);
    comm_set_backend("nccl");
    Group g;
    double t0 = now_seconds();
    group_init(&g, MPI_COMM_SELF);
    int ok = g.size == 1 && g.nccl != NULL && g.stream != NULL;
    printf("  %-4s %-52s %.1f ms\n", ok ? "ok" : "FAIL",
           "a one-rank NCCL communicator and its own stream", 1e3 * (now_seconds() - t0));
    ok ? passed++ : failed++;
    if (!ok) {
        printf("%d passed, %d failed\n", passed, failed);
        MPI_Finalize();
        return 1;
    }
    size_t big = (size_t)1 << 24, small = 1000003;
    check_all_reduce(&g, REDUCE_SUM, 0, small, "all_reduce sum (compute stream)");
    check_all_reduce(&g, REDUCE_AVG, 0, small, "all_reduce mean (compute stream)");
    check_all_reduce(&g, REDUCE_MAX, 0, 1, "all_reduce max of one float");
    check_all_reduce(&g, REDUCE_SUM, 1, big, "all_reduce_start sum (own stream, event)");
    check_all_reduce(&g, REDUCE_AVG, 1, big, "all_reduce_start mean (own stream, event)");
    // several in flight at once, finished in reverse order
    enum { IN_FLIGHT = 4 };
    float *host[IN_FLIGHT], *dev[IN_FLIGHT];
    Handle h[IN_FLIGHT];
    t0 = now_seconds();
    for (int i = 0; i < IN_FLIGHT; i++) {
        host[i] = pattern(small, (float)(10 * i));
        dev[i] = (float *)device_malloc(small * sizeof(float));
        host_to_device(dev[i], host[i], small * sizeof(float));
        h[i] = all_reduce_start(dev[i], small, REDUCE_SUM, &g);
    }
    size_t bad = 0;
    for (int i = IN_FLIGHT - 1; i >= 0; i--) {
        comm_wait(&h[i]);
        bad += differing(dev[i], host[i], small);
        device_free(dev[i]);
        free(host[i]);
    }
    report("4 all_reduce_start in flight, waited in reverse", IN_FLIGHT * small, bad,
           1e3 * (now_seconds() - t0));
    // a ring of one: the block comes straight back
    float *ring = pattern(small, 7);
    float *send_dev = (float *)device_malloc(small * sizeof(float));
    float *recv_dev = (float *)device_malloc(small * sizeof(float));
    host_to_device(send_dev, ring, small * sizeof(float));
    t0 = now_seconds();
    Handle hr = send_recv_start(send_dev, 0, recv_dev, 0, small, &g);
    comm_wait(&hr);
    report("send_recv_start in a ring of one", small, differing(recv_dev, ring, small),
           1e3 * (now_seconds() - t0));
    device_free(send_dev);
    device_free(recv_dev);
    free(ring);
    check_all_to_all(&g, 0, small, "all_to_all to oneself (compute stream)");
    check_all_to_all(&g, 1, big, "all_to_all_start to oneself (own stream, event)");
    barrier(&g);
    group_free(&g);
    printf("%d passed, %d failed\n", passed, failed);
    MPI_Finalize();
    return failed == 0 ? 0 : 1;
}
