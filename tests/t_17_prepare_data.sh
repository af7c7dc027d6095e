#!/usr/bin/env bash
# Real text in: ./prepare_data tokenises text with a real tokenizer into a .tok file that records
# which tokenizer made it, and ./train learns from it.
#  1. documents (a text file, JSON Lines, a folder of both) are separated by the end-of-text token,
#     and each document's ids are the ones it gets alone
#     and a stream (`--input -` from a pipe, a FIFO made by mkfifo, bash's <(...)) gives the very
#     .tok bytes of the same text as a file (the novel: 0.68 MB, longer than one read)
#  2. training on the GPT-2-tokenised novel (vocabulary 50304, 2 ranks) starts near ln(vocab) and
#     the loss falls
#  3. bad input ends with one line: a missing or malformed tokenizer, a token file made with another
#     tokenizer than dataset.tokenizer, a vocabulary smaller than the tokenizer's, a text file named
#     with a tokenizer, a JSON line without "text", an output that is not .tok
cd "$(dirname "$0")/.." || exit 1
dir=$(mktemp -d /tmp/picotron-prepare.XXXXXX)
trap 'rm -rf "$dir"' EXIT
. tests/check_lib.sh
# ids FILE.tok: one id a line (the .tok format of data.h: 64-byte header, then 2- or 4-byte ids)
ids() {
    python3 - "$1" <<'PY'
import struct, sys
data = open(sys.argv[1], "rb").read()
width, count = struct.unpack_from("<IQ", data, 12)
print("\n".join(str(x) for x in struct.unpack_from("<%d%s" % (count, "H" if width == 2 else "I"), data, 64)))
PY
}
prepare() { ./prepare_data --tokenizer data/gpt2 "$@"; }

# 1. documents
printf 'It is a truth universally acknowledged.' >"$dir/a.txt"
printf "Emma Woodhouse, handsome, clever, and rich.\n" >"$dir/b.txt"
printf '{"text": "Mr. Darcy\u2019s letter."}\n\n{"text": "Anne Elliot, 27."}\n' >"$dir/c.jsonl"
mkdir "$dir/folder" && cp "$dir/a.txt" "$dir/b.txt" "$dir/c.jsonl" "$dir/folder/"
prepare --input "$dir/folder" --output "$dir/folder.tok" >"$dir/folder.log" || { cat "$dir/folder.log"; exit 1; }
echo "     $(cat "$dir/folder.log")"
for doc in a b; do prepare --input "$dir/$doc.txt" --output "$dir/$doc.tok" >/dev/null; done
printf 'Mr. Darcy\xe2\x80\x99s letter.' >"$dir/c1.txt"; printf 'Anne Elliot, 27.' >"$dir/c2.txt"
for doc in c1 c2; do prepare --input "$dir/$doc.txt" --output "$dir/$doc.tok" >/dev/null; done
expected=$(for doc in a b c1 c2; do ids "$dir/$doc.tok"; [ $doc != c2 ] && echo 50256; done)
check "a folder of 2 text files and 4 JSON lines (2 blank): 4 documents, 3 end-of-text ids between them, each document's ids as it gets alone" \
    test "$(ids "$dir/folder.tok")" = "$expected" -a -n "$(grep '4 documents' "$dir/folder.log")"

# 2. training on BPE tokens
prepare --input data/pride_and_prejudice.txt --output "$dir/pp.tok" >"$dir/pp.log"
echo "     $(cat "$dir/pp.log")"
cat data/pride_and_prejudice.txt | prepare --input - --output "$dir/stdin.tok" >/dev/null
check "cat novel | ./prepare_data --input -: the same .tok bytes as the file" cmp "$dir/stdin.tok" "$dir/pp.tok"
mkfifo "$dir/fifo"
cat data/pride_and_prejudice.txt >"$dir/fifo" &
prepare --input "$dir/fifo" --output "$dir/fifo.tok" >/dev/null
wait
check "a FIFO (mkfifo) as --input: the same .tok bytes as the file" cmp "$dir/fifo.tok" "$dir/pp.tok"
prepare --input <(cat "$dir/a.txt") --output "$dir/process.tok" >/dev/null
check "--input <(cat a.txt): the same .tok bytes as a.txt" cmp "$dir/process.tok" "$dir/a.tok"
./create_config --out_dir "$dir" --exp_name bpe --model_name picotron-tiny --vocab_size 50304 \
    --dataset "$dir/pp.tok" --tokenizer data/gpt2 --dp 2 --total_train_steps 20 --seq_len 64 \
    --mbs 2 --learning_rate 3e-3 --metrics_file "$dir/bpe.jsonl" --overwrite >/dev/null
