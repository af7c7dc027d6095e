#!/usr/bin/env python3
"""Writes the reference fixture that tests/test_moe.c compares the C mixture-of-experts layer with.

Hugging Face transformers' MixtralSparseMoeBlock in fp32 (E = 4 experts, K = 2 per token) on one
batch of random tokens: its output y, the load-balancing loss aux of this one layer (transformers'
load_balancing_loss_func on the block's router logits), and the gradients of
loss = sum(y * R) + COEF * aux (R a fixed random tensor) for the input, the router and every
expert; then the gradients of aux alone (input and router), which isolate its path.

    /tmp/benchvenv/bin/python tests/reference/make_moe_fixture.py --out tests/fixtures

File format: tests/reference/make_fixture.py's records (tests/fixture.h reads them). Records, in
order: config (B, T, C, I, E, K), coef, x (B, T, C), R (B, T, C), weight.gate.weight (E, C),
weight.experts.gate_up_proj (E, 2I, C), weight.experts.down_proj (E, C, I), router_logits (B*T, E),
topk_ids (B*T, K) (integers stored as float32), y (B, T, C), aux, grad.x, grad.gate.weight,
grad.experts.gate_up_proj, grad.experts.down_proj, grad_aux.x, grad_aux.gate.weight.
transformers (5.x) fuses each expert's gate and up projections: gate_up_proj[e] is (2I, C), rows
[0, I) Mixtral's w1 (gate), rows [I, 2I) w3 (up); down_proj[e] is w2, (C, I).
"""
import os

import torch
from transformers import MixtralConfig
from transformers.models.mixtral.modeling_mixtral import (MixtralSparseMoeBlock,
                                                          load_balancing_loss_func)

from make_fixture import reference_setup, tensor, write_record

SEED = 1234
B, T, C, I, E, K = 2, 12, 16, 32, 4, 2
COEF = 0.02  # Mixtral's router_aux_loss_coef
# the C test's finite differences and top-k need each token's K-th and (K+1)-th logits apart
MIN_GAP = 1e-2


def main():
    args = reference_setup(__doc__)
    torch.manual_seed(SEED)

    config = MixtralConfig(hidden_size=C, intermediate_size=I, num_local_experts=E,
                           num_experts_per_tok=K, router_jitter_noise=0.0, hidden_act="silu",
                           experts_implementation="eager")
    block = MixtralSparseMoeBlock(config).float()
    with torch.no_grad():  # the block's own parameters are torch.empty: give them values
        block.gate.weight.normal_(0.0, 0.5)
        block.experts.gate_up_proj.normal_(0.0, 0.3)
        block.experts.down_proj.normal_(0.0, 0.3)
    params = {"gate.weight": block.gate.weight, "experts.gate_up_proj": block.experts.gate_up_proj,
              "experts.down_proj": block.experts.down_proj}
    assert tuple(block.experts.gate_up_proj.shape) == (E, 2 * I, C)
    assert tuple(block.experts.down_proj.shape) == (E, C, I)
    x = torch.randn(B, T, C, requires_grad=True)
    R = torch.randn(B, T, C)

    captured = []  # the router's (logits, weights, ids), as transformers' OutputRecorder takes it
    block.gate.register_forward_hook(lambda module, inputs, output: captured.append(output))
    y = block(x)
    router_logits, _, topk_ids = captured[0]
    aux = load_balancing_loss_func((router_logits,), E, K)
    gap = router_logits.sort(dim=-1, descending=True).values
    gap = (gap[:, K - 1] - gap[:, K]).min().item()
    assert gap > MIN_GAP, "a token's top-k is near a tie (gap %.2e): choose another seed" % gap

    grads_aux = torch.autograd.grad(aux, [x, block.gate.weight], retain_graph=True)
    loss = (y * R).sum() + COEF * aux
    loss.backward()

    path = os.path.join(args.out, "moe_mixtral.bin")
    with open(path, "wb") as f:
        write_record(f, "config", [B, T, C, I, E, K])
        write_record(f, "coef", [COEF])
        write_record(f, "x", tensor(x))
        write_record(f, "R", tensor(R))
        for name, p in params.items():
            write_record(f, "weight." + name, tensor(p))
        write_record(f, "router_logits", tensor(router_logits))
        write_record(f, "topk_ids", tensor(topk_ids))
        write_record(f, "y", tensor(y))
        write_record(f, "aux", [aux.item()])
        write_record(f, "grad.x", tensor(x.grad))
        for name, p in params.items():
            write_record(f, "grad." + name, tensor(p.grad))
        write_record(f, "grad_aux.x", tensor(grads_aux[0]))
        write_record(f, "grad_aux.gate.weight", tensor(grads_aux[1]))
    counts = torch.bincount(topk_ids.reshape(-1), minlength=E).tolist()
    print("%s: aux %.6f, pairs per expert %s, smallest top-k gap %.3f, %d bytes" % (
        os.path.basename(path), aux.item(), counts, gap, os.path.getsize(path)))


if __name__ == "__main__":
    main()
