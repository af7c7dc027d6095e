#!/usr/bin/env python3
"""Writes the Hugging Face checkpoints the C trainer must import, and the loss it must report.

    python3 tests/reference/make_hf_fixture.py --out tests/fixtures

(with torch and transformers). Two folders, the same tiny Llama saved by transformers itself:
  hf_tiny/               config.json, model.safetensors (fp32, one file)
  hf_tiny_sharded_bf16/  config.json, model.safetensors.index.json, model-0000x-of-0000y.safetensors
                         (the weights rounded to bfloat16, in several shards)
and in each, expected_loss.json: what hf_loss.py gives for step 1 of a run on
data/pride_and_prejudice.txt with seq_length 32 and 8 sequences a step (the bf16 folder's loss is
that of its weights cast to fp32, as a loader that reads bf16 into an fp32 model sees them).
"""
import argparse
import json
import os
import shutil
import sys

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ beside the scripts
import hf_loss  # noqa: E402

SEED = 1234
ARCH = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=256, rms_norm_eps=1e-5,
            rope_theta=10000.0, tie_word_embeddings=False)
BATCH = dict(dataset="data/pride_and_prejudice.txt", seq_length=32, micro_batch_size=2,
             gradient_accumulation_steps=4, dp_size=1, step=1)
SHARD_SIZE = "80KB"  # the bf16 weights are ~210 KB: several shards


def make_model(arch=ARCH):
    torch.manual_seed(SEED)
    # initializer_range 0.2 (not 0.02) so that gradients are far from zero and a wrong one shows
    config = LlamaConfig(**arch, initializer_range=0.2, attention_bias=False, mlp_bias=False,
                         hidden_act="silu")
    model = LlamaForCausalLM(config).float()
    with torch.no_grad():
        # norms away from 1, so a norm weight that is not loaded shows in the loss
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    return model


def write_expected_loss(folder, tokens, batch=BATCH):
    model = hf_loss.load_model(folder)
    loss, aux, _ = hf_loss.step_loss(model, tokens, batch["step"], batch["seq_length"],
                                     batch["micro_batch_size"],
                                     batch["gradient_accumulation_steps"], batch["dp_size"])
    record = dict(batch, loss=float("%.9g" % loss))
    if aux is not None:  # a mixture of experts: the metrics file's aux_loss too
        record["aux_loss"] = float("%.9g" % aux)
    record.update(transformers=transformers.__version__, torch=torch.__version__.split("+")[0])
    with open(os.path.join(folder, "expected_loss.json"), "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    print("%s: loss %.9g" % (folder, loss))


def fixture_setup(doc, dataset=BATCH["dataset"]):
    """--out and --dataset, for a script with this docstring; torch on one thread, deterministic"""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--out", default="tests/fixtures")
    parser.add_argument("--dataset", default=dataset,
                        help="where the corpus is (expected_loss.json names data/...)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    return args


def main():
    args = fixture_setup(__doc__)

    model = make_model()
    fp32_dir = os.path.join(args.out, "hf_tiny")
    bf16_dir = os.path.join(args.out, "hf_tiny_sharded_bf16")
    for folder in (fp32_dir, bf16_dir):
        shutil.rmtree(folder, ignore_errors=True)  # no stale shards from an earlier run
    model.save_pretrained(fp32_dir)
    model.to(torch.bfloat16).save_pretrained(bf16_dir, max_shard_size=SHARD_SIZE)
    shards = [f for f in os.listdir(bf16_dir) if f.endswith(".safetensors")]
    assert len(shards) >= 2, "%s: %d shard(s), make SHARD_SIZE smaller" % (bf16_dir, len(shards))

    tokens = hf_loss.read_tokens(args.dataset)
    for folder in (fp32_dir, bf16_dir):
        write_expected_loss(folder, tokens)


if __name__ == "__main__":
    main()
