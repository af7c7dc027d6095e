// Which ranks share a node (nodes.h). MPI knows: MPI_COMM_TYPE_SHARED splits the world into the
// ranks that can share memory, one communicator per node (Hydra's and Slurm's host lists decide
// what a node is). Each group then gathers its members' node numbers.
#include "nodes.h"
#include <stdlib.h>
#include "utils.h"

static void all_gather_ints(int *out, int mine, MPI_Comm comm) {
    Handle h = {.count = 1};
    mpiCheck(MPI_Iallgather(&mine, 1, MPI_INT, out, 1, MPI_INT, comm, &h.req[0]));
    comm_wait(&h);
}

// of g's other members, the share on another node than this rank's
static double off_node_share(Group *g, int node) {
    if (g->size < 2) return 0.0;
    int *nodes = xmalloc(g->size * sizeof(int)), off = 0;
    all_gather_ints(nodes, node, g->comm);
    for (int i = 0; i < g->size; i++) off += nodes[i] != node;
    free(nodes);
    return (double)off / (g->size - 1);
}

void node_layout_init(NodeLayout *nl, ProcessGroupManager *pgm) {
    MPI_Comm node;
    int world = pgm->world_size, leader;
    mpiCheck(MPI_Comm_split_type(pgm->world.comm, MPI_COMM_TYPE_SHARED, pgm->global_rank,
                                 MPI_INFO_NULL, &node));
    mpiCheck(MPI_Comm_rank(node, &nl->local_rank));
    mpiCheck(MPI_Comm_size(node, &nl->ranks_on_node));
    // a node's leader: its lowest world rank
    Handle h = {.count = 1};
    leader = pgm->global_rank;
    mpiCheck(MPI_Iallreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, node, &h.req[0]));
    comm_wait(&h);
    mpiCheck(MPI_Comm_free(&node));
    int *leaders = xmalloc(world * sizeof(int));
    all_gather_ints(leaders, leader, pgm->world.comm);
    nl->node = 0, nl->num_nodes = 0;
    for (int r = 0; r < world; r++) {
        if (leaders[r] != r) continue; // each node once, at its leader
        nl->num_nodes++;
        nl->node += r < leader;
    }
    free(leaders);
    for (int g = 0; g < GROUP_KINDS; g++) nl->off_node[g] = 0.0;
    Group *groups[] = {&pgm->world, &pgm->tp,    &pgm->cp, &pgm->pp,
                       &pgm->cp_dp, &pgm->embed, &pgm->ep};
    for (int i = 0; i < 7; i++) nl->off_node[groups[i]->kind] = off_node_share(groups[i], nl->node);
}
