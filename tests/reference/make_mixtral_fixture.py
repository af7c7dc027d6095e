#!/usr/bin/env python3
"""Writes the Mixtral checkpoint the C trainer must import, and the losses it must report.

    /tmp/benchvenv/bin/python tests/reference/make_mixtral_fixture.py --out tests/fixtures

(with torch and transformers). One folder, a tiny MixtralForCausalLM saved by transformers itself:
  hf_mixtral_tiny/  config.json, model.safetensors (fp32, one file), and expected_loss.json: what
                    hf_loss.py gives for step 1 of make_hf_fixture.py's samples (data/pride_and_
                    prejudice.txt, seq_length 32, 8 sequences a step), one sequence per
                    micro-batch: the loss (cross-entropy, the metrics file's "loss") and aux_loss
                    (the metrics file's "aux_loss", the mean over micro-batches and layers of each
                    layer's load-balancing loss). The aux is a function of each micro-batch's
                    tokens, so only micro-batches of one sequence keep it the same in every layout
                    (dp x grad_acc = 8); the cross-entropy is the same for any.
save_pretrained writes transformers' fused experts (mlp.experts.gate_up_proj, down_proj in memory)
under Mixtral's checkpoint names, one tensor per expert: model.layers.L.block_sparse_moe.gate.weight
(E, C) and block_sparse_moe.experts.E.w1 (gate_proj) / w3 (up_proj) (I, C), w2 (down_proj) (C, I).
The seed is the first whose routing of step 1's and step 2's samples stays MIN_GAP from a tie.
"""
import os
import shutil
import sys

import torch
from transformers import MixtralConfig, MixtralForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ beside the scripts
import hf_loss  # noqa: E402
import make_hf_fixture  # noqa: E402

BATCH = dict(make_hf_fixture.BATCH, micro_batch_size=1, gradient_accumulation_steps=8)

FIRST_SEED = 1234
ARCH = dict(hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=256, rms_norm_eps=1e-5,
            rope_theta=10000.0, tie_word_embeddings=False, num_local_experts=4,
            num_experts_per_tok=2, router_aux_loss_coef=0.02)
# each token's K-th and (K+1)-th router logits must stay apart, or fp32 rounding on one side may
# route a token elsewhere than the other side does (make_moe_model_fixture.py's bound)
MIN_GAP = 5e-3


def make_model(seed):
    torch.manual_seed(seed)
    # initializer_range 0.2 (not 0.02) so that a wrong weight shows in the loss
    config = MixtralConfig(**ARCH, initializer_range=0.2, hidden_act="silu", sliding_window=None,
                           router_jitter_noise=0.0, attn_implementation="eager",
                           experts_implementation="eager")
    model = MixtralForCausalLM(config).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # away from 1: a norm that is not loaded shows
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif "mlp" in name:  # the experts and the router, drawn here whatever the init did
                p.normal_(0.0, 0.2)
    return model.eval()


def smallest_gap(model, tokens):
    """The smallest gap between a token's K-th and (K+1)-th router logit, over every layer and
    every sample of steps 1 and 2"""
    K, S, gap = ARCH["num_experts_per_tok"], BATCH["seq_length"], float("inf")
    for step in (1, 2):
        samples = hf_loss.step_samples(len(tokens), step, S, BATCH["micro_batch_size"],
                                       BATCH["gradient_accumulation_steps"], BATCH["dp_size"])
        for micro in samples[0]:
            inputs = torch.tensor([tokens[g * S:g * S + S] for g in micro])
            with torch.no_grad():
                out = model(input_ids=inputs, output_router_logits=True)
            for r in out.router_logits:
                top = r.sort(dim=-1, descending=True).values
                gap = min(gap, (top[:, K - 1] - top[:, K]).min().item())
    return gap


def main():
    args = make_hf_fixture.fixture_setup(__doc__)
    tokens = hf_loss.read_tokens(args.dataset)

    seed = FIRST_SEED
    while True:
        model = make_model(seed)
        gap = smallest_gap(model, tokens)
        if gap > MIN_GAP:
            break
        seed += 1
    folder = os.path.join(args.out, "hf_mixtral_tiny")
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder)
    print("seed %d, smallest top-k gap %.4f" % (seed, gap))
    make_hf_fixture.write_expected_loss(folder, tokens, BATCH)


if __name__ == "__main__":
    main()
