#!/usr/bin/env python3
"""Writes the reference fixtures that tests/test_model_vs_torch.c compares the C model against.

For a tiny Llama (GQA: 4 query heads, 2 kv heads) with tied and with untied embeddings, Hugging
Face transformers' LlamaForCausalLM in fp32 gives: the weights, the logits and mean cross-entropy
of one batch, the gradient of every parameter, and the losses of 5 AdamW steps on that batch with
the weights after them.

    python3 tests/reference/make_fixture.py --out tests/fixtures

File format (tests/fixture.h reads it), little-endian, a sequence of records:
    [uint32 name_len][name bytes][uint32 ndim][int64 dims[ndim]][float32 data (prod dims)]
Records, in order: config (hidden, intermediate, layers, heads, kv_heads, vocab, max_pos, tied,
B, T), config.rms_norm_eps, config.rope_theta, inputs (B, T), targets (B, T) (integers stored as
float32), weight.<hf name>..., logits (B, T, V), loss, grad.<hf name>..., adam.losses (5),
adam.lr_wd (lr, weight decay), final.<hf name>...
Hugging Face names as named_parameters() gives them: lm_head.weight only when untied.
"""
import argparse
import os
import struct

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

SEED = 1234
B, T = 2, 16
ADAM_STEPS = 5
LR, BETAS, EPS, WEIGHT_DECAY = 1e-2, (0.9, 0.999), 1e-8, 0.01
ARCH = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=64, rms_norm_eps=1e-5, rope_theta=10000.0,
            max_position_embeddings=64)


def write_record(f, name, array):
    array = np.ascontiguousarray(np.asarray(array, dtype="<f4"))
    raw = name.encode()
    f.write(struct.pack("<I", len(raw)))
    f.write(raw)
    f.write(struct.pack("<I", array.ndim))
    f.write(struct.pack("<%dq" % array.ndim, *array.shape))
    f.write(array.tobytes())


def tensor(t):
    return t.detach().cpu().numpy()


def make_case(tied, path):
    torch.manual_seed(SEED)
    # initializer_range 0.2 (not 0.02) so that gradients are far from zero and a wrong one shows
    config = LlamaConfig(**ARCH, tie_word_embeddings=tied, attention_bias=False, mlp_bias=False,
                         hidden_act="silu", initializer_range=0.2, attn_implementation="eager")
    model = LlamaForCausalLM(config).float()
    with torch.no_grad():
        # norms away from 1 so their gradients matter and a missing weight multiply shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    params = dict(model.named_parameters())   # ties removed: lm_head.weight only when untied
    assert ("lm_head.weight" in params) == (not tied)

    # each row is a window of 17 random tokens: inputs the first 16, targets the last 16
    seq = torch.randint(0, ARCH["vocab_size"], (B, T + 1))
    inputs, targets = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

    def loss_and_logits():
        logits = model(input_ids=inputs).logits                     # (B, T, V)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        return loss, logits

    with open(path, "wb") as f:
        cfg = [ARCH["hidden_size"], ARCH["intermediate_size"], ARCH["num_hidden_layers"],
               ARCH["num_attention_heads"], ARCH["num_key_value_heads"], ARCH["vocab_size"],
               ARCH["max_position_embeddings"], int(tied), B, T]
        write_record(f, "config", cfg)
        write_record(f, "config.rms_norm_eps", [ARCH["rms_norm_eps"]])
        write_record(f, "config.rope_theta", [ARCH["rope_theta"]])
        write_record(f, "inputs", tensor(inputs))
        write_record(f, "targets", tensor(targets))
        for name, p in params.items():
            write_record(f, "weight." + name, tensor(p))

        model.zero_grad(set_to_none=True)
        loss, logits = loss_and_logits()
        loss.backward()
        write_record(f, "logits", tensor(logits))
        write_record(f, "loss", [loss.item()])
        for name, p in params.items():
            write_record(f, "grad." + name, tensor(p.grad))

        # a fresh optimizer from the same weights; losses[s] is the loss before step s
        opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS,
                                weight_decay=WEIGHT_DECAY)
        losses = []
        for _ in range(ADAM_STEPS):
            opt.zero_grad(set_to_none=True)
            loss, _ = loss_and_logits()
            losses.append(loss.item())
            loss.backward()
            opt.step()
        write_record(f, "adam.losses", losses)
        write_record(f, "adam.lr_wd", [LR, WEIGHT_DECAY])
        for name, p in params.items():
            write_record(f, "final." + name, tensor(p))

    n = sum(p.numel() for p in params.values())
    print("%-28s %d tensors, %d parameters, loss %.6f, adam losses %s, %d bytes" % (
        os.path.basename(path), len(params), n, losses[0],
        " ".join("%.6f" % x for x in losses), os.path.getsize(path)))


def reference_setup(doc):
    """The reference scripts' command line (--out FOLDER), created; torch made reproducible"""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures", help="output folder")
    args = ap.parse_args()
    # one thread and deterministic kernels: the same bytes on every run of one torch version
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.makedirs(args.out, exist_ok=True)
    print("torch %s, transformers %s" % (torch.__version__, transformers.__version__))
    return args


def main():
    args = reference_setup(__doc__)
    for case, tied in (("tied", True), ("untied", False)):
        make_case(tied, os.path.join(args.out, "llama_tiny_%s.bin" % case))


if __name__ == "__main__":
    main()
