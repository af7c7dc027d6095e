#!/usr/bin/env bash
# What the docs cite exists: every function, name and file that README.md, docs/*.md and
# tutorial/*.md name in backticks, and every file they link to (tests/citations.py says the
# rules): a `function()` or a name in a chapter's `read` column is defined in the code, a
# `name_with_underscore` occurs in it, a `path/file.c` is a file of the repo, `t_NN` is a test.
# It prints how many of each it checked and each missing one as FILE:LINE; and README.md must stay
# at most 200 lines.
# The self-check first feeds it a made-up doc: a function nobody defines, a name in a read column
# that is no function, a bare name the code lacks, a file that is not there, a real function with
# the wrong number of arguments, a broken link and a link to a missing heading must each be
# reported at their line, and the real names beside them must not.
cd "$(dirname "$0")/.." || exit 1
command -v python3 >/dev/null || { echo "python3 not found: tests/citations.py needs it"; exit 77; }
dir=$(mktemp -d /tmp/picotron-citations.XXXXXX)
trap 'rm -rf "$dir"' EXIT

cat >"$dir/made_up.md" <<'EOF'
# A made-up chapter

| chapter | read |
|---|---|
| one | `model.c` (`model_forward`, `frobnicate_layers`) |

Read, in `data_parallel.c`:

- `data_parallel_wait(dp)`: real, one argument.
- `data_parallel_wait(dp, extra)`: real, but with two.

`frobnicate_gradients()` sits in `backend/cpu/nowhere.c`, beside `layout_params` and the real
`tensor_parallel_shard` in `tensor_parallel.c`; see [the chapter](no_such_chapter.md).

## A real heading

[Here](#a-real-heading) is real, [there](#no-such-heading) is not.
EOF
failures=0
python3 tests/citations.py "$dir/made_up.md" >"$dir/made_up.txt"
rc=$?
selfcheck=ok
for want in ":5: .*frobnicate_layers" ":10: .*data_parallel_wait(dp, extra).* takes 1" \
            ":12: .*frobnicate_gradients" ":12: .*backend/cpu/nowhere.c" ":12: .*layout_params" \
            ":13: link to no_such_chapter.md" ":17: .*#no-such-heading"; do
    grep -q "$want" "$dir/made_up.txt" || selfcheck="FAIL: not reported: $want"
done
for real in "#a-real-heading" model_forward "data_parallel_wait(dp)\`" tensor_parallel_shard "\`model.c\`" \
            "\`tensor_parallel.c\`" "\`data_parallel.c\`"; do
    ! grep -qF -- "$real" "$dir/made_up.txt" || selfcheck="FAIL: reported, but real: $real"
done
[ $rc -eq 1 ] || selfcheck="FAIL: exit $rc on the made-up doc, not 1"
if [ "$selfcheck" = ok ]; then
    echo "self-check ok: the made-up doc's 7 wrong citations are reported, its real ones are not"
else
    echo "self-check $selfcheck"
    sed 's/^/    /' "$dir/made_up.txt"
    failures=$((failures + 1))
fi

# the front door stays short (DESIGN.md: README.md at most 200 lines; depth goes to docs/)
lines=$(wc -l <README.md)
if [ "$lines" -le 200 ]; then echo "ok   README.md: $lines lines (at most 200)"
else echo "FAIL README.md: $lines lines, more than 200: move depth to docs/"; failures=$((failures + 1)); fi

# the docs themselves
docs=(README.md)
for doc in docs/*.md tutorial/*.md; do [ -e "$doc" ] && docs+=("$doc"); done
python3 tests/citations.py "${docs[@]}" || failures=$((failures + 1))
echo "$failures failures"
[ $failures -eq 0 ]
