# The layout-equivalence harness, sourced by the t_5x tests: trains the same small model on the
# same data from the same seed with a given layout, then compares its loss at every step and its
# final weights (whole tensors, from each run's model.safetensors) with the single-rank run.
# Claim: parallelism changes speed, never the numbers. fp32 sums run in a different order, so the
# tolerance is relative: LOSS_TOL on each step's loss, WEIGHT_TOL on ||a-b||/||a|| per tensor.
# Losses agree to ~1e-7; weights to ~5e-6: AdamW divides each gradient by its own running RMS, so
# an element whose gradient is a near-cancelling sum moves by ~lr whichever order the sum ran in.
LOSS_TOL=${LOSS_TOL:-1e-5}
WEIGHT_TOL=${WEIGHT_TOL:-5e-5}
STEPS=${STEPS:-10}
BUILD_DIR=${PICOTRON_BUILD:-build}
# the trainer under test: the GPU emulator's is build-emu/bin/train (tests/t_81_gpu_emulated.sh)
HARNESS_TRAIN=${HARNESS_TRAIN:-./train}
# the launcher and its options before -np, e.g. ranks across the nodes of tests/nodes_lib.sh
HARNESS_MPIRUN=${HARNESS_MPIRUN:-mpirun}
# more keys for the distributed section, e.g. '"use_cpu": false, "backend": "mpi"' (tests/gpu)
HARNESS_DISTRIBUTED_EXTRA=${HARNESS_DISTRIBUTED_EXTRA:-}
# and for the model section, e.g. '"dtype": "float32"' (the GPU build's default is bfloat16)
HARNESS_MODEL_EXTRA=${HARNESS_MODEL_EXTRA:-}
# the dataset section's keys, e.g. a mixture of domains (tests/t_19_domains.sh)
HARNESS_DATASET=${HARNESS_DATASET:-'"name": "data/pride_and_prejudice.txt"'}
# more sections, e.g. ', "doremi": {...}' (tests/t_69_doremi.sh)
HARNESS_SECTIONS=${HARNESS_SECTIONS:-}
HARNESS_DIR=$(mktemp -d /tmp/picotron-layouts.XXXXXX)
trap 'rm -rf "$HARNESS_DIR"' EXIT
harness_failures=0

