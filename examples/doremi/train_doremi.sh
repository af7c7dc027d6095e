#!/usr/bin/env bash
# DoReMi on a laptop (Xie et al. 2023; nanotron's examples/doremi), its three stages on three
# domains of known character: the bundled novel, generated sums ("12+34=46", learnable) and
# uniform random bytes (which nothing can learn).
#   1. reference: train on the domains with uniform weights, save;
#   2. proxy: train again beside the reference; DoReMi moves the weights towards the domains on
#      which the proxy lags the reference (./train writes them to domain_weights.json);
#   3. final: train with the learned weights.
# Then both the uniform run (the reference) and the final run are evaluated on held-out text of
# each domain (text neither saw: the novel's last tenth, sums and bytes of another seed).
#
# usage: examples/doremi/train_doremi.sh [WORK_DIR] [STEPS]   (defaults tmp/doremi, 100)
# It prints the learned weights beside the initial ones, and each domain's held-out loss of the
# uniform and of the DoReMi run; the last line is the worst non-random domain's held-out loss of
# both. With -np N for mpirun: NP=N (any layout of create_config's flags: LAYOUT="--dp 2").
set -euo pipefail
cd "$(dirname "$0")/../.."
work=${1:-tmp/doremi}
steps=${2:-100}
np=${NP:-1}
layout=${LAYOUT:-}
mkdir -p "$work/data"
[ -x ./train ] || make -s all

# the domains, each a training file and a held-out file
novel=data/pride_and_prejudice.txt
size=$(wc -c <"$novel")
head -c $((size * 9 / 10)) "$novel" >"$work/data/novel.txt"
tail -c $((size - size * 9 / 10)) "$novel" >"$work/data/novel.heldout.txt"
sums() { awk -v seed="$1" -v n="$2" 'BEGIN { srand(seed); for (i = 0; i < n; i++) {
    a = int(rand() * 100); b = int(rand() * 100); printf "%d+%d=%d\n", a, b, a + b } }'; }
sums 3 40000 >"$work/data/sums.txt"
sums 4 4000 >"$work/data/sums.heldout.txt"
bytes() { python3 -c "import random; random.seed($1); open('$2', 'wb').write(bytes(random.getrandbits(8) for _ in range($3)))"; }
bytes 5 "$work/data/random.txt" 200000
bytes 6 "$work/data/random.heldout.txt" 20000
domains="novel=$work/data/novel.txt,sums=$work/data/sums.txt,random=$work/data/random.txt"
heldout="novel=$work/data/novel.heldout.txt,sums=$work/data/sums.heldout.txt,random=$work/data/random.heldout.txt"

# every run the same model and batch; only the data's weights and the DoReMi keys differ
create() { # create NAME FLAGS...
    local name=$1; shift
    ./create_config --out_dir "$work" --exp_name "$name" --overwrite --model_name picotron-tiny \
        --seq_len 64 --mbs 16 --learning_rate 3e-3 --total_train_steps "$steps" \
        --save_frequency "$steps" $layout "$@" >/dev/null
}
train() { mpirun -np "$np" ./train --config "$work/$1/config.json" >"$work/$1.log" 2>&1 ||
    { echo "train $1 failed: $(tail -n 3 "$work/$1.log")" >&2; exit 1; }; }

create reference --domains "$domains"
train reference
create proxy --domains "$domains" --doremi_reference "$work/reference"
train proxy
create final --domains "$domains" --domain_weights "$work/proxy/domain_weights.json"
train final

# held-out loss: the final weights on held-out rows, through the trainer with a learning rate
# too small to move an fp32 weight (1e-30), each domain's loss from the metrics lines
eval_steps=20
evaluate() { # evaluate RUN: "novel sums random", each the mean over the evaluation's steps
    create "eval_$1" --domains "$heldout" --init_from "$work/$1/$steps" --learning_rate 1e-30 \
        --total_train_steps $eval_steps --save_frequency 0 --metrics_file "$work/eval_$1.jsonl"
    train "eval_$1"
    python3 -c "
import json
rows = [json.loads(l)['domain_loss'] for l in open('$work/eval_$1.jsonl')]
print(' '.join('%.4f' % (sum(r[n] for r in rows if r[n] is not None) /
                         sum(1 for r in rows if r[n] is not None)) for n in ('novel', 'sums', 'random')))"
}
uniform=$(evaluate reference)
doremi=$(evaluate final)
python3 - "$work/proxy/domain_weights.json" "$uniform" "$doremi" <<'PY'
import json, sys
learned = json.load(open(sys.argv[1]))
uniform = dict(zip(("novel", "sums", "random"), map(float, sys.argv[2].split())))
doremi = dict(zip(("novel", "sums", "random"), map(float, sys.argv[3].split())))
print("domain   initial weight  DoReMi's weight  held-out loss: uniform  DoReMi")
for n in ("novel", "sums", "random"):
    print("%-8s %14.4f %16.4f %23.4f %7.4f" % (n, 1 / 3, learned[n], uniform[n], doremi[n]))
worst = lambda losses: max(losses[n] for n in ("novel", "sums"))
print("worst non-random domain, held-out loss: uniform %.4f, DoReMi %.4f" % (worst(uniform), worst(doremi)))
PY