timeout 300 mpirun -np 2 ./train --config "$dir/bpe/config.json" >"$dir/bpe.log" 2>&1
first=$(sed -n '1s/.*"loss": \([0-9.]*\).*/\1/p' "$dir/bpe.jsonl")
last=$(sed -n '$s/.*"loss": \([0-9.]*\).*/\1/p' "$dir/bpe.jsonl")
check "BPE corpus, vocabulary 50304 (ln = 10.83): loss $first at step 1, $last at step 20" \
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(a > 10.33 && a < 11.33 && b < a - 3) }'

# 3. bad input: exactly one line, a non-zero exit, within seconds
one_line() { # what expected-text config|command...
    local what=$1 want=$2 rc out start=$SECONDS; shift 2
    out=$(timeout 30 "$@" 2>&1 >/dev/null | grep -v '^\(Abort\|\[unset\]\|=\)')
    rc=${PIPESTATUS[0]}
    check "$what: $(echo "$out" | head -n 1)" \
        test "$(echo "$out" | grep -c .)" = 1 -a -n "$(echo "$out" | grep -F -- "$want")" -a $((SECONDS - start)) -le 15
}
bad_config() { # name sed-expression: the bpe config, edited
    sed "$2" "$dir/bpe/config.json" >"$dir/config_$1.json"
    echo mpirun -np 2 ./train --config "$dir/config_$1.json"
}
printf '{"model": {"type": "BPE", "vocab": ' >"$dir/broken.json"
python3 -c 'import json, sys; t = json.load(open("data/gpt2/tokenizer.json")); t["model"]["merges"].pop(); json.dump(t, open(sys.argv[1], "w"))' "$dir/other.json"
one_line "missing tokenizer" "tokenizer error: $dir/none" $(bad_config none "s|\"tokenizer\": \"data/gpt2\"|\"tokenizer\": \"$dir/none\"|")
one_line "malformed tokenizer.json" "tokenizer error: $dir/broken.json" $(bad_config broken "s|\"tokenizer\": \"data/gpt2\"|\"tokenizer\": \"$dir/broken.json\"|")
one_line "token file of another tokenizer" "was made with another tokenizer than dataset.tokenizer = $dir/other.json" \
    $(bad_config other "s|\"tokenizer\": \"data/gpt2\"|\"tokenizer\": \"$dir/other.json\"|")
one_line "vocabulary smaller than the tokenizer's" "model.vocab_size = 50000 is smaller than the vocabulary" \
    $(bad_config small 's|"vocab_size": 50304|"vocab_size": 50000|')
one_line "a text file named with a tokenizer" "is not a token file: make one with ./prepare_data" \
    $(bad_config text "s|\"name\": \"$dir/pp.tok\"|\"name\": \"data/pride_and_prejudice.txt\"|")
printf '{"text": "fine"}\n{"title": "no text"}\n' >"$dir/bad.jsonl"
one_line "a JSON line without text" "$dir/bad.jsonl line 2 is not a JSON object with a \"text\" string" \
    ./prepare_data --tokenizer data/gpt2 --input "$dir/bad.jsonl" --output "$dir/bad.tok"
one_line "output not .tok" "must end in .tok" ./prepare_data --tokenizer data/gpt2 --input "$dir/a.txt" --output "$dir/a.bin"
one_line "empty standard input" "prepare_data: standard input holds no text" \
    sh -c "./prepare_data --tokenizer data/gpt2 --input - --output $dir/x.tok </dev/null"
one_line "missing input" "prepare_data: --input $dir/none.txt" ./prepare_data --tokenizer data/gpt2 --input "$dir/none.txt" --output "$dir/x.tok"
exit $((failures > 0))
