#!/usr/bin/env bash
# The C tokenizer against Hugging Face tokenizers, same file, same tokenizer, same run, one thread
# each (pinned to one core where taskset is): MB/s of encoding the whole file in one call, and one
# call a line (Hugging Face: encode_batch with TOKENIZERS_PARALLELISM=false), and the ratio C / HF
# of each. It prints the versions and checks that both sides count the same ids. A benchmark, not
# a test. Python with tokenizers: $BENCH_VENV, else /tmp/benchvenv, else python3.
#   bash bench/bench_tokenizer.sh [FILE [TOKENIZER]]   (default data/austen.txt, GPT-2's)
cd "$(dirname "$0")/.." || exit 1
file=${1:-data/austen.txt}
tokenizer=${2:-data/gpt2/tokenizer.json}
bin=${PICOTRON_BUILD:-build}/bench/bench_tokenizer
[ -x "$bin" ] || { echo "$bin is missing: run make" >&2; exit 1; }
python=python3
for venv in "${BENCH_VENV:-}" /tmp/benchvenv; do
    [ -n "$venv" ] && [ -x "$venv/bin/python" ] && { python=$venv/bin/python; break; }
done
"$python" -c 'import tokenizers' 2>/dev/null ||
    { echo "$python has no tokenizers package (pip install tokenizers, or set BENCH_VENV)" >&2; exit 1; }
pin=()
command -v taskset >/dev/null && pin=(taskset -c 0)

c=$("${pin[@]}" "$bin" "$tokenizer" "$file") || exit 1
read -r _ c_whole c_whole_ids <<<"$(grep '^whole' <<<"$c")"
read -r _ c_lines c_lines_ids <<<"$(grep '^lines' <<<"$c")"
hf=$(TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1 "${pin[@]}" "$python" - "$tokenizer" "$file" <<'PY'
import sys, time, tokenizers
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
data = open(sys.argv[2], "rb").read()
text = data.decode("utf-8")
lines = text.splitlines(keepends=True)
print("version", tokenizers.__version__, sys.version.split()[0])
for name, run in (("whole", lambda: [tok.encode(text, add_special_tokens=False)]),
                  ("lines", lambda: tok.encode_batch(lines, add_special_tokens=False))):
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        out = run()
        best = min(best, time.perf_counter() - start)
    print(name, "%.2f" % (len(data) / 1e6 / best), sum(len(e.ids) for e in out))
PY
) || { echo "the Hugging Face run failed" >&2; exit 1; }
read -r _ hf_version py_version <<<"$(grep '^version' <<<"$hf")"
read -r _ hf_whole hf_whole_ids <<<"$(grep '^whole' <<<"$hf")"
read -r _ hf_lines hf_lines_ids <<<"$(grep '^lines' <<<"$hf")"

echo "$file ($(wc -c <"$file") bytes), $tokenizer; tokenizers $hf_version (Python $py_version)" \
     "against tokenizer.c, one thread each, best of 3"
for mode in whole lines; do
    c=c_$mode hf=hf_$mode cid=c_${mode}_ids hid=hf_${mode}_ids
    label=$([ $mode = whole ] && echo "whole file, one call" || echo "one call a line    ")
    same=$([ "${!cid}" = "${!hid}" ] && echo "same ids count" || echo "IDS DIFFER: ${!cid} vs ${!hid}")
    awk -v l="$label" -v c="${!c}" -v h="${!hf}" -v s="$same" -v n="${!cid}" 'BEGIN {
        printf "%s: C %7.2f MB/s, Hugging Face %7.2f MB/s, ratio C/HF %5.2f (%d ids, %s)\n",
               l, c, h, c / h, n, s }'
done
