#!/usr/bin/env bash
# Claim: ring attention over cp = 2 and cp = 4 ranks, contiguous and zig-zag, gives the out, lse,
# dq, dk and dv of plain causal attention over the whole sequence within 1e-5 relative (TOL in
# tests/test_ring_attention.c); without zig-zag rank r computes r + 1 blocks, with zig-zag every
# rank computes the same number.
set -u
BUILD=${PICOTRON_BUILD:-build}
BIN=$BUILD/tests/test_ring_attention
command -v mpirun >/dev/null || { echo "mpirun not found: install mpich (make deps)"; exit 77; }
[ -x "$BIN" ] || { echo "$BIN is missing: build it with make $BIN"; exit 1; }
export OMP_NUM_THREADS=1   # up to 4 ranks share the cores
status=0
for np in 2 4; do
    out=$(timeout 60 mpirun -np $np "$BIN" 2>&1)
    rc=$?
    echo "$out" | sed "s/^/np=$np: /"
    [ $rc -eq 0 ] || { echo "np=$np: test_ring_attention exited $rc"; status=1; }
done
exit $status
