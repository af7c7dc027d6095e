#!/usr/bin/env python3
"""Writes the reference fixtures that the C Mamba block (mamba.c) and, later, the whole Mamba model
are compared with.

Hugging Face transformers' MambaForCausalLM in fp32 on its slow path (pure PyTorch: the
mamba-ssm and causal-conv1d CUDA packages are absent, and the recurrent loop of
mamba_selective_scan is the one taken on a CPU). A tiny model: hidden 32, state_size 8, expand 2
(intermediate 64), conv_kernel 4, time_step_rank 4, 2 layers, vocabulary 64, untied lm_head.

mamba_block.bin (tests/test_mamba.c, t_46): layer 0's mixer (MambaMixer) alone on a random input x
(B, T, C): its output y, and the gradients of loss = sum(y * R) (R a fixed random tensor, the
upstream gradient) for x and every mixer weight. Records, in order: config (B, T, C, I, S, R, W,
use_conv_bias), x, R, weight.<name> for in_proj.weight (2I, C), conv1d.weight (I, 1, W),
conv1d.bias (I), x_proj.weight (R + 2S, I), dt_proj.weight (I, R), dt_proj.bias (I), A_log (I, S),
D (I), out_proj.weight (C, I), then y, grad.x and grad.<name> for each.

mamba_tiny.bin (for the model integration, issue 30's next part): the whole model on a batch of
tokens: config (C, I, S, R, W, layers, vocab, tied, B, T), config.layer_norm_epsilon, inputs and
targets (B, T) (integers stored as float32), weight.<name> for every parameter as
named_parameters() gives it (backbone.embeddings.weight, backbone.layers.N.norm.weight,
backbone.layers.N.mixer.*, backbone.norm_f.weight, lm_head.weight), logits, loss (mean
cross-entropy) and grad.<name>.

    /tmp/benchvenv/bin/python tests/reference/make_mamba_fixture.py --out tests/fixtures

Values are scaled away from transformers' init so that every gradient is far from zero and a
wrong term shows: A_log = log(1..S) + 0.3 * randn (each state its own decay, each element its own
gradient), D = 1 + 0.3 * randn, conv bias 0.3 * randn, dt bias the inverse softplus of a
log-uniform delta in [0.05, 1] (transformers' default [1e-3, 0.1] leaves delta * A so small that
the state barely moves and the A_log gradients are ~1e-4 of the others), norm weights
1 + 0.1 * randn, out_proj 4 times its init (so y is of order 1, not 0.2).
"""
import math
import os

import torch
import torch.nn.functional as F
from transformers import MambaConfig, MambaForCausalLM

from make_fixture import reference_setup, tensor, write_record

SEED = 1234
B, T = 2, 12
ARCH = dict(hidden_size=32, state_size=8, expand=2, conv_kernel=4, time_step_rank=4,
            num_hidden_layers=2, vocab_size=64, layer_norm_epsilon=1e-5, use_bias=False,
            use_conv_bias=True, time_step_min=0.05, time_step_max=1.0, tie_word_embeddings=False,
            use_mambapy=False)
MIXER = ["in_proj.weight", "conv1d.weight", "conv1d.bias", "x_proj.weight", "dt_proj.weight",
         "dt_proj.bias", "A_log", "D", "out_proj.weight"]


def make_model():
    config = MambaConfig(**ARCH)
    model = MambaForCausalLM(config).float()
    S = ARCH["state_size"]
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("norm_f.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("A_log"):
                A = torch.arange(1, S + 1, dtype=torch.float32).expand_as(p)
                p.copy_(torch.log(A) + 0.3 * torch.randn_like(p))
            elif name.endswith(".D"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif name.endswith("conv1d.bias"):
                p.copy_(0.3 * torch.randn_like(p))
            elif name.endswith("dt_proj.bias"):
                lo, hi = math.log(ARCH["time_step_min"]), math.log(ARCH["time_step_max"])
                dt = torch.exp(torch.rand_like(p) * (hi - lo) + lo)
                p.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus(bias) = dt
            elif name.endswith("out_proj.weight"):
                p.mul_(4.0)
    return config, model


def write_block(model, config, path):
    mixer = model.backbone.layers[0].mixer
    params = dict(mixer.named_parameters())
    assert sorted(params) == sorted(MIXER), list(params)
    C, I, S = config.hidden_size, config.intermediate_size, config.state_size
    R, W = config.time_step_rank, config.conv_kernel
    x = torch.randn(B, T, C, requires_grad=True)
    Rg = torch.randn(B, T, C)
    y = mixer(x)  # no cache: the full-sequence form, mamba_selective_scan's recurrent loop
    (y * Rg).sum().backward()
    with open(path, "wb") as f:
        write_record(f, "config", [B, T, C, I, S, R, W, int(config.use_conv_bias)])
        write_record(f, "x", tensor(x))
        write_record(f, "R", tensor(Rg))
        for name in MIXER:
            write_record(f, "weight." + name, tensor(params[name]))
        write_record(f, "y", tensor(y))
        write_record(f, "grad.x", tensor(x.grad))
        for name in MIXER:
            write_record(f, "grad." + name, tensor(params[name].grad))
    small = min(params[n].grad.abs().max().item() / max(params[n].abs().max().item(), 1e-30)
                for n in MIXER)
    print("%s: max |y| %.3f, smallest max|grad|/max|weight| %.2e, %d bytes" % (
        os.path.basename(path), y.abs().max().item(), small, os.path.getsize(path)))
    model.zero_grad(set_to_none=True)


def write_model(model, config, path):
    params = dict(model.named_parameters())
    seq = torch.randint(0, config.vocab_size, (B, T + 1))
    inputs, targets = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
    logits = model(input_ids=inputs).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
    loss.backward()
    with open(path, "wb") as f:
        cfg = [config.hidden_size, config.intermediate_size, config.state_size,
               config.time_step_rank, config.conv_kernel, config.num_hidden_layers,
               config.vocab_size, int(config.tie_word_embeddings), B, T]
        write_record(f, "config", cfg)
        write_record(f, "config.layer_norm_epsilon", [config.layer_norm_epsilon])
        write_record(f, "inputs", tensor(inputs))
        write_record(f, "targets", tensor(targets))
        for name, p in params.items():
            write_record(f, "weight." + name, tensor(p))
        write_record(f, "logits", tensor(logits))
        write_record(f, "loss", [loss.item()])
        for name, p in params.items():
            write_record(f, "grad." + name, tensor(p.grad))
    print("%s: %d tensors, loss %.6f, %d bytes" % (os.path.basename(path), len(params),
                                                   loss.item(), os.path.getsize(path)))


def main():
    args = reference_setup(__doc__)
    torch.manual_seed(SEED)
    config, model = make_model()
    write_block(model, config, os.path.join(args.out, "mamba_block.bin"))
    write_model(model, config, os.path.join(args.out, "mamba_tiny.bin"))


if __name__ == "__main__":
    main()
