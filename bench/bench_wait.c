// Why every wait goes through comm_wait(): a 1-float all-reduce over every rank, ITERS times, with
// MPICH's blocking MPI_Allreduce (which busy-polls) and with all_reduce (MPI_Iallreduce, then
// MPI_Testall + sched_yield). With more ranks than cores, a rank that busy-polls keeps the core
// its peers need, and the blocking call gets many times slower.
// usage: mpirun -np 8 build/bench/bench_wait [iters]
#include "backend/comm.h"
#include "utils.h"

#define WARMUP 10

// mean milliseconds per call on the slowest rank
static double time_loop(int blocking, int iters, Group *world) {
    float x = 1.0f;
    for (int i = 0; i < WARMUP; i++) all_reduce(&x, 1, REDUCE_SUM, world);
    barrier(world);
    double start = now_seconds();
    for (int i = 0; i < iters; i++) {
        x = 1.0f;
        if (blocking)
            mpiCheck(MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_FLOAT, MPI_SUM, world->comm));
        else
            all_reduce(&x, 1, REDUCE_SUM, world);
        if (x != (float)world->size) FAIL("", "all-reduce gave %g, want %d", x, world->size);
    }
    double ms = (now_seconds() - start) * 1e3 / iters, worst = 0;
    mpiCheck(MPI_Allreduce(&ms, &worst, 1, MPI_DOUBLE, MPI_MAX, world->comm));
    return worst;
}

int main(int argc, char **argv) {
    mpiCheck(MPI_Init(&argc, &argv));
    int iters = argc > 1 ? atoi(argv[1]) : 200;
    if (iters < 1) user_error("usage: bench_wait [iters]: iters = %s must be >= 1", argv[1]);
    Group world;
    group_init(&world, MPI_COMM_WORLD);
    double blocking = time_loop(1, iters, &world);
    double yielding = time_loop(0, iters, &world);
    if (world.rank == 0)
        printf("1-float all-reduce on %d ranks, %d iterations: MPI_Allreduce %.3f ms, "
               "all_reduce (test + yield) %.3f ms, ratio %.1fx\n",
               world.size, iters, blocking, yielding, blocking / yielding);
    mpiCheck(MPI_Finalize());
    return 0;
}
