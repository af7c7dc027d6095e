#!/usr/bin/env bash
# The tokenizer gives Hugging Face tokenizers' ids exactly, on the hard cases, on invalid UTF-8 and
# on all of data/austen.txt, for GPT-2's vocab.json + merges.txt, its tokenizer.json and three
# variants (test_tokenizer all; the fixtures: tests/reference/make_tokenizer_fixture.py), and
# decoding gives every byte back. Each bad tokenizer (missing, an empty folder, broken JSON, not
# BPE, Llama-3's pattern, no byte tokens, a negative id, a vocab.json without merges.txt, a bad
# merges line, a merge outside the vocabulary) ends test_tokenizer's tokenizer_load with exit 1
# and exactly one line on stderr that names the file. Where Hugging Face's tokenizers and
# transformers can be imported (TOKENIZERS_PYTHON, default python3), the fixtures are made again
# from them in a copy of the tree and must be the shipped ones, byte for byte.
cd "$(dirname "$0")/.." || exit 1
bin=${PICOTRON_BUILD:-build}/tests/test_tokenizer
[ -x "$bin" ] || { echo "$bin is not built (run make)"; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

bad=0
"$bin" all "$dir" || bad=1

# what the one line must say after "tokenizer error: <the file>", for each kind test_tokenizer writes
declare -A want=(
    [missing]=': no such file or folder \(give a tokenizer\.json'
    [empty_folder]=': a folder with neither tokenizer\.json nor vocab\.json in it'
    [malformed]=': not a JSON object \(a syntax error at byte [0-9]+, line 1\)'
    [not_bpe]=': it has a model other than BPE'
    [llama3_split]=": a Split pre-tokenizer other than GPT-2's pattern"
    [no_byte_tokens]=': byte 0 \(".*"\) has no token'
    [bad_id]=': token "a" has id -3, not a whole number'
    [no_merges]=": no such file; .*/vocab\.json needs GPT-2's merges\.txt beside it"
    [merges_line]=':3: not "left right"'
    [merge_not_in_vocab]=':3: merge "b a": "ba" is not in the vocabulary'
)
kinds=(missing empty_folder malformed not_bpe llama3_split no_byte_tokens bad_id no_merges
       merges_line merge_not_in_vocab)
for kind in "${kinds[@]}"; do
    timeout 20 "$bin" error "$kind" "$dir" >"$dir/out" 2>"$dir/err" </dev/null
    rc=$?
    path=$(head -n 1 "$dir/out")
    regex="^tokenizer error: ${path//./\\.}${want[$kind]}"
    lines=$(grep -c . "$dir/err")
    problem=""
    if [ $rc -eq 0 ]; then problem="exit status 0"
    elif [ $rc -eq 124 ]; then problem="did not end within 20 s"
    elif [ "$lines" -ne 1 ]; then problem="$lines stderr lines instead of 1"
    elif ! grep -q -E -- "$regex" "$dir/err"; then problem="the line does not match /$regex/"
    fi
    if [ -n "$problem" ]; then
        echo "FAIL $kind: $problem (exit $rc); stderr and stdout were:"
        sed 's/^/    | /' "$dir/err" "$dir/out"
        bad=1
    else
        echo "ok   $kind: exit $rc: $(sed "s|$dir|DIR|g" "$dir/err")"
    fi
done
# the Python that makes them: TOKENIZERS_PYTHON, python3, or a venv of the pinned versions
source tests/tokenizers_python.sh
tokenizers_python "$dir/pip.log"
if $python -c "import tokenizers, transformers" 2>/dev/null; then
    mkdir -p "$dir/tree/tests/reference" "$dir/tree/tests/fixtures"
    cp -r data "$dir/tree/"
    cp tests/reference/make_tokenizer_fixture.py "$dir/tree/tests/reference/"
    if $python "$dir/tree/tests/reference/make_tokenizer_fixture.py" >"$dir/make.log" 2>&1 &&
        diff -r tests/fixtures/tokenizer "$dir/tree/tests/fixtures/tokenizer" >/dev/null &&
        cmp -s data/gpt2/tokenizer.json "$dir/tree/data/gpt2/tokenizer.json"; then
        echo "ok   the fixtures, made again by $(grep -m1 "^tokenizers" "$dir/make.log"), are the shipped ones"
    else
        echo "FAIL the fixtures made again differ from the shipped ones:"; tail -n 3 "$dir/make.log"
        bad=1
    fi
else
    echo "skip making the fixtures again: no tokenizers/transformers in $python, and pip could not install them ($(tail -n 1 "$dir/pip.log" 2>/dev/null))"
fi
exit $bad
