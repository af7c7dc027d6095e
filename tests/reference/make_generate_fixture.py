#!/usr/bin/env python3
"""Writes the token ids ./generate must produce: transformers' greedy generate on the shipped model.

    python3 tests/reference/make_generate_fixture.py --out tests/fixtures/generate

(with torch and transformers). The model is tests/fixtures/hf_tiny (a random Llama of vocabulary
256, fp32, 4 heads over 2 kv heads, untied), so a prompt's bytes are its ids. For each prompt,
LlamaForCausalLM.generate(do_sample=False) gives NEW_TOKENS ids, written to expected.json with the
smallest gap between the best and the second-best logit over the steps: a gap far above float
rounding is what lets the C code, which sums in another order, pick the same token every time.
"""
import argparse
import json
import os

import torch
import transformers
from transformers import GenerationConfig, LlamaForCausalLM

MODEL = "tests/fixtures/hf_tiny"
NEW_TOKENS = 40
# plain ASCII, a longer one that fills attention's 64-query tiles twice over, and UTF-8 (bytes
# above 127); each chosen with a top-2 gap above MIN_GAP at every step
PROMPTS = [
    "It is a truth universally acknowledged",
    "Mr. Bennet was so odd a mixture of quick parts, sarcastic humour, reserve, and caprice, that "
    "the experience of three and twenty years had been insufficient",
    "Über café — naïve",
]
MIN_GAP = 1e-3  # below this a prompt is too close to a tie to test float code against


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="tests/fixtures/generate")
    parser.add_argument("--model", default=MODEL)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    model = LlamaForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    # no end-of-sequence stop: hf_tiny's eos id (2) is an ordinary byte here, and generate merges
    # the model's own generation_config into the one it is given
    model.generation_config.eos_token_id = None
    config = GenerationConfig(do_sample=False, max_new_tokens=NEW_TOKENS, pad_token_id=0,
                              output_scores=True, return_dict_in_generate=True)
    cases = []
    for prompt in PROMPTS:
        ids = list(prompt.encode("utf-8"))
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), generation_config=config)
        new = out.sequences[0, len(ids):].tolist()
        assert len(new) == NEW_TOKENS, "generate stopped after %d tokens" % len(new)
        gap = min(float((s[0].topk(2).values[0] - s[0].topk(2).values[1])) for s in out.scores)
        assert gap > MIN_GAP, "%r: top-2 logit gap %.2e, too close to a tie" % (prompt, gap)
        # the ids as ./generate --print_ids prints them: one line, separated by spaces
        cases.append(dict(prompt=prompt, new_ids=" ".join(map(str, new)),
                          min_top2_gap=float("%.4g" % gap)))
        print("%r: %d prompt ids, %d new, smallest top-2 gap %.3g" % (prompt, len(ids), len(new),
                                                                       gap))
    os.makedirs(args.out, exist_ok=True)
    record = dict(model=args.model, new_tokens=NEW_TOKENS, cases=cases,
                  transformers=transformers.__version__, torch=torch.__version__.split("+")[0])
    with open(os.path.join(args.out, "expected.json"), "w") as f:
        json.dump(record, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
