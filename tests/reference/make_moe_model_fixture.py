#!/usr/bin/env python3
"""Writes the reference fixture that tests/test_model_vs_torch.c compares the mixture-of-experts
model (model_moe.c) against.

A tiny Mixtral (GQA: 4 query heads, 2 kv heads; E = 4 experts, K = 2 per token; untied
embeddings), Hugging Face transformers' MixtralForCausalLM in fp32, with the training loss the C
model uses: loss = CE + COEF * (mean over layers of load_balancing_loss_func on that layer's
router logits alone). transformers' own aux_loss concatenates the layers' logits into one
balance over all of them; here each layer is balanced on its own, as Switch Transformer's loss is
per layer. The fixture holds the weights, the logits, the CE, the aux, the gradient of every
parameter, and 5 AdamW steps (their CE losses and the weights after them).

    /tmp/benchvenv/bin/python tests/reference/make_moe_model_fixture.py --out tests/fixtures

File format and records: tests/reference/make_fixture.py's, plus config.moe (E, K, I of an
expert, COEF) after config.rope_theta and aux after loss. Tensors carry the C model's names,
those transformers' save_pretrained writes for a Mixtral: transformers fuses the experts in
memory (mlp.experts.gate_up_proj (E, 2I, C): rows [0, I) gate, [I, 2I) up;
mlp.experts.down_proj (E, C, I)); the C model holds each expert's
block_sparse_moe.experts.{e}.w1 (gate) / w3 (up) / w2 (down).weight, written here one by one.
The router is mlp.gate.weight (E, C) in memory, block_sparse_moe.gate.weight in the C model.
"""
import os

import torch
import torch.nn.functional as F
from transformers import MixtralConfig, MixtralForCausalLM
from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

from make_fixture import (ADAM_STEPS, BETAS, EPS, LR, WEIGHT_DECAY, reference_setup, tensor,
                          write_record)

SEED = 2  # the first seed whose routing stays MIN_GAP from a tie through the 5 steps
B, T = 2, 16
E, K, COEF = 4, 2, 0.05
ARCH = dict(hidden_size=32, intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=64, rms_norm_eps=1e-5, rope_theta=10000.0,
            max_position_embeddings=64)
# each token's K-th and (K+1)-th router logits must stay apart, or fp32 rounding on one side may
# route a token elsewhere than the other side does
MIN_GAP = 5e-3


def c_params(params, I):
    """(C model name, tensor) pairs: the fused experts cut into per-expert tensors"""
    out = []
    for name, p in params.items():
        name = name.replace(".mlp.", ".block_sparse_moe.")
        if name.endswith("experts.gate_up_proj"):
            prefix = name[:-len("gate_up_proj")]
            for e in range(E):
                out.append(("%s%d.w1.weight" % (prefix, e), p[e, :I]))
                out.append(("%s%d.w3.weight" % (prefix, e), p[e, I:]))
        elif name.endswith("experts.down_proj"):
            prefix = name[:-len("down_proj")]
            for e in range(E):
                out.append(("%s%d.w2.weight" % (prefix, e), p[e]))
        else:
            out.append((name, p))
    return out


def main():
    args = reference_setup(__doc__)
    torch.manual_seed(SEED)
    I = ARCH["intermediate_size"]
    config = MixtralConfig(**ARCH, tie_word_embeddings=False, num_local_experts=E,
                           num_experts_per_tok=K, router_jitter_noise=0.0, hidden_act="silu",
                           output_router_logits=True, router_aux_loss_coef=COEF,
                           sliding_window=None, initializer_range=0.2,
                           attn_implementation="eager", experts_implementation="eager")
    model = MixtralForCausalLM(config).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # away from 1: a missing weight multiply shows
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif "mlp" in name:  # the experts and the router, drawn here whatever the init did
                p.normal_(0.0, 0.2)
    params = dict(model.named_parameters())
    assert tuple(params["model.layers.0.mlp.experts.gate_up_proj"].shape) == (E, 2 * I, 32)

    seq = torch.randint(0, ARCH["vocab_size"], (B, T + 1))
    inputs, targets = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

    def losses():
        out = model(input_ids=inputs, output_router_logits=True)
        ce = F.cross_entropy(out.logits.reshape(-1, out.logits.size(-1)), targets.reshape(-1))
        per_layer = [load_balancing_loss_func((r,), E, K) for r in out.router_logits]
        aux = torch.stack(per_layer).mean()
        gap = min((r.sort(dim=-1, descending=True).values[:, K - 1] -
                   r.sort(dim=-1, descending=True).values[:, K]).min().item()
                  for r in out.router_logits)
        assert gap > MIN_GAP, "a token's top-k is near a tie (gap %.2e): another seed" % gap
        return ce, aux, out.logits, gap

    path = os.path.join(args.out, "mixtral_tiny.bin")
    with open(path, "wb") as f:
        cfg = [ARCH["hidden_size"], ARCH["intermediate_size"], ARCH["num_hidden_layers"],
               ARCH["num_attention_heads"], ARCH["num_key_value_heads"], ARCH["vocab_size"],
               ARCH["max_position_embeddings"], 0, B, T]
        write_record(f, "config", cfg)
        write_record(f, "config.rms_norm_eps", [ARCH["rms_norm_eps"]])
        write_record(f, "config.rope_theta", [ARCH["rope_theta"]])
        write_record(f, "config.moe", [E, K, I, COEF])
        write_record(f, "inputs", tensor(inputs))
        write_record(f, "targets", tensor(targets))
        for name, p in c_params(params, I):
            write_record(f, "weight." + name, tensor(p))

        model.zero_grad(set_to_none=True)
        ce, aux, logits, gap = losses()
        (ce + COEF * aux).backward()
        write_record(f, "logits", tensor(logits))
        write_record(f, "loss", [ce.item()])
        write_record(f, "aux", [aux.item()])
        grads = {name: p.grad for name, p in params.items()}
        for name, g in c_params(grads, I):
            write_record(f, "grad." + name, tensor(g))

        # a fresh optimizer from the same weights; losses[s] is the CE before step s
        opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS,
                                weight_decay=WEIGHT_DECAY)
        adam = []
        for _ in range(ADAM_STEPS):
            opt.zero_grad(set_to_none=True)
            ce_s, aux_s, _, gap_s = losses()
            adam.append(ce_s.item())
            gap = min(gap, gap_s)
            (ce_s + COEF * aux_s).backward()
            opt.step()
        write_record(f, "adam.losses", adam)
        write_record(f, "adam.lr_wd", [LR, WEIGHT_DECAY])
        for name, p in c_params(params, I):
            write_record(f, "final." + name, tensor(p))
    print("%s: CE %.6f, aux %.6f, adam CE %s, smallest top-k gap %.3f, %d bytes" % (
        os.path.basename(path), ce.item(), aux.item(), " ".join("%.6f" % x for x in adam), gap,
        os.path.getsize(path)))


if __name__ == "__main__":
    main()
