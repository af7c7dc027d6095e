#!/usr/bin/env bash
# The pipeline schedules never deadlock and keep the activations they promise: for pp = 2..4 and
# grad_acc = 1..8, AFAB and 1F1B each finish 2 steps within 60 s, and each stage's peak number of
# activation slots in use is grad_acc under AFAB and min(pp - stage, grad_acc) under 1F1B. So
# does interleaved 1F1B for V = 2, 3 virtual stages and grad_acc = pp, 2pp, its peak being the
# most micro-batches in flight in Megatron's order, walked here: (pp - stage - 1) * 2 + (V - 1) * pp
# warm-up forwards (all when grad_acc = pp), then forward-backward pairs; forward i runs chunk
# i / pp % V, backward i chunk V - 1 - i / pp % V; a micro-batch is in flight from its chunk 0's
# forward to its chunk 0's backward. Last, the rule behind interleaving's communication is walked
# for pp up to 8 (see the end).
cd "$(dirname "$0")/.." || exit 1
dir=$(mktemp -d /tmp/picotron-schedules.XXXXXX)
trap 'rm -rf "$dir"' EXIT
failures=0 runs=0

# want_slots PP GRAD_ACC ENGINE V STAGE
want_slots() {
    awk -v pp="$1" -v m="$2" -v engine="$3" -v V="$4" -v s="$5" 'BEGIN {
        if (engine == "afab") { print m; exit }
        if (V == 1) { print (pp - s < m ? pp - s : m); exit }
        total = m * V; warmup = m == pp ? total : (pp - s - 1) * 2 + (V - 1) * pp
        if (warmup > total) warmup = total
        for (i = 0; i < total; i++) {
            if (int(i / pp) % V == 0 && ++n > most) most = n
            if (i >= warmup && V - 1 - int((i - warmup) / pp) % V == 0) n--
        }
        print most }'
}

# run_schedule PP GRAD_ACC ENGINE V: 2 steps of a tiny model, then each stage's peak slots
run_schedule() {
    local pp=$1 ga=$2 engine=$3 vs=$4 layers=$(($1 * $4 > 4 ? $1 * $4 : 4)) stage want got
    cat >"$dir/config.json" <<JSON
{"distributed": {"pp_size": $pp, "pp_engine": "$engine", "pp_virtual_stages": $vs},
 "model": {"name": "picotron-tiny", "hidden_size": 32, "intermediate_size": 64,
           "num_hidden_layers": $layers, "num_attention_heads": 2, "num_key_value_heads": 1},
 "training": {"total_train_steps": 2, "seq_length": 16, "micro_batch_size": 1,
              "gradient_accumulation_steps": $ga},
 "dataset": {"name": "data/pride_and_prejudice.txt"}}
JSON
    runs=$((runs + 1))
    if ! timeout 60 mpirun -np "$pp" ./train --config "$dir/config.json" >"$dir/log" 2>&1; then
        echo "FAIL pp=$pp grad_acc=$ga $engine V=$vs: did not finish (exit $?)"
        failures=$((failures + 1)); return
    fi
    for ((stage = 0; stage < pp; stage++)); do
        want=$(want_slots "$pp" "$ga" "$engine" "$vs" "$stage")
        got=$(grep -o "pipeline stage $stage: peak [0-9]*" "$dir/log" | awk '{print $5}')
        if [ "$got" != "$want" ]; then
            echo "FAIL pp=$pp grad_acc=$ga $engine V=$vs stage $stage: peak slots ${got:-?}, want $want"
            failures=$((failures + 1))
        fi
    done
}

for pp in 2 3 4; do
    for ga in 1 2 3 4 5 6 7 8; do
        for engine in afab 1f1b; do run_schedule $pp $ga $engine 1; done
    done
done
echo "$runs schedule runs (pp 2..4, grad_acc 1..8, afab and 1f1b): $failures failures"
plain=$runs
for pp in 2 3 4; do
    for vs in 2 3; do
        for ga in $pp $((2 * pp)); do run_schedule $pp $ga 1f1b $vs; done
    done
done
echo "$((runs - plain)) interleaved runs (pp 2..4, V 2..3, grad_acc pp and 2pp): $failures failures in all"

