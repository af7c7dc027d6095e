// The process group manager builds picotron's 4D grid: every rank's coordinates satisfy
// global_rank = ((dp_rank*pp + pp_rank)*cp + cp_rank)*tp + tp_rank; each axis group holds exactly
// the ranks that share the other three coordinates, in axis order (checked by gathering the
// members' global ranks inside the group); cp_dp holds the ranks with the same pp and tp, at
// dp_rank*cp + cp_rank; pipeline and context neighbours are the right ranks (checked by sending
// global ranks to them); the embed group holds the first and the last stage. With --ep E (expert
// parallelism, E dividing D): ep_rank = dp_rank % E, the ep group holds the E consecutive dp ranks
// of this rank's block, the other coordinates alike, and expert_dp the ranks of the same ep_rank,
// pp and tp, at (dp_rank/E)*cp + cp_rank. No tolerance: every comparison is exact.
// usage: mpirun -np N test_pgm --dp D --pp P --cp C --tp T [--ep E]  (N = D*P*C*T, or the error)
#include "process_group_manager.h"
#include "utils.h"
#include <string.h>

static int failures, checks;
static int tp, cp, pp, dp, ep = 1;

static int grid(int d, int p, int c, int t) {
    return ((d * pp + p) * cp + c) * tp + t;
}

static void expect(int ok, const ProcessGroupManager *m, const char *what) {
    checks++;
    if (!ok) {
        failures++;
        fprintf(stderr, "[rank %d] %s: %s is wrong\n", m->global_rank, m->name, what);
    }
}

// Gathers the members' global ranks inside g and compares them, in order, with want[0..size).
static void check_members(Group *g, const int *want, int size, const ProcessGroupManager *m,
                          const char *what) {
    char msg[96];
    snprintf(msg, sizeof msg, "%s group size (%d, want %d)", what, g->size, size);
    expect(g->size == size, m, msg);
    if (g->size != size) return;
    int me = m->global_rank, got[64];
    mpiCheck(MPI_Allgather(&me, 1, MPI_INT, got, 1, MPI_INT, g->comm));
    for (int j = 0; j < size; j++) {
        snprintf(msg, sizeof msg, "%s member %d (global rank %d, want %d)", what, j, got[j],
                 want[j]);
        expect(got[j] == want[j], m, msg);
    }
}

// sends this rank's global rank to `dst` and checks that the one arriving from `src` is `want`
static void check_neighbour(Group *g, int dst, int src, int want, const ProcessGroupManager *m,
                            const char *what) {
    float me = (float)m->global_rank, got = -1;
    send_recv(&me, dst, &got, src, 1, g);
    char msg[96];
    snprintf(msg, sizeof msg, "%s (got global rank %d, want %d)", what, (int)got, want);
    expect((int)got == want, m, msg);
}

// sends global ranks to the neighbours pp_prev and pp_next name, and round the context ring
// (cp rank c +- 1, as ring attention counts them), and checks that the right ranks answer
static void check_exchanges(ProcessGroupManager *m) {
    int d = m->dp_rank, p = m->pp_rank, c = m->cp_rank, t = m->tp_rank, rank = m->global_rank;
    // Activations go to pp_next, gradients to pp_prev. In each direction even stages send first
    // and odd ones receive first, so every send meets its receive.
    for (int dir = 0; dir < 2; dir++) {
        int to = dir == 0 ? m->pp_next : m->pp_prev, from = dir == 0 ? m->pp_prev : m->pp_next;
        int want_from = grid(d, dir == 0 ? p - 1 : p + 1, c, t);
        for (int phase = 0; phase < 2; phase++) {
            float me = (float)rank, got = -1;
            int sending = (p % 2) == phase;
            if (sending && to >= 0) send(&me, 1, to, &m->pp);
            if (!sending && from >= 0) {
                recv(&got, 1, from, &m->pp);
                expect((int)got == want_from, m,
                       dir == 0 ? "the rank pp_prev names" : "the rank pp_next names");
            }
        }
    }
    if (cp > 1) {
        int next = (c + 1) % cp, prev = (c + cp - 1) % cp;
        check_neighbour(&m->cp, next, prev, grid(d, p, prev, t), m,
                        "the previous rank of the ring");
        check_neighbour(&m->cp, prev, next, grid(d, p, next, t), m, "the next rank of the ring");
    }
}

static int flag(int argc, char **argv, const char *name, int fallback) {
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0) return atoi(argv[i + 1]);
    if (fallback > 0) return fallback;
    user_error("usage: test_pgm --dp D --pp P --cp C --tp T [--ep E] (missing %s)", name);
}

