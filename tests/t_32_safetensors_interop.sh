#!/usr/bin/env bash
# Checkpoints are Hugging Face's format, both ways:
#  1. transformers' own files, loaded by checkpoint.init_from under 1 rank, dp2 x tp2 x pp2 and cp2:
#     tests/fixtures/hf_tiny (fp32, one file) and hf_tiny_sharded_bf16 (bf16, three shards and an
#     index). The first loss equals transformers' loss on the same batch, in expected_loss.json
#     (tests/reference/make_hf_fixture.py), within TOL relative.
#  2. a checkpoint written under dp2 x tp2 x pp2, read by an independent reader of the format (json
#     and struct, tests/reference/safetensors_read.py): exactly the tensors, names and shapes, of a
#     Hugging Face Llama of its config.json; every checksum recomputed agrees with state.json; and
#     the weights, loaded from transformers' file and saved after one step at learning rate 1e-30
#     (too small to move an fp32 weight), equal transformers' file bit for bit.
#  3. with PyTorch (TORCH_PYTHON, default python3): transformers opens a checkpoint folder written
#     here, and its loss on the next step's batch equals the loss the C run reports for that step.
#  4. weights of another architecture are refused in one line naming the key.
cd "$(dirname "$0")/.." || exit 1
TOL=1e-6
dir=$(mktemp -d /tmp/picotron-interop.XXXXXX)
trap 'rm -rf "$dir"' EXIT
reader=tests/reference/safetensors_read.py
. tests/check_lib.sh
# write_config NAME tp pp dp cp grad_acc init_from load_path steps learning_rate [heads]
write_config() {
    cat >"$dir/$1.json" <<JSON
{"distributed": {"tp_size": $2, "pp_size": $3, "dp_size": $4, "cp_size": $5},
 "model": {"name": "hf_tiny", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": ${11:-4}, "num_key_value_heads": 2, "vocab_size": 256,
           "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000,
           "tie_word_embeddings": false},
 "training": {"total_train_steps": $9, "seq_length": 32, "micro_batch_size": 2,
              "gradient_accumulation_steps": $6, "learning_rate": ${10}},
 "dataset": {"name": "data/pride_and_prejudice.txt"},
 "checkpoint": {"init_from": "$7", "load_path": "$8", "save_dir": "$dir/$1.ckpt",
                "save_frequency": 1},
 "logging": {"metrics_file": "$dir/$1.jsonl"}}
JSON
}
train() { timeout 120 mpirun -np "$1" ./train --config "$dir/$2.json" >"$dir/$2.log" 2>&1; }
loss_at() { loss_in "$dir/$1.jsonl" "$2"; } # rel and close (against TOL): check_lib.sh

# 1. transformers' files in three layouts
for fixture in hf_tiny hf_tiny_sharded_bf16; do
    want=$(sed -n 's/.*"loss": \([-0-9.e+]*\).*/\1/p' tests/fixtures/$fixture/expected_loss.json)
    for layout in "one_rank 1 1 1 1 1 4" "dp2_tp2_pp2 8 2 2 2 1 2" "cp2 2 1 1 1 2 4"; do
        set -- $layout
        write_config "$fixture-$1" "$3" "$4" "$5" "$6" "$7" "tests/fixtures/$fixture" "" 1 1e-30
        train "$2" "$fixture-$1"
        got=$(loss_at "$fixture-$1" 1)
        check "$fixture under $1: first loss $got, transformers $want (rel diff $(rel "$got" "$want"))" \
            close "$got" "$want"
    done
done

# 2. what the 8-rank run saved, read by the independent reader
saved=$dir/hf_tiny-dp2_tp2_pp2.ckpt/1
check "names and shapes are a Hugging Face Llama's: $(python3 $reader expect-llama "$saved/model.safetensors" "$saved/config.json" 2>&1 | tail -n 1)" \
    python3 $reader expect-llama "$saved/model.safetensors" "$saved/config.json"
check "checksums: $(python3 $reader verify "$saved" 2>&1 | tail -n 1)" python3 $reader verify "$saved"
check "weights equal transformers' file: $(python3 $reader compare tests/fixtures/hf_tiny/model.safetensors "$saved/model.safetensors" 0 2>&1 | tail -n 1)" \
    python3 $reader compare tests/fixtures/hf_tiny/model.safetensors "$saved/model.safetensors" 0
optimizer=$(python3 $reader list "$saved/optimizer.safetensors" | grep -c 'exp_avg')
check "optimizer.safetensors holds both moments of all 21 tensors ($optimizer)" test "$optimizer" = 42

# 3. transformers opens a checkpoint written here
python=${TORCH_PYTHON:-python3}
if $python -c "import torch, transformers" 2>/dev/null; then
    write_config trained 2 2 2 1 2 tests/fixtures/hf_tiny "" 2 1e-2
    train 8 trained
    hf=$($python tests/reference/hf_loss.py "$dir/trained.ckpt/1" --dataset data/pride_and_prejudice.txt \
        --seq_length 32 --micro_batch_size 2 --gradient_accumulation_steps 2 --dp_size 2 --step 2 |
        sed -n 's/^loss //p')
    got=$(loss_at trained 2)
    check "transformers loads step 1's folder: its loss on step 2's batch $hf, the C run's $got (rel diff $(rel "$got" "$hf"))" \
        close "$got" "$hf"
else
    echo "skip transformers loading a checkpoint written here: no PyTorch in $python (set TORCH_PYTHON)"
fi

# 4. another architecture
write_config wrong 1 1 1 1 4 tests/fixtures/hf_tiny "" 1 1e-3 8
train 1 wrong
echo "     $(grep -v parameters "$dir/wrong.log")"
check "8 heads against transformers' 4: one line naming num_attention_heads" \
    test "$(grep -c 'has num_attention_heads = 4, this config has 8' "$dir/wrong.log")" = 1
exit $((failures > 0))
