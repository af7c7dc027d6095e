#!/usr/bin/env python3
"""The loss the C trainer reports at one step, computed by Hugging Face transformers.

    hf_loss.py MODEL_DIR --dataset data/pride_and_prejudice.txt --seq_length 32 \
        --micro_batch_size 2 --gradient_accumulation_steps 4 --dp_size 1 --step 1

MODEL_DIR is a folder from_pretrained reads (config.json and model.safetensors, or a sharded
index): a Llama, or a Mixtral (the class its config.json's architectures names). The script feeds
the model the very samples the C loader (data.c) gives step K, before that step's update, and
prints `loss <value>` to 9 significant digits: the mean over dp ranks and micro-batches of each
micro-batch's mean token loss, the number train.c writes to the metrics file. For a Mixtral it
also prints `aux_loss <value>`, the metrics file's aux_loss: the mean over dp ranks and
micro-batches of the mean over layers of each layer's load_balancing_loss_func on that
micro-batch's router logits (model_moe.c's definition; transformers' own aux_loss balances all the
layers' logits at once, which is another number). Run it with torch and transformers (fp32, eager
attention and experts, one thread, deterministic).

How data.c picks the samples, repeated here on purpose (a second implementation to check it):
- A .txt file is its UTF-8 bytes, one token each (dataset_open). .tok and .bin are read too.
- Sample g is the window tokens[g*S : g*S + S + 1]: inputs its first S tokens, targets its last S
  (stride S, so a window's last token is the next one's first). There are (n - 1) // S samples in
  an epoch (dataset_num_samples), or num_samples when smaller (training.num_samples).
- Step index s = K - 1 (train.c counts steps from 1, the loader from 0). On dp rank r, row b of
  micro-batch m is this rank's k-th sample, k = (s*G + m)*B + b, and sample g = (k*D + r) mod
  epoch of the global order (dataset_get_batch): sample i goes to rank i mod D, like
  DistributedSampler without shuffling.
- train.c sums each micro-batch's mean loss / G, then averages that over the dp (and cp) ranks.
  Every micro-batch has B*S tokens, so this is also the mean over all tokens of the global batch,
  and any layout with the same B*G*D reads the same samples and reports the same loss.
"""
import argparse
import os
import struct
import sys


def read_tokens(path):
    """The token stream of a dataset file, as data.c's dataset_open reads it."""
    with open(path, "rb") as f:
        raw = f.read()
    if path.endswith(".txt"):
        return list(raw)  # every byte is a token
    if path.endswith(".tok"):
        # magic "PICOTOK\0", uint32 version 1, uint32 width (2 or 4), uint64 count, 64-byte header
        assert raw[:8] == b"PICOTOK\0", "%s: not a .tok file" % path
        version, width, count = struct.unpack_from("<IIQ", raw, 8)
        assert version == 1 and width in (2, 4), "%s: version %d width %d" % (path, version, width)
        return list(struct.unpack_from("<%d%s" % (count, "H" if width == 2 else "I"), raw, 64))
    if path.endswith(".bin"):
        # llm.c shard: 256 int32 (magic 20240520, version 1, count, ...), then uint16 tokens
        magic, version, count = struct.unpack_from("<iii", raw, 0)
        assert magic == 20240520 and version == 1, "%s: not an llm.c shard" % path
        return list(struct.unpack_from("<%dH" % count, raw, 1024))
    raise SystemExit("%s: expected a .txt, .tok or .bin file" % path)


def sample_index(step, micro, b, dp_rank, seq_length, mbs, grad_acc, dp_size, epoch):
    """The global sample row b of micro-batch `micro` on dp rank dp_rank reads at step index
    `step` (from 0): data.c's dataset_get_batch."""
    k = (step * grad_acc + micro) * mbs + b  # this rank's k-th sample
    return (k * dp_size + dp_rank) % epoch   # the global order interleaves the dp ranks


