#!/usr/bin/env bash
# Every CPU kernel's backward matches finite differences, backwards accumulate, attention blocks
# and vocab shards merge exactly, init is layout-free and AdamW follows torch (test_kernels.c).
cd "$(dirname "$0")/.." || exit 1
bin=${PICOTRON_BUILD:-build}/tests/test_kernels
if [ ! -x "$bin" ]; then
    echo "$bin is not built: run make ${PICOTRON_BUILD:-build}/tests/test_kernels"
    exit 1
fi
OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} "$bin"
