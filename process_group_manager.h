// The 4D grid of ranks: global_rank = ((dp_rank*pp + pp_rank)*cp + cp_rank)*tp + tp_rank,
// tp fastest (picotron's order: tensor-parallel peers share a node), one group for each axis that
// communicates alone (tp, cp, pp) and one for the replicas of the same weights (cp*dp).
// Expert parallelism (ep, which divides dp) adds no ranks: it splits the experts over groups of ep
// consecutive dp ranks, dp_rank = (dp_rank / ep) * ep + ep_rank, which stay data-parallel for
// everything else (DeepSpeed-MoE's and Megatron's expert parallelism).
#pragma once
#include "backend/comm.h"

typedef struct {
    int global_rank, world_size;
    int tp_rank, cp_rank, pp_rank, dp_rank;
    int tp_size, cp_size, pp_size, dp_size;
    int ep_rank, ep_size; // ep_rank = dp_rank % ep_size: which experts this rank holds
    Group world, tp, cp, pp;
    Group pp_grad;        // pp's ranks: the interleaved pipeline's gradients (pipeline_parallel.c)
    Group cp_dp;          // gradients and the loss are averaged over cp*dp
    Group ep;             // ep ranks: each sends the others the tokens routed to their experts
    Group expert_dp;      // cp*dp/ep ranks: the replicas of this rank's experts
    Group embed;          // first and last pipeline stage: the tied embedding's two copies
    int pp_prev, pp_next; // ranks in pp (-1 at the ends)
    int pp_is_first, pp_is_last;
    char name[96]; // "TP(x)-CP(x)-PP(x)-DP(x)-Rank(r)", with -EP(x) before Rank under ep
} ProcessGroupManager;

// world size must equal tp*cp*pp*dp, and ep divide dp: otherwise one line says so and the job
// exits 1
void process_group_manager_init(ProcessGroupManager *pgm, int tp, int cp, int pp, int dp, int ep);
void process_group_manager_free(ProcessGroupManager *pgm);
// this rank's place among the ranks of its node, and their number: the place picks its device,
// the number shares the node's peak for MFU
void node_ranks(int *local_rank, int *ranks_on_node);
