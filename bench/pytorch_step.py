#!/usr/bin/env python3
"""Training throughput of the same Llama in PyTorch eager on the CPU, the baseline that
bench/bench_vs_pytorch.sh sets ./train against: LlamaForCausalLM in fp32, mean cross-entropy,
AdamW (picotron's lr 3e-4, weight decay 0.01), no torch.compile.

    python3 bench/pytorch_step.py --threads 2 --hidden_size 128 ...

Prints one line per timed step and last "pytorch tokens/s: <float>" (tokens of the timed steps
over their wall time, after the warm-up steps).
"""
import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden_size", type=int, default=128)
    ap.add_argument("--intermediate_size", type=int, default=384)
    ap.add_argument("--num_hidden_layers", type=int, default=4)
    ap.add_argument("--num_attention_heads", type=int, default=4)
    ap.add_argument("--num_key_value_heads", type=int, default=2)
    ap.add_argument("--vocab_size", type=int, default=256)
    ap.add_argument("--seq_len", type=int, default=128)
    ap.add_argument("--mbs", type=int, default=4)
    ap.add_argument("--untied", action="store_true", help="untied lm_head (default: tied)")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"],
                    help="transformers attention implementation (sdpa is its default)")
    ap.add_argument("--data", default="data/austen.txt", help="bytes of this file are the tokens")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(42)
    config = LlamaConfig(hidden_size=args.hidden_size, intermediate_size=args.intermediate_size,
                         num_hidden_layers=args.num_hidden_layers,
                         num_attention_heads=args.num_attention_heads,
                         num_key_value_heads=args.num_key_value_heads,
                         vocab_size=args.vocab_size, max_position_embeddings=args.seq_len,
                         rms_norm_eps=1e-5, rope_theta=10000.0,
                         tie_word_embeddings=not args.untied, attn_implementation=args.attn)
    model = LlamaForCausalLM(config).float().train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.01)
    n_params = sum(p.numel() for p in model.parameters())
    tokens = np.fromfile(args.data, dtype=np.uint8).astype(np.int64) % args.vocab_size
    B, S = args.mbs, args.seq_len
    print("pytorch %s, %d threads, %s attention, %.2fM parameters, %d tokens/step" % (
        torch.__version__, args.threads, args.attn, n_params / 1e6, B * S))

    def step(i):
        # consecutive windows of the corpus, as ./train reads them
        start = (i * B * (S + 1)) % (len(tokens) - B * (S + 1))
        seq = torch.from_numpy(tokens[start:start + B * (S + 1)].reshape(B, S + 1))
        inputs, targets = seq[:, :-1], seq[:, 1:]
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=inputs).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        loss.backward()
        opt.step()
        return loss.item()

    for i in range(args.warmup):
        step(i)
    start = time.perf_counter()
    for i in range(args.warmup, args.warmup + args.steps):
        t0 = time.perf_counter()
        loss = step(i)
        dt = time.perf_counter() - t0
        print("step %d | loss %.4f | %.3f s | tokens/s %.1f" % (i + 1, loss, dt, B * S / dt))
    elapsed = time.perf_counter() - start
    print("pytorch tokens/s: %.1f" % (args.steps * B * S / elapsed))


if __name__ == "__main__":
    main()