# Why interleaved 1F1B cannot mismatch or deadlock (pipeline_interleaved.c's communicate), checked on
# the rule rather than on runs: every rank's exchanges, written down from Megatron's order, match
# their peers' message for message (each direction its own communicator, matched in posting order),
# and they fall into ticks: merge the exchanges that meet, and no rank's order runs in a cycle.
command -v python3 >/dev/null || { echo "python3 not found: the exchange walk needs it"; exit 77; }
python3 - <<'PY' || failures=$((failures + 1))
import collections, sys
def chunk(i, pp, V, forward):
    k = i // pp % V
    return k if forward else V - 1 - k
def micro(i, pp, V):
    return i // (pp * V) * pp + i % pp
def exchanges(r, pp, V, m):  # rank r's exchanges: lists of (communicator, sender, receiver, what)
    total, nxt, prv = m * V, (r + 1) % pp, (r - 1) % pp
    warmup = total if m == pp else min((pp - r - 1) * 2 + (V - 1) * pp, total)
    def fwd_in(i):  # forward i's input: ("F", micro-batch, virtual stage that uses it)
        c = chunk(i, pp, V, True)
        return [] if i >= total or (r == 0 and c == 0) else [("pp", prv, r, ("F", micro(i, pp, V), c * pp + r))]
    def fwd_out(i):
        c = chunk(i, pp, V, True)
        return [] if r == pp - 1 and c == V - 1 else [("pp", r, nxt, ("F", micro(i, pp, V), c * pp + r + 1))]
    def bwd_in(i):  # backward i's output gradient: ("B", micro-batch, virtual stage that sends it)
        c = chunk(i, pp, V, False)
        return [] if i >= total or (r == pp - 1 and c == V - 1) else [("grad", nxt, r, ("B", micro(i, pp, V), c * pp + r + 1))]
    def bwd_out(i):
        c = chunk(i, pp, V, False)
        return [] if r == 0 and c == 0 else [("grad", r, prv, ("B", micro(i, pp, V), c * pp + r))]
    ex = [fwd_in(0)]
    for i in range(warmup):
        ex.append(fwd_out(i) + fwd_in(i + 1) + (bwd_in(0) if i == warmup - 1 and warmup < total else []))
    if warmup == total:
        ex.append(bwd_in(0))
    for i in range(total - warmup):
        ex.append(fwd_out(warmup + i) + bwd_out(i) + fwd_in(warmup + i + 1) + bwd_in(i + 1))
    for i in range(total - warmup, total):
        ex.append(bwd_out(i) + bwd_in(i + 1))
    return ex
def check(pp, V, m):
    ex = [exchanges(r, pp, V, m) for r in range(pp)]
    posted = collections.defaultdict(lambda: ([], []))  # (comm, sender, receiver): sends, receives
    for r in range(pp):
        for j, ops in enumerate(ex[r]):
            for comm, src, dst, what in ops:
                posted[(comm, src, dst)][r == dst].append(((r, j), what))
    parent = {}
    def root(x):
        while parent.get(x, x) != x:
            x = parent[x]
        return x
    for key, (sends, recvs) in posted.items():
        if [w for _, w in sends] != [w for _, w in recvs]:
            return f"messages {key} do not match"
        for (a, _), (b, _) in zip(sends, recvs):
            parent[root(a)] = root(b)
    after = collections.defaultdict(set)
    for r in range(pp):
        for j in range(1, len(ex[r])):
            a, b = root((r, j - 1)), root((r, j))
            if a == b:
                return f"rank {r}'s exchanges {j - 1} and {j} meet each other's peers"
            after[a].add(b)
    nodes = {root((r, j)) for r in range(pp) for j in range(len(ex[r]))}
    into = collections.Counter(b for a in after for b in after[a])
    ready = [n for n in nodes if into[n] == 0]
    while ready:
        for b in after[ready.pop()]:
            into[b] -= 1
            if into[b] == 0:
                ready.append(b)
    return "a cycle" if any(into[n] > 0 for n in nodes) else None
bad = [(pp, V, m, e) for pp in range(2, 9) for V in range(2, 5) for m in range(pp, 6 * pp + 1, pp)
       if (e := check(pp, V, m))]
for b in bad:
    print("FAIL interleaved pp=%d V=%d grad_acc=%d: %s" % b)
print("interleaved exchanges for pp 2..8, V 2..4, grad_acc pp..6pp: matched in order and in ticks,",
      len(bad), "failures")
sys.exit(1 if bad else 0)
PY
[ $failures -eq 0 ]
