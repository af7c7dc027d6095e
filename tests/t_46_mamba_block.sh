#!/usr/bin/env bash
# One Mamba mixer (mamba.c) is transformers' MambaMixer: its two sequence kernels' gradients (the
# causal conv1d with SiLU, the selective scan) match finite differences, the scan's backward gives
# the same bits on 1 and 3 threads, the mixer equals transformers' slow path (y and every gradient)
# from the shipped fixture tests/fixtures/mamba_block.bin (tests/reference/make_mamba_fixture.py),
# and a deliberately wrong mixer (A_log moved, D dropped) fails that comparison. Then the mixers
# composed with the Llama's kernels (embedding, RMSNorm, residual, lm_head, cross-entropy) are
# transformers' MambaForCausalLM: logits, loss and every gradient (tests/fixtures/mamba_tiny.bin).
# Tolerances: constants at the top of tests/test_mamba.c and tests/test_mamba_model.c.
cd "$(dirname "$0")/.." || exit 1
build=${PICOTRON_BUILD:-build}
for bin in "$build/tests/test_mamba" "$build/tests/test_mamba_model"; do
    if [ ! -x "$bin" ]; then
        echo "$bin is missing: build it with make $bin"
        exit 1
    fi
done
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
"$build/tests/test_mamba" tests/fixtures/mamba_block.bin || exit 1
exec "$build/tests/test_mamba_model" tests/fixtures/mamba_tiny.bin
