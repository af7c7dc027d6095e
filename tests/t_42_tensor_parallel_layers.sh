#!/usr/bin/env bash
# Claim: every tensor-parallel layer (column-parallel linears sharing an input, async all-reduce
# off and on; row-parallel linear; vocab-parallel embedding; vocab-parallel cross-entropy), run
# over tp = 2 and tp = 4 ranks, equals its unsharded twin forward and backward within 1e-5
# relative (TOL in tests/test_tensor_parallel.c), and the loss touches no more than its
# (N, V/tp) shard of the logits.
set -u
# shellcheck source=tests/mpi_test_lib.sh
source "$(dirname "$0")/mpi_test_lib.sh"
run_mpi_test test_tensor_parallel 2 4
