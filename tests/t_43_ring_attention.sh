#!/usr/bin/env bash
# Claim: ring attention over cp = 2 and cp = 4 ranks, contiguous and zig-zag, gives the out, lse,
# dq, dk and dv of plain causal attention over the whole sequence within 1e-5 relative (TOL in
# tests/test_ring_attention.c); without zig-zag rank r computes r + 1 blocks, with zig-zag every
# rank computes the same number.
set -u
# shellcheck source=tests/mpi_test_lib.sh
source "$(dirname "$0")/mpi_test_lib.sh"
run_mpi_test test_ring_attention 2 4
