// The 4D grid of ranks: global_rank = ((dp_rank*pp + pp_rank)*cp + cp_rank)*tp + tp_rank,
// tp fastest (picotron's order: tensor-parallel peers share a node), one group for each axis that
// communicates alone (tp, cp, pp) and one for the replicas of the same weights (cp*dp).
#pragma once
#include "backend/comm.h"

typedef struct {
    int global_rank, world_size;
    int tp_rank, cp_rank, pp_rank, dp_rank;
    int tp_size, cp_size, pp_size, dp_size;
    Group world, tp, cp, pp;
    Group pp_grad;        // pp's ranks: the interleaved pipeline's gradients (pipeline_parallel.c)
    Group cp_dp;          // gradients and the loss are averaged over cp*dp
    Group embed;          // first and last pipeline stage: the tied embedding's two copies
    int pp_prev, pp_next; // ranks in pp (-1 at the ends)
    int pp_is_first, pp_is_last;
    char name[64]; // "TP(x)-CP(x)-PP(x)-DP(x)-Rank(r)"
} ProcessGroupManager;

// world size must equal tp*cp*pp*dp: otherwise one line says so and the job exits 1
void process_group_manager_init(ProcessGroupManager *pgm, int tp, int cp, int pp, int dp);
void process_group_manager_free(ProcessGroupManager *pgm);