int main(int argc, char **argv) {
    mpiCheck(MPI_Init(&argc, &argv));
    user_errors_init();
    dp = flag(argc, argv, "--dp", 0);
    pp = flag(argc, argv, "--pp", 0);
    cp = flag(argc, argv, "--cp", 0);
    tp = flag(argc, argv, "--tp", 0);
    ep = flag(argc, argv, "--ep", 1);
    ProcessGroupManager m;
    process_group_manager_init(&m, tp, cp, pp, dp, ep);
    int d = m.dp_rank, p = m.pp_rank, c = m.cp_rank, t = m.tp_rank, want[64];
    int rank;
    mpiCheck(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    if (tp * cp * pp * dp > 64) user_error("test_pgm checks at most 64 ranks");

    expect(m.global_rank == rank && grid(d, p, c, t) == rank, &m, "global rank vs the formula");
    expect(d >= 0 && d < dp && p >= 0 && p < pp && c >= 0 && c < cp && t >= 0 && t < tp, &m,
           "coordinate range");
    expect(m.tp_size == tp && m.cp_size == cp && m.pp_size == pp && m.dp_size == dp, &m, "sizes");
    expect(m.tp.rank == t && m.cp.rank == c && m.pp.rank == p, &m, "rank inside each axis group");
    expect(m.cp_dp.rank == d * cp + c, &m, "rank inside cp_dp");
    char name[96];
    if (ep > 1)
        snprintf(name, sizeof name, "TP(%d)-CP(%d)-PP(%d)-DP(%d)-EP(%d)-Rank(%d)", t, c, p, d,
                 d % ep, rank);
    else
        snprintf(name, sizeof name, "TP(%d)-CP(%d)-PP(%d)-DP(%d)-Rank(%d)", t, c, p, d, rank);
    expect(strcmp(name, m.name) == 0, &m, "name");

    for (int j = 0; j < m.world_size; j++) want[j] = j;
    check_members(&m.world, want, m.world_size, &m, "world");
    for (int j = 0; j < tp; j++) want[j] = grid(d, p, c, j);
    check_members(&m.tp, want, tp, &m, "tp");
    for (int j = 0; j < cp; j++) want[j] = grid(d, p, j, t);
    check_members(&m.cp, want, cp, &m, "cp");
    for (int j = 0; j < pp; j++) want[j] = grid(d, j, c, t);
    check_members(&m.pp, want, pp, &m, "pp");
    for (int j = 0; j < dp * cp; j++) want[j] = grid(j / cp, p, j % cp, t);
    check_members(&m.cp_dp, want, dp * cp, &m, "cp_dp");
    expect(m.ep_size == ep && m.ep_rank == d % ep && m.ep.rank == d % ep, &m, "ep_rank");
    for (int j = 0; j < ep; j++) want[j] = grid(d / ep * ep + j, p, c, t);
    check_members(&m.ep, want, ep, &m, "ep");
    for (int j = 0; j < dp / ep * cp; j++) want[j] = grid(j / cp * ep + d % ep, p, j % cp, t);
    check_members(&m.expert_dp, want, dp / ep * cp, &m, "expert_dp");
    // first and last stage together; a middle stage, or pp == 1, alone
    int ends = (p == 0 || p == pp - 1) && pp > 1;
    want[0] = ends ? grid(d, 0, c, t) : rank;
    want[1] = grid(d, pp - 1, c, t);
    check_members(&m.embed, want, ends ? 2 : 1, &m, "embed");

    expect(m.pp_is_first == (p == 0) && m.pp_is_last == (p == pp - 1), &m, "pp_is_first/last");
    expect(m.pp_prev == (p == 0 ? -1 : p - 1), &m, "pp_prev");
    expect(m.pp_next == (p == pp - 1 ? -1 : p + 1), &m, "pp_next");
    // a wrong neighbour would make the exchanges below wait forever: report it and stop there
    int fields_ok = failures == 0, all_ok;
    mpiCheck(MPI_Allreduce(&fields_ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    if (all_ok) check_exchanges(&m);

    int counts[2] = {failures, checks}, total[2];
    mpiCheck(MPI_Allreduce(counts, total, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    if (rank == 0)
        printf("dp=%d pp=%d cp=%d tp=%d ep=%d on %d ranks: %d checks, %d wrong (rank 0 is %s)\n",
               dp, pp, cp, tp, ep, m.world_size, total[1], total[0], m.name);
    process_group_manager_free(&m);
    mpiCheck(MPI_Finalize());
    return total[0] ? 1 : 0;
}