def step_samples(num_tokens, step, seq_length, mbs, grad_acc, dp_size, num_samples=0):
    """[[sample ids of micro-batch m on dp rank r] for m] for r], step counted from 1."""
    epoch = (num_tokens - 1) // seq_length
    if num_samples > 0:
        epoch = min(epoch, num_samples)
    assert epoch >= 1, "fewer tokens than one sample of seq_length + 1"
    return [[[sample_index(step - 1, m, b, r, seq_length, mbs, grad_acc, dp_size, epoch)
              for b in range(mbs)] for m in range(grad_acc)] for r in range(dp_size)]


def layers_aux_loss(config, router_logits):
    """The mean over layers of each layer's load-balancing loss (model_moe.c's aux)."""
    import torch
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    return torch.stack([load_balancing_loss_func((r,), config.num_local_experts,
                                                 config.num_experts_per_tok)
                        for r in router_logits]).mean()


def step_loss(model, tokens, step, seq_length, mbs, grad_acc, dp_size, num_samples=0):
    """The step's loss and aux_loss (None for a dense model) as train.c reports them, and the
    samples it read."""
    import torch
    import torch.nn.functional as F

    moe = getattr(model.config, "num_local_experts", 0) > 0
    samples = step_samples(len(tokens), step, seq_length, mbs, grad_acc, dp_size, num_samples)
    rank_losses, rank_aux = [], []
    for rank in samples:
        loss = aux = 0.0
        for micro in rank:
            windows = torch.tensor([tokens[g * seq_length:g * seq_length + seq_length + 1]
                                    for g in micro])
            inputs, targets = windows[:, :-1], windows[:, 1:]
            with torch.no_grad():
                out = model(input_ids=inputs, output_router_logits=True) if moe else \
                    model(input_ids=inputs)
            logits = out.logits  # (B, S, V)
            micro_loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
            loss += micro_loss.item() / grad_acc
            if moe:
                aux += layers_aux_loss(model.config, out.router_logits).item() / grad_acc
        rank_losses.append(loss)
        rank_aux.append(aux)
    mean_aux = sum(rank_aux) / len(rank_aux) if moe else None
    return sum(rank_losses) / len(rank_losses), mean_aux, samples


def load_model(model_dir):
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    # a Llama or a Mixtral, as config.json says; a Mixtral's experts one by one (eager), in fp32
    kwargs = dict(dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    if AutoConfig.from_pretrained(model_dir).model_type == "mixtral":
        kwargs["experts_implementation"] = "eager"
    model, info = AutoModelForCausalLM.from_pretrained(model_dir, **kwargs)
    # transformers initialises a missing tensor at random and goes on: here that is an error
    for kind, keys in info.items():
        if keys:
            sys.exit("%s: %s %s" % (model_dir, kind, sorted(keys)[:5]))
    model.eval()  # no dropout (Llama has none at attention_dropout 0, but say so)
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("--dataset", default="data/pride_and_prejudice.txt")
    parser.add_argument("--seq_length", type=int, required=True)
    parser.add_argument("--micro_batch_size", type=int, required=True)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--dp_size", type=int, default=1)
    parser.add_argument("--step", type=int, default=1, help="1-based, as train.c logs it")
    parser.add_argument("--num_samples", type=int, default=0, help="training.num_samples")
    parser.add_argument("--show_samples", action="store_true",
                        help="print which samples each dp rank and micro-batch reads")
    args = parser.parse_args()
    if args.step < 1:
        parser.error("--step counts from 1")

    tokens = read_tokens(args.dataset)
    model = load_model(args.model_dir)
    if max(tokens) >= model.config.vocab_size:
        sys.exit("%s: token %d does not fit vocab_size %d"
                 % (args.dataset, max(tokens), model.config.vocab_size))
    loss, aux, samples = step_loss(model, tokens, args.step, args.seq_length,
                                   args.micro_batch_size, args.gradient_accumulation_steps,
                                   args.dp_size, args.num_samples)
    if args.show_samples:
        for r, rank in enumerate(samples):
            for m, micro in enumerate(rank):
                print("dp rank %d micro-batch %d: samples %s" % (r, m, micro))
    print("loss %.9g" % loss)
    if aux is not None:
        print("aux_loss %.9g" % aux)


if __name__ == "__main__":
    main()
