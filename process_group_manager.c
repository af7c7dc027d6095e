// The 4D grid of ranks (picotron's process_group_manager.py).
// Ranks are laid out dp-major, tp fastest:
//     global_rank = ((dp_rank*pp + pp_rank)*cp + cp_rank)*tp + tp_rank
// so tensor-parallel peers, which talk most, are neighbours (on one node in a real cluster).
// Each axis gets one communicator: the ranks that share every OTHER coordinate. MPI_Comm_split
// groups ranks by `color` and orders them by `key`, so the key is the axis coordinate and a rank's
// place in its group is its coordinate on that axis.
#include "process_group_manager.h"
#include <string.h>
#include "utils.h"

static void split(Group *g, GroupKind kind, int color, int key) {
    MPI_Comm comm;
    mpiCheck(MPI_Comm_split(MPI_COMM_WORLD, color, key, &comm));
    group_init(g, comm);
    g->kind = kind; // trace.c counts each axis's traffic apart
}

void process_group_manager_init(ProcessGroupManager *pgm, int tp, int cp, int pp, int dp, int ep) {
    int world_size, rank;
    mpiCheck(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    mpiCheck(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
    if (tp < 1 || cp < 1 || pp < 1 || dp < 1)
        user_error("config error: tp_size=%d cp_size=%d pp_size=%d dp_size=%d must each be >= 1 "
                   "(set them in the config's \"distributed\" section)",
                   tp, cp, pp, dp);
    if (ep < 1 || dp % ep != 0)
        user_error("config error: distributed.ep_size = %d must divide distributed.dp_size = %d "
                   "(expert parallelism splits the experts over groups of ep data-parallel ranks)",
                   ep, dp);
    long grid = (long)tp * cp * pp * dp;
    if (grid != world_size)
        user_error("config error: tp*cp*pp*dp = %d*%d*%d*%d = %ld but mpirun started %d rank%s "
                   "(run mpirun -np %ld)",
                   tp, cp, pp, dp, grid, world_size, world_size == 1 ? "" : "s", grid);

    *pgm = (ProcessGroupManager){.global_rank = rank,
                                 .world_size = world_size,
                                 .tp_size = tp,
                                 .cp_size = cp,
                                 .pp_size = pp,
                                 .dp_size = dp,
                                 .ep_size = ep};
    // invert global_rank = ((dp_rank*pp + pp_rank)*cp + cp_rank)*tp + tp_rank
    pgm->tp_rank = rank % tp;
    pgm->cp_rank = (rank / tp) % cp;
    pgm->pp_rank = (rank / (tp * cp)) % pp;
    pgm->dp_rank = rank / (tp * cp * pp);
    pgm->ep_rank = pgm->dp_rank % ep;
    int t = pgm->tp_rank, c = pgm->cp_rank, p = pgm->pp_rank, d = pgm->dp_rank, e = pgm->ep_rank;

    // a duplicate, so the library's messages never meet a caller's on MPI_COMM_WORLD
    MPI_Comm world;
    mpiCheck(MPI_Comm_dup(MPI_COMM_WORLD, &world));
    group_init(&pgm->world, world);
    pgm->world.kind = GROUP_WORLD;
    // color: the other coordinates, flattened; key: the coordinate along the axis
    split(&pgm->tp, GROUP_TP, (d * pp + p) * cp + c, t);
    split(&pgm->cp, GROUP_CP, (d * pp + p) * tp + t, c);
    split(&pgm->pp, GROUP_PP, (d * cp + c) * tp + t, p);
    // the same ranks again, for the gradients of the interleaved pipeline's ring (its activations
    // travel on pp): each direction is then its own stream of messages, matched in order
    split(&pgm->pp_grad, GROUP_PP, (d * cp + c) * tp + t, p);
    // gradients are averaged over every rank that holds the same weights: same pp and tp
    split(&pgm->cp_dp, GROUP_DP, p * tp + t, d * cp + c);
    // expert parallelism: ep consecutive dp ranks (the other coordinates alike) trade tokens; an
    // expert's replicas are the ranks of the same ep_rank in every such group, and every cp rank
    split(&pgm->ep, GROUP_EP, ((d / ep * pp + p) * cp + c) * tp + t, e);
    split(&pgm->expert_dp, GROUP_DP, (e * pp + p) * tp + t, d / ep * cp + c);

    // The tied embedding lives on the first stage (wte) and the last (lm_head); their gradients
    // are summed between the two. A middle stage holds neither copy: it gets a group of one of its
    // own (a color no other rank uses), so the Group is valid everywhere and an all_reduce there
    // is a no-op. With pp == 1 the first stage is the last: a group of one as well.
    pgm->pp_is_first = p == 0;
    pgm->pp_is_last = p == pp - 1;
    int shared = (d * cp + c) * tp + t;
    int embed_color = pgm->pp_is_first || pgm->pp_is_last ? shared : dp * cp * tp + rank;
    split(&pgm->embed, GROUP_EMBED, embed_color, p);

    pgm->pp_prev = pgm->pp_is_first ? -1 : p - 1;
    pgm->pp_next = pgm->pp_is_last ? -1 : p + 1;
    if (ep > 1)
        snprintf(pgm->name, sizeof pgm->name, "TP(%d)-CP(%d)-PP(%d)-DP(%d)-EP(%d)-Rank(%d)", t, c,
                 p, d, e, rank);
    else
        snprintf(pgm->name, sizeof pgm->name, "TP(%d)-CP(%d)-PP(%d)-DP(%d)-Rank(%d)", t, c, p, d,
                 rank);
}

void process_group_manager_free(ProcessGroupManager *pgm) {
    group_free(&pgm->embed);
    group_free(&pgm->expert_dp);
    group_free(&pgm->ep);
    group_free(&pgm->cp_dp);
    group_free(&pgm->pp_grad);
    group_free(&pgm->pp);
    group_free(&pgm->cp);
    group_free(&pgm->tp);
    group_free(&pgm->world);
}

// The ranks that share this node (its GPUs, its cores), found by MPI
void node_ranks(int *local_rank, int *ranks_on_node) {
    MPI_Comm node;
    mpiCheck(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    mpiCheck(MPI_Comm_rank(node, local_rank));
    mpiCheck(MPI_Comm_size(node, ranks_on_node));
    mpiCheck(MPI_Comm_free(&node));
}
