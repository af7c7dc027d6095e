#!/usr/bin/env bash
# Vocabulary padding (model.make_vocab_size_divisible_by, vocab_padding.c) changes no number.
#  1. A model with GPT-2's vocabulary, 50257 tokens (which no tp > 1 divides), padded to 50304 rows
#     (a multiple of 128) trains under tp 2, tp 4, tied under tp2 x pp2, dp 2 with ZeRO-1 and
#     padded on one rank, to the losses and final weights of one unpadded rank
#     (tests/layout_harness.sh's tolerances), on GPT-2 ids (tests/fixtures/tokenizer/gpt2/
#     hard_cases.tok). Its checkpoint is exactly a Hugging Face Llama of vocab_size 50257 (the
#     independent reader, safetensors_read.py: names, shapes, checksums), and resumes, the padding
#     rows made again, under tp 4 padded to 256 and on one unpadded rank (also from ZeRO-1's
#     sharded moments); ./generate samples real tokens from it.
#  2. transformers' own checkpoint of such a model (tests/fixtures/hf_gpt2_vocab, written by
#     tests/reference/make_vocab_pad_fixture.py) loads by checkpoint.init_from into a padded model
#     under tp 2 and into an unpadded one on one rank: the first loss equals transformers' within
#     TOL relative, and the weights saved after a step at learning rate 1e-30 (too small to move an
#     fp32 weight) equal transformers' file bit for bit.
#  3. with PyTorch (TORCH_PYTHON, default python3): transformers opens the checkpoint a padded tp 2
#     run wrote, and its loss on the next step's batch equals the loss the C run reports.
cd "$(dirname "$0")/.." || exit 1
TOL=1e-6
. tests/check_lib.sh
. tests/layout_harness.sh
reader=tests/reference/safetensors_read.py
GPT2="vocab=50257 hidden=32 inter=64 heads=4 kv_heads=4 layers=2 ga=2
      data=tests/fixtures/tokenizer/gpt2/hard_cases.tok"

# 1. layouts, against one unpadded rank
run_layout base $GPT2 || exit 1
check_layout base one_rank_pad128 $GPT2 pad=128
check_layout base tp2_pad128 $GPT2 tp=2 pad=128 save=5
check_layout base tp4_pad128 $GPT2 tp=4 pad=128
check_layout base dp2_zero1_pad128 $GPT2 dp=2 ga=1 zero1=true pad=128 save=5
run_layout base_tied $GPT2 tied=true || exit 1
check_layout base_tied tp2_pp2_tied_pad128 $GPT2 tp=2 pp=2 tied=true pad=128
saved=$HARNESS_DIR/tp2_pad128/ckpt/5
check "the padded tp2 checkpoint is a Llama of vocab_size 50257: $(python3 $reader expect-llama "$saved/model.safetensors" "$saved/config.json" 2>&1 | tail -n 1)" \
    python3 $reader expect-llama "$saved/model.safetensors" "$saved/config.json"
rows=$(python3 $reader list "$saved/optimizer.safetensors" | grep -c 'embed_tokens.*\[50257, 32\]')
check "its optimizer moments hold 50257 rows too ($rows of 2)" test "$rows" = 2
check "config.json says vocab_size 50257" grep -q '"vocab_size":[[:space:]]*50257,' "$saved/config.json"
check "checksums: $(python3 $reader verify "$saved" 2>&1 | tail -n 1)" python3 $reader verify "$saved"
ids=$(./generate --checkpoint "$saved" --tokenizer data/gpt2 --prompt "It is a truth" \
    --max_new_tokens 8 --temperature 1 --seed 3 --print_ids 2>/dev/null | head -n 1)
check "./generate samples from it 8 ids, all real tokens (below 50257): $ids" \
    awk -v ids="$ids" 'BEGIN { n = split(ids, a, " "); for (i = 1; i <= n; i++) if (a[i] >= 50257) exit 1; exit n != 8 }'
resume_layout base tp2_pad128 tp4_pad256_resumed $GPT2 tp=4 pad=256
resume_layout base tp2_pad128 one_rank_resumed $GPT2
resume_layout base dp2_zero1_pad128 one_rank_from_zero1 $GPT2

# 2. transformers' checkpoint of a 50257-token vocabulary
fixture=tests/fixtures/hf_gpt2_vocab
dir=$HARNESS_DIR/hf
mkdir -p "$dir"
# write_config NAME tp pad steps learning_rate
write_config() {
    cat >"$dir/$1.json" <<JSON
{"distributed": {"tp_size": $2},
 "model": {"name": "hf_gpt2_vocab", "hidden_size": 8, "intermediate_size": 32,
           "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
           "vocab_size": 50257, "make_vocab_size_divisible_by": $3,
           "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000,
           "tie_word_embeddings": true},
 "training": {"total_train_steps": $4, "seq_length": 32, "micro_batch_size": 2,
              "gradient_accumulation_steps": 4, "learning_rate": $5},
 "dataset": {"name": "tests/fixtures/tokenizer/gpt2/hard_cases.tok"},
 "checkpoint": {"init_from": "$fixture", "save_dir": "$dir/$1.ckpt", "save_frequency": 1},
 "logging": {"metrics_file": "$dir/$1.jsonl"}}
JSON
}
train() { timeout 120 mpirun -np "$1" ./train --config "$dir/$2.json" >"$dir/$2.log" 2>&1; }
want=$(sed -n 's/.*"loss": \([-0-9.e+]*\).*/\1/p' $fixture/expected_loss.json)
for layout in "one_rank 1 1" "tp2_pad128 2 128"; do
    set -- $layout
    write_config "$1" "$2" "$3" 1 1e-30
    train "$2" "$1"
    got=$(loss_in "$dir/$1.jsonl" 1)
    check "hf_gpt2_vocab under $1: first loss $got, transformers $want (rel diff $(rel "$got" "$want"))" \
        close "$got" "$want"
    check "$1 saves transformers' weights after a step at lr 1e-30: $(python3 $reader compare $fixture/model.safetensors "$dir/$1.ckpt/1/model.safetensors" 0 2>&1 | tail -n 1)" \
        python3 $reader compare $fixture/model.safetensors "$dir/$1.ckpt/1/model.safetensors" 0
done

# 3. transformers opens a checkpoint a padded run wrote
python=${TORCH_PYTHON:-python3}
if $python -c "import torch, transformers" 2>/dev/null; then
    write_config trained 2 128 2 1e-2
    train 2 trained
    hf=$($python tests/reference/hf_loss.py "$dir/trained.ckpt/1" \
        --dataset tests/fixtures/tokenizer/gpt2/hard_cases.tok --seq_length 32 \
        --micro_batch_size 2 --gradient_accumulation_steps 4 --step 2 | sed -n 's/^loss //p')
    got=$(loss_in "$dir/trained.jsonl" 2)
    check "transformers loads the padded tp2 run's step 1: its loss on step 2's batch $hf, the C run's $got (rel diff $(rel "$got" "$hf"))" \
        close "$got" "$hf"
else
    echo "skip transformers loading a padded run's checkpoint: no PyTorch in $python (set TORCH_PYTHON)"
fi
exit $((failures + harness_failures > 0))