# run_layout NAME key=value...   keys: tp cp pp dp ga engine tied layers zigzag async sp mbs seq
#                                clip warmup decay (gradient clipping and the lr schedule)
#                                vstages (distributed.pp_virtual_stages, default 1)
#                                save (save_frequency, default STEPS) load (checkpoint.load_path)
#                                experts (model.num_experts, default 0: dense) topk cap aux moe_i
#                                (num_experts_per_tok, moe_capacity_factor, router_aux_loss_coef,
#                                moe_intermediate_size) ep (distributed.ep_size: experts split
#                                over ep of the dp ranks, default 1)
#                                zero (distributed.zero_stage, default 0; zero1=true is stage 1)
#                                trace (logging.trace: a path, its first 2 steps traced)
#                                mamba (true: model_type "mamba", a Mamba block per layer, state
#                                8, conv 4, dt rank 8; false: the Llama)
#                                hidden inter heads kv_heads vocab (the model's sizes, default 128
#                                256 8 4 256) pad (model.make_vocab_size_divisible_by, default 1: none)
#                                data (dataset.name; default: HARNESS_DATASET's keys)
run_layout() {
    local name=$1; shift
    local tp=1 cp=1 pp=1 dp=1 ga=4 engine=1f1b tied=false layers=4 zigzag=false async=false
    local mbs=2 seq=32 clip=0 warmup=0 decay=constant save=$STEPS load="" recompute=false kv
    local zero1=false sp=false vstages=1 experts=0 topk=2 cap=0 aux=0.01 moe_i=64 moe="" ep=1
    local mamba=false zero=0 trace=
    local hidden=128 inter=256 heads=8 kv_heads=4 vocab=256 pad=1 data=""
    for kv in "$@"; do local "${kv%%=*}=${kv#*=}"; done
    local dir=$HARNESS_DIR/$name
    mkdir -p "$dir"
    # a dense model's config stays what it was: the mixture-of-experts keys only when asked
    [ "$experts" -gt 0 ] && moe=", \"num_experts\": $experts, \"num_experts_per_tok\": $topk,
           \"moe_intermediate_size\": $moe_i, \"router_aux_loss_coef\": $aux,
           \"moe_capacity_factor\": $cap"
    # a Mamba (model_mamba.c): MambaConfig's keys; the attention keys stay, unused
    [ "$mamba" = true ] && moe="$moe, \"model_type\": \"mamba\", \"state_size\": 8,
           \"conv_kernel\": 4, \"time_step_rank\": 8"
    [ "$pad" != 1 ] && moe="$moe, \"make_vocab_size_divisible_by\": $pad"
    local dataset=$HARNESS_DATASET logging=""
    [ -n "$trace" ] && logging=", \"trace\": \"$trace\", \"trace_steps\": 2"
    [ -n "$data" ] && dataset="\"name\": \"$data\""
    cat >"$dir/config.json" <<JSON
{"distributed": {"tp_size": $tp, "cp_size": $cp, "pp_size": $pp, "dp_size": $dp,
                 "pp_engine": "$engine", "cp_zigzag": $zigzag, "tp_async": $async,
                 "sequence_parallel": $sp,
                 "bucket_size_mb": 1, "zero1": $zero1, "pp_virtual_stages": $vstages,
                 "ep_size": $ep, "zero_stage": $zero${HARNESS_DISTRIBUTED_EXTRA:+, $HARNESS_DISTRIBUTED_EXTRA}},
 "model": {"name": "picotron-tiny", "hidden_size": $hidden, "intermediate_size": $inter,
           "num_hidden_layers": $layers, "num_attention_heads": $heads,
           "num_key_value_heads": $kv_heads, "vocab_size": $vocab, "tie_word_embeddings": $tied$moe
           ${HARNESS_MODEL_EXTRA:+, $HARNESS_MODEL_EXTRA}},
 "training": {"seed": 7, "learning_rate": 1e-3, "total_train_steps": $STEPS,
              "seq_length": $seq, "micro_batch_size": $mbs, "gradient_accumulation_steps": $ga,
              "grad_clip": $clip, "warmup_steps": $warmup, "lr_decay": "$decay",
              "recompute": $recompute},
 "dataset": {$dataset},
 "checkpoint": {"save_dir": "$dir/ckpt", "save_frequency": $save, "load_path": "$load"},
 "logging": {"metrics_file": "$dir/metrics.jsonl"$logging}$HARNESS_SECTIONS}
JSON
    local np=$((tp * cp * pp * dp))
    # shellcheck disable=SC2086  # HARNESS_MPIRUN is a command and its options
    if ! timeout -k 10 300 $HARNESS_MPIRUN -np $np "$HARNESS_TRAIN" --config "$dir/config.json" >"$dir/log" 2>&1; then
        echo "FAIL $name: train exited non-zero"; tail -n 5 "$dir/log"
        harness_failures=$((harness_failures + 1)); return 1
    fi
    # the JSONL metrics carry the loss to 9 digits; the log line rounds it to 4 decimals
    sed 's/.*"step": *\([0-9]*\).*"loss": *\([-0-9.e+]*\).*/\1 \2/' "$dir/metrics.jsonl" >"$dir/losses"
}

