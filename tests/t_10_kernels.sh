#!/usr/bin/env bash
# Every CPU kernel's backward matches finite differences, backwards accumulate, attention blocks
# and vocab shards merge exactly, init is layout-free and AdamW follows torch (test_kernels.c).
cd "$(dirname "$0")/.." || exit 1
bin=${PICOTRON_BUILD:-build}/tests/test_kernels
if [ ! -x "$bin" ]; then
    echo "$bin is not built: run make ${PICOTRON_BUILD:-build}/tests/test_kernels"
    exit 1
fi
# One thread: the finite differences call each kernel thousands of times, and OpenMP threads
# spinning at barriers on a shared, oversubscribed CPU turn seconds into minutes. The test itself
# reruns attention on 3 threads and checks the result is the same, bit for bit.
OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive "$bin"
