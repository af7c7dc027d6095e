#!/usr/bin/env bash
# The single-rank C model equals Hugging Face transformers' LlamaForCausalLM (fp32, GQA, tied and
# untied embeddings): logits, loss, every gradient, and 5 AdamW steps' losses and final weights;
# with 4 experts (top-2) per layer it equals MixtralForCausalLM the same way, plus the mean over
# layers of the load-balancing loss, whose gradient joins the CE's.
# References: tests/fixtures/llama_tiny_{tied,untied}.bin (tests/reference/make_fixture.py),
# tests/fixtures/mixtral_tiny.bin (tests/reference/make_moe_model_fixture.py);
# tolerances are constants at the top of tests/test_model_vs_torch.c.
cd "$(dirname "$0")/.." || exit 1
bin=${PICOTRON_BUILD:-build}/tests/test_model_vs_torch
if [ ! -x "$bin" ]; then
    echo "$bin is missing: build it with make $bin"
    exit 1
fi
exec "$bin" tests/fixtures/llama_tiny_tied.bin tests/fixtures/llama_tiny_untied.bin \
    tests/fixtures/mixtral_tiny.bin
