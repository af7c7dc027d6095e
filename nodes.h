// Which ranks share a node, and which process groups cross from one node to another: the slow
// link of a cluster (a network card, where ranks of one node share memory or NVLink). trace.c
// marks the groups in its end-of-run report and counts the bytes that crossed.
#pragma once
#include "backend/comm.h"
#include "process_group_manager.h"

typedef struct {
    int node, num_nodes; // nodes numbered in the order of their lowest world rank
    int local_rank, ranks_on_node;
    // per group kind, of this rank's peers in that group the share on another node: bytes sent
    // times it is what crossed (exact for groups of two, as all of dp2 x tp2 x pp2's; for a larger
    // group an estimate, which the collective's algorithm decides)
    double off_node[GROUP_KINDS];
} NodeLayout;

// collective over the world and each of pgm's groups
void node_layout_init(NodeLayout *nl, ProcessGroupManager *pgm);
