#!/usr/bin/env bash
# Sequence parallelism (distributed.sequence_parallel) splits the residual stream over the tokens
# on the tp ranks; it changes memory and communication, never the numbers:
#  1. tp2, tp4, tp2 x cp2, tp2 x pp2 (async column-parallel; and interleaved, V=2), tied
#     embeddings over tp2 x pp2, and dp2 x tp2 x pp2 with ZeRO-1 and recomputation on, all with
#     it, train to the one-rank losses and final weights within the harness's tolerances;
#  2. the activations column of the end-of-run memory table equals, within MEMORY_TOL, what the
#     shapes say each tp rank allocates, with and without it (tp2, a larger model), and that table
#     is 95-100% of the allocator's own peak; the residual stream's part (resid, mid, the norms'
#     outputs and 1/rms) falls by exactly tp; the pipeline's message halves (the tp x pp run's
#     pp bytes, checked against the same run without it).
cd "$(dirname "$0")/.." && source tests/layout_harness.sh
MEMORY_TOL=0.05

run_layout base
for layout in "tp2 tp=2" "tp4 tp=4" "tp2_cp2 tp=2 cp=2" "tp2_pp2 tp=2 pp=2 async=true" \
    "tp2_pp2_interleaved tp=2 pp=2 vstages=2" \
    "dp2_tp2_pp2_zero1_recompute dp=2 tp=2 pp=2 ga=2 zero1=true recompute=true"; do
    set -- $layout
    name=${1}_sp; shift
    run_layout "$name" "$@" sp=true && compare_layout base "$name"
done
run_layout base_tied tied=true
run_layout tp2_pp2_tied_sp tp=2 pp=2 tied=true sp=true && compare_layout base_tied tp2_pp2_tied_sp

# the pipeline's messages are (N/tp, C) with it: half of the same layout's without it
run_layout tp2_pp2 tp=2 pp=2 async=true
pp_bytes() { awk '/^bytes sent per step/ { t = 1; next } t && $1 == "0" { print $(NF-1); exit }' \
    "$HARNESS_DIR/$1/log"; }
if [ "$(pp_bytes tp2_pp2)" = "$(($(pp_bytes tp2_pp2_sp) * 2))" ]; then
    echo "ok   pp bytes per step: $(pp_bytes tp2_pp2) without, $(pp_bytes tp2_pp2_sp) with it"
else
    echo "FAIL pp bytes per step: '$(pp_bytes tp2_pp2)' without, '$(pp_bytes tp2_pp2_sp)' with it"
    harness_failures=$((harness_failures + 1))
fi

# Memory of one tp rank of two, one micro-batch in flight. Floats, N = B*T tokens, Ns = N/tp rows
# of the residual stream with sequence parallelism (N without), and this rank's shares of the
# heads h = H/tp, kv = KV/tp, features i = I/tp and vocabulary v = V/tp, D = C/H:
#   a layer's saved tensors  S(rows) = rows*(3C + 2) [ln1, ln2, mid; rstd1, rstd2]
#                                    + N*(2h*D + 2kv*D + 3i + h) [q, att; k, v; gate, up, act; lse]
#   the slot                 (L+1)*Ns*C [resid] + Ns*C + Ns [final norm] + N*v [dlogits]
#                            + 2N [tokens, targets] + L*S(Ns)
#   shared by every slot     S(N) [the backward's gradients: all rows] + Ns*C [dresid]
#                            + N*v [logits] + 4N + 1 [loss buffers] + 1 [scalar]
#                            + N*C (with it: the gathered rows)
B=4 T=128 C=256 I=512 L=8 HEADS=8 KV=4 V=256 TP=2
memory_run() { # NAME [--sequence_parallel]
    local name=$1; shift
    ./create_config --out_dir "$HARNESS_DIR" --exp_name "$name" --hidden_size $C \
        --intermediate_size $I --num_hidden_layers $L --num_attention_heads $HEADS \
        --num_key_value_heads $KV --vocab_size $V --seq_len $T --mbs $B --grad_acc_steps 1 \
        --tp $TP --total_train_steps 3 --save_frequency 0 --dataset data/pride_and_prejudice.txt \
        --metrics_file "$HARNESS_DIR/$name/metrics.jsonl" "$@" >/dev/null || return 1
    timeout 300 mpirun -np $TP ./train --config "$HARNESS_DIR/$name/config.json" \
        >"$HARNESS_DIR/$name/log" 2>&1
}
# expected_mb SP PART: PART "all" (the table's activations) or "residual" (resid, mid, ln1, ln2,
# rstd1, rstd2, lnf, rstdf of the slot)
expected_mb() {
    awk -v sp="$1" -v part="$2" -v B=$B -v T=$T -v C=$C -v I=$I -v L=$L -v H=$HEADS -v KV=$KV \
        -v V=$V -v tp=$TP 'BEGIN {
        N = B * T; Ns = sp ? N / tp : N; D = C / H; h = H / tp; kv = KV / tp; i = I / tp; v = V / tp
        other = N * (2 * h * D + 2 * kv * D + 3 * i + h)
        residual = (L + 1) * Ns * C + L * Ns * (3 * C + 2) + Ns * C + Ns
        slot = residual + N * v + 2 * N + L * other
        shared = N * (3 * C + 2) + other + Ns * C + N * v + 4 * N + 1 + 1 + (sp ? N * C : 0)
        printf "%.3f", 4 * (part == "residual" ? residual : slot + shared) / 1e6 }'
}
for mode in 0 1; do
    name=memory_sp$mode
    if ! memory_run $name $([ $mode = 1 ] && echo --sequence_parallel); then
        echo "FAIL $name: train exited non-zero"; tail -n 5 "$HARNESS_DIR/$name/log"
        harness_failures=$((harness_failures + 1)); continue
    fi
    measured[$mode]=$(activations_mb $name)
    expected[$mode]=$(expected_mb $mode all)
    residual[$mode]=$(expected_mb $mode residual)
    allocator=$(grep "^the allocator's own peak" "$HARNESS_DIR/$name/log")
    if awk -v m="${measured[$mode]}" -v e="${expected[$mode]}" -v tol=$MEMORY_TOL \
        'BEGIN { d = m - e; if (d < 0) d = -d; exit !(m != "" && d <= tol * e) }' &&
        echo "$allocator" | awk '{ match($0, /accounts for [0-9.]+% to [0-9.]+%/)
            split(substr($0, RSTART + 13, RLENGTH - 13), p, "% to ")
            exit !(RLENGTH > 0 && p[1] + 0 >= 95 && p[2] + 0 <= 100) }'; then
        echo "ok   $name: activations ${measured[$mode]} MB, the shapes say ${expected[$mode]} MB;" \
            "${allocator#the }"
    else
        echo "FAIL $name: activations '${measured[$mode]}' MB, the shapes say" \
            "${expected[$mode]} MB; $allocator"
        harness_failures=$((harness_failures + 1))
    fi
done
if [ -n "${measured[0]}" ] && [ -n "${measured[1]}" ]; then
    echo "${measured[*]} ${residual[*]}" | awk -v C=$C -v L=$L -v T=$T -v B=$B -v tp=$TP '{
        printf "     hidden %d, %d layers, seq %d, mbs %d, tp %d: activations per rank", C, L, T, B, tp
        printf " %.3f MB -> %.3f MB with sequence parallelism (x%.3f);\n", $1, $2, $2 / $1
        printf "     of which the residual stream and the norms %.3f MB -> %.3f MB (x%.3f)\n",
            $3, $4, $4 / $3 }'
fi
[ $harness_failures -eq 0 ]
