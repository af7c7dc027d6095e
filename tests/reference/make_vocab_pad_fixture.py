#!/usr/bin/env python3
"""Writes the Hugging Face checkpoint with GPT-2's vocabulary that vocabulary padding must import.

    python3 tests/reference/make_vocab_pad_fixture.py --out tests/fixtures

(with torch and transformers). One folder, hf_gpt2_vocab/: a tiny Llama (hidden 8, one layer,
tied embeddings) whose vocabulary is GPT-2's 50257 tokens, which no tp > 1 divides, saved by
transformers in fp32 (1.6 MB), and expected_loss.json: what hf_loss.py gives for step 1 of a run on
tests/fixtures/tokenizer/gpt2/hard_cases.tok (GPT-2 ids) with seq_length 32 and 8 sequences a step.
tests/t_33_vocab_padding.sh loads it into a padded model (model.make_vocab_size_divisible_by)
under tp 2. The model and the loss are make_hf_fixture.py's, at these sizes.
"""
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ beside the scripts
import hf_loss  # noqa: E402
import make_hf_fixture  # noqa: E402

ARCH = dict(make_hf_fixture.ARCH, hidden_size=8, intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=2, vocab_size=50257,
            tie_word_embeddings=True)
BATCH = dict(make_hf_fixture.BATCH, dataset="tests/fixtures/tokenizer/gpt2/hard_cases.tok")


def main():
    args = make_hf_fixture.fixture_setup(__doc__, BATCH["dataset"])
    folder = os.path.join(args.out, "hf_gpt2_vocab")
    shutil.rmtree(folder, ignore_errors=True)
    make_hf_fixture.make_model(ARCH).save_pretrained(folder)
    make_hf_fixture.write_expected_loss(folder, hf_loss.read_tokens(args.dataset), BATCH)


if __name__ == "__main__":
    main()
