#!/usr/bin/env bash
# Activation recomputation (training.recompute) changes memory and time, never the numbers:
#  1. on one rank, and with tp2, pp2 1F1B, pp4 AFAB, cp2, dp2 x tp2 x pp2 (8 ranks) and tied
#     embeddings over pp2, it trains to the very same bits as the same layout without it (losses
#     and final weights byte-identical: the recomputed forward runs the same kernels, tp
#     all-reduces and cp ring on the same inputs), and so matches the plain one-rank run within
#     the harness's tolerances;
#  2. the activations column of the end-of-run memory table equals, within MEMORY_TOL, what the
#     shapes say is allocated, with and without recomputation (a larger model, where activations
#     dominate); it prints both, their ratio, and the step time of both (the time it costs).
cd "$(dirname "$0")/.." && source tests/layout_harness.sh
MEMORY_TOL=0.05

# same_bits A B: the two runs' losses and final weights are byte-identical
same_bits() {
    cmp -s "$HARNESS_DIR/$1/losses" "$HARNESS_DIR/$2/losses" &&
        cmp -s "$HARNESS_DIR/$1/ckpt/$STEPS/model.safetensors" \
            "$HARNESS_DIR/$2/ckpt/$STEPS/model.safetensors"
}
# check_recompute BASE NAME key=value...: the layout with recomputation gives the very bits of the
# same layout without it (run unless it has run), and matches the one-rank BASE within the
# harness's tolerances
check_recompute() {
    local base=$1 name=$2; shift 2
    [ -s "$HARNESS_DIR/$name/losses" ] || run_layout "$name" "$@" || return 1
    run_layout "${name}_recompute" "$@" recompute=true || return 1
    if same_bits "$name" "${name}_recompute"; then
        echo "ok   ${name}_recompute: losses and final weights bit-identical to $name's"
    else
        echo "FAIL ${name}_recompute: differs from $name without recomputation"
        paste "$HARNESS_DIR/$name/losses" "$HARNESS_DIR/${name}_recompute/losses" | head -n 3
        harness_failures=$((harness_failures + 1))
    fi
    compare_layout "$base" "${name}_recompute"
}
run_layout base
check_recompute base base
check_recompute base tp2 tp=2
check_recompute base pp2_1f1b pp=2 engine=1f1b
check_recompute base pp4_afab pp=4 engine=afab
check_recompute base cp2 cp=2
check_recompute base dp2_tp2_pp2 dp=2 tp=2 pp=2 ga=2
run_layout base_tied tied=true
check_recompute base_tied pp2_tied pp=2 tied=true

# Memory: one rank, one micro-batch in flight (a single slot). Floats, N = B*T tokens, with the
# sizes of picotron-tiny's heads and vocabulary at hidden 256 (H heads, KV kv heads, D = C/H):
#   a layer's saved tensors  S = N*(3C + 2H*D + 2KV*D + 3I + H + 2)
#                               (ln1, ln2, mid; q, att; k, v; gate, up, act; lse; rstd1, rstd2)
#   the slot                 (L+1)*N*C [resid] + N*C + N [final norm] + N*V [dlogits]
#                            + 2N [tokens, targets] + L*S (none with recomputation)
#   shared by every slot     S + N*C [the backward's gradients and dresid] + N*V [logits]
#                            + 4N + 1 [loss buffers] + 1 [scalar]
#                            + S + N*C (with recomputation: the shared layer and its output)
B=4 T=128 C=256 I=512 L=8 HEADS=8 KV=4 V=256
memory_run() { # NAME [--recompute]
    local name=$1; shift
    ./create_config --out_dir "$HARNESS_DIR" --exp_name "$name" --hidden_size $C \
        --intermediate_size $I --num_hidden_layers $L --num_attention_heads $HEADS \
        --num_key_value_heads $KV --vocab_size $V --seq_len $T --mbs $B --grad_acc_steps 1 \
        --total_train_steps 10 --save_frequency 0 --dataset data/pride_and_prejudice.txt \
        --metrics_file "$HARNESS_DIR/$name/metrics.jsonl" "$@" >/dev/null || return 1
    timeout 300 mpirun -np 1 ./train --config "$HARNESS_DIR/$name/config.json" \
        >"$HARNESS_DIR/$name/log" 2>&1
}
# the mean of steps 2.. of the metrics file's "seconds", then the fastest of them (the mean
# follows whatever else the machine runs; the fastest step less so)
step_seconds() { sed 's/.*"step": *\([0-9]*\).*"seconds": *\([0-9.e+-]*\).*/\1 \2/' \
    "$HARNESS_DIR/$1/metrics.jsonl" | awk '$1 > 1 { s += $2; n++; if (!m || $2 < m) m = $2 }
                                           END { printf "%.4f %.4f", s / n, m }'; }
expected_mb() { # RECOMPUTE (0 or 1)
    awk -v r="$1" -v B=$B -v T=$T -v C=$C -v I=$I -v L=$L -v H=$HEADS -v KV=$KV -v V=$V 'BEGIN {
        N = B * T; D = C / H
        S = N * (3 * C + 2 * H * D + 2 * KV * D + 3 * I + H + 2)
        slot = (L + 1) * N * C + N * C + N + N * V + 2 * N + (r ? 0 : L * S)
        shared = S + N * C + N * V + 4 * N + 1 + 1 + (r ? S + N * C : 0)
        printf "%.3f", 4 * (slot + shared) / 1e6 }'
}
for mode in 0 1; do
    name=memory_$mode
    if ! memory_run $name $([ $mode = 1 ] && echo --recompute); then
        echo "FAIL $name: train exited non-zero"; tail -n 5 "$HARNESS_DIR/$name/log"
        harness_failures=$((harness_failures + 1)); continue
    fi
    measured[$mode]=$(activations_mb $name)
    expected[$mode]=$(expected_mb $mode)
    seconds[$mode]=$(step_seconds $name)
    if awk -v m="${measured[$mode]}" -v e="${expected[$mode]}" -v tol=$MEMORY_TOL \
        'BEGIN { d = m - e; if (d < 0) d = -d; exit !(m != "" && d <= tol * e) }'; then
        echo "ok   $name: activations ${measured[$mode]} MB, the shapes say ${expected[$mode]} MB"
    else
        echo "FAIL $name: activations '${measured[$mode]}' MB, the shapes say ${expected[$mode]} MB"
        harness_failures=$((harness_failures + 1))
    fi
done
if [ -n "${measured[0]}" ] && [ -n "${measured[1]}" ]; then
    echo "${measured[*]} ${seconds[*]}" | awk -v C=$C -v L=$L -v T=$T -v B=$B '{
        printf "     hidden %d, %d layers, seq %d, mbs %d, one rank: activations %.3f MB", C, L, T, B, $1
        printf " -> %.3f MB with recompute (x%.3f)\n", $2, $2 / $1
        printf "     step time, mean of steps 2-10: %.4f s -> %.4f s (x%.2f);", $3, $5, $5 / $3
        printf " fastest step %.4f s -> %.4f s (x%.2f)\n", $4, $6, $6 / $4 }'
fi
[ $harness_failures -eq 0 ]
