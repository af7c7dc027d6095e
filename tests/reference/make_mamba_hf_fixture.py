#!/usr/bin/env python3
"""Writes the Mamba checkpoint the C trainer must import, and the loss it must report.

    /tmp/benchvenv/bin/python tests/reference/make_mamba_hf_fixture.py --out tests/fixtures

(with torch and transformers). One folder, a tiny MambaForCausalLM saved by transformers itself:
  hf_mamba_tiny/  config.json, model.safetensors (fp32, one file, tied embeddings as MambaConfig's
                  default and state-spaces/mamba-130m-hf), and expected_loss.json: what hf_loss.py
                  gives for step 1 of make_hf_fixture.py's samples (data/pride_and_prejudice.txt,
                  seq_length 32, micro-batches of 2, 4 of them a step), through transformers' slow
                  (pure PyTorch) path.
Every tensor is drawn away from its structured init (norms, A_log, D, the conv's bias), so a
tensor that is not loaded, or loaded into the wrong place, shows in the loss.
"""
import os
import shutil
import sys

import torch
from transformers import MambaConfig, MambaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ beside the scripts
import hf_loss  # noqa: E402
import make_hf_fixture  # noqa: E402

SEED = 30
ARCH = dict(hidden_size=64, num_hidden_layers=2, vocab_size=256, state_size=8, expand=2,
            conv_kernel=4, time_step_rank=8, use_bias=False, use_conv_bias=True,
            layer_norm_epsilon=1e-5, tie_word_embeddings=True)


def make_model():
    torch.manual_seed(SEED)
    # initializer_range 0.2 (not 0.1) so that a wrong weight shows in the loss
    config = MambaConfig(**ARCH, initializer_range=0.2, use_mambapy=False)
    model = MambaForCausalLM(config).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("norm_f.weight") or \
                    name.endswith(".D"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("A_log") or name.endswith("conv1d.bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def main():
    args = make_hf_fixture.fixture_setup(__doc__)
    folder = os.path.join(args.out, "hf_mamba_tiny")
    shutil.rmtree(folder, ignore_errors=True)
    make_model().save_pretrained(folder)
    make_hf_fixture.write_expected_loss(folder, hf_loss.read_tokens(args.dataset))


if __name__ == "__main__":
    main()
