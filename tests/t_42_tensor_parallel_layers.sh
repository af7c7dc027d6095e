#!/usr/bin/env bash
# Claim: every tensor-parallel layer (column-parallel linears sharing an input, async all-reduce
# off and on; row-parallel linear; vocab-parallel embedding; vocab-parallel cross-entropy), run
# over tp = 2 and tp = 4 ranks, equals its unsharded twin forward and backward within 1e-5
# relative (TOL in tests/test_tensor_parallel.c), and the loss touches no more than its
# (N, V/tp) shard of the logits.
set -u
BUILD=${PICOTRON_BUILD:-build}
BIN=$BUILD/tests/test_tensor_parallel
command -v mpirun >/dev/null || { echo "mpirun not found: install mpich (make deps)"; exit 77; }
[ -x "$BIN" ] || { echo "$BIN is missing: build it with make $BIN"; exit 1; }
export OMP_NUM_THREADS=1   # up to 4 ranks share the cores
status=0
for np in 2 4; do
    out=$(timeout 60 mpirun -np $np "$BIN" 2>&1)
    rc=$?
    echo "$out" | sed "s/^/np=$np: /"
    [ $rc -eq 0 ] || { echo "np=$np: test_tensor_parallel exited $rc"; status=1; }
done
exit $status