# compare_layout BASE NAME: losses step by step, then the final weights
compare_layout() {
    local base=$HARNESS_DIR/$1 run=$HARNESS_DIR/$2 loss_report weights_report
    if [ ! -s "$run/losses" ] || [ "$(wc -l <"$run/losses")" != "$STEPS" ]; then
        echo "FAIL $2: expected $STEPS loss lines"; harness_failures=$((harness_failures + 1))
        return 1
    fi
    local loss_ok
    loss_report=$(paste "$base/losses" "$run/losses" | awk -v tol="$LOSS_TOL" '
        { d = $2 - $4; if (d < 0) d = -d; r = d / ($2 > 0 ? $2 : 1); if (r > m) m = r }
        END { printf "losses max rel diff %.2e over %d steps", m, NR; exit (m > tol) }')
    loss_ok=$?
    local weights_ok
    weights_report=$("$BUILD_DIR/tests/tool_compare_checkpoints" "$base/ckpt/$STEPS" \
                     "$run/ckpt/$STEPS" "$WEIGHT_TOL")
    weights_ok=$?
    weights_report=$(echo "$weights_report" | tail -n 1)
    if [ $loss_ok -eq 0 ] && [ $weights_ok -eq 0 ]; then
        echo "ok   $2: $loss_report; $weights_report"
    else
        echo "FAIL $2: $loss_report; $weights_report"
        harness_failures=$((harness_failures + 1)); return 1
    fi
}

# check_layout BASE NAME key=value...: run, then compare
check_layout() {
    local base=$1 name=$2; shift 2
    run_layout "$name" "$@" && compare_layout "$base" "$name"
}

# resume_layout BASE SAVED NAME key=value...: run NAME from SAVED's checkpoint at step 5 (saved
# with save=5); its losses of steps 1..5 are SAVED's own, and the whole run is compared with BASE
resume_layout() {
    local base=$1 saved=$2 name=$3; shift 3
    local dir=$HARNESS_DIR/$name
    run_layout "$name" "$@" load="$HARNESS_DIR/$saved/ckpt/5" || return 1
    [ "$(head -n 1 "$dir/losses" | cut -d' ' -f1)" = 6 ] ||
        { echo "FAIL $name: did not resume at step 6"; harness_failures=$((harness_failures + 1)); return 1; }
    { head -n 5 "$HARNESS_DIR/$saved/losses"; cat "$dir/losses"; } >"$dir/losses.all"
    mv "$dir/losses.all" "$dir/losses"
    compare_layout "$base" "$name"
}

# Mixture of experts (t_67, t_68). compare_aux BASE NAME: metrics' aux_loss step by step, within
# LOSS_TOL relative
compare_aux() {
    local report
    report=$(paste <(grep -o '"aux_loss": [-0-9.e+]*' "$HARNESS_DIR/$1/metrics.jsonl") \
        <(grep -o '"aux_loss": [-0-9.e+]*' "$HARNESS_DIR/$2/metrics.jsonl") |
        awk -v tol="$LOSS_TOL" -v steps="$STEPS" '
        { d = $2 - $4; if (d < 0) d = -d; r = d / $2; if (r > m) m = r }
        END { printf "aux losses max rel diff %.2e over %d steps", m, NR
              exit (m > tol || NR != steps) }')
    if [ $? -eq 0 ]; then
        echo "ok   $2: $report"
    else
        echo "FAIL $2: $report"; harness_failures=$((harness_failures + 1))
    fi
}

# check_moe BASE NAME key=value...: check_layout with the caller's $MOE keys, then compare_aux
check_moe() {
    local base=$1 name=$2; shift 2
    check_layout "$base" "$name" $MOE "$@" && compare_aux "$base" "$name"
}

# check_dropped BASE NAME: NAME's capacity dropped pairs, as many as BASE's (the end-of-run report)
dropped() { grep -o 'dropped [0-9.]*% of pairs' "$HARNESS_DIR/$1/log"; }
check_dropped() {
    if [ -n "$(dropped $1)" ] && [ "$(dropped $1)" != "dropped 0.00% of pairs" ] &&
        [ "$(dropped $2)" = "$(dropped $1)" ]; then
        echo "ok   $2: $(dropped $2), as one rank"
    else
        echo "FAIL $2: '$(dropped $2)', one rank '$(dropped $1)' (want the same, > 0)"
        harness_failures=$((harness_failures + 1))
    fi
}

# activations_mb NAME: the activations column (MB) of rank 0's row in the end-of-run memory table
activations_mb() { awk '/^memory per rank, MB/ { table = 1; next } table && $1 == "0" { print $NF }' \
    "$HARNESS_DIR/$1/log"; }

# allocator_share_ok LOG: the end-of-run memory table in LOG accounts for 95-100% of the
# allocator's own peak (prints that line)
allocator_share_ok() {
    local line
    line=$(grep "^the allocator's own peak" "$1")
    echo "${line#the }"
    echo "$line" | awk '{ match($0, /accounts for [0-9.]+% to [0-9.]+%/)
        split(substr($0, RSTART + 13, RLENGTH - 13), p, "% to ")
        exit !(RLENGTH > 0 && p[1] + 0 >= 95 && p[2] + 0 <= 100) }'
}
