#!/usr/bin/env bash
# One mixture-of-experts layer (moe.c) is Mixtral's sparse MoE block: its kernels' and its own
# gradients match finite differences (K = 2 and 1 of E = 4, with and without capacity), it equals
# transformers' MixtralSparseMoeBlock (y, aux loss, every gradient) from the shipped fixture
# tests/fixtures/moe_mixtral.bin (tests/reference/make_moe_fixture.py), and capacity drops what a
# plain-C reference drops. Tolerances: constants at the top of tests/test_moe.c.
cd "$(dirname "$0")/.." || exit 1
bin=${PICOTRON_BUILD:-build}/tests/test_moe
if [ ! -x "$bin" ]; then
    echo "$bin is missing: build it with make $bin"
    exit 1
fi
OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive exec "$bin" tests/fixtures/moe_mixtral.bin
