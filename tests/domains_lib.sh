# shellcheck shell=bash
# Sourced by the tests of domain mixtures (t_19, t_69), with their claim helpers say and bad.
# make_domains DIR writes two domains of
# known character beside the bundled novel, and sets THREE_DOMAINS to the dataset section's keys:
#   sums.txt    generated arithmetic ("12+34=46"), learnable
#   random.txt  uniform random bytes, which no model can learn (fixed by a seed: every run of a
#               test reads the same bytes)
make_domains() {
    awk 'BEGIN { srand(3); for (i = 0; i < 40000; i++) { a = int(rand() * 100); b = int(rand() * 100);
                 printf "%d+%d=%d\n", a, b, a + b } }' >"$1/sums.txt"
    python3 -c "import random; random.seed(5); open('$1/random.txt', 'wb').write(bytes(random.getrandbits(8) for _ in range(200000)))"
    THREE_DOMAINS='"domains": [{"name": "novel", "path": "data/pride_and_prejudice.txt", "weight": 2},
                  {"name": "sums", "path": "'$1/sums.txt'", "weight": 1},
                  {"name": "random", "path": "'$1/random.txt'", "weight": 1}]'
}

# say ok|FAIL WHAT: one claim's line; a FAIL sets status=1 for the test's exit
say() { printf "%-4s %s\n" "$1" "$2"; [ "$1" = ok ] || status=1; }

# bad NAME PYTHON WANT: $base (a config.json) edited by PYTHON (cfg is the parsed JSON) into
# $work/NAME.json must end ./train with exit 1 and one line matching WANT (grep), after MPICH's
# abort lines and the lines a rank prints before it fails
bad() {
    python3 -c "import json; cfg = json.load(open('$base')); $2; json.dump(cfg, open('$work/$1.json', 'w'))"
    timeout 60 ./train --config "$work/$1.json" >"$work/$1.out" 2>&1
    local rc=$? lines
    lines=$(grep -v -e '^Abort(' -e '^application called MPI_Abort' -e 'parameters on this rank' \
        "$work/$1.out" | grep -c .)
    if [ $rc = 1 ] && [ "$lines" = 1 ] && grep -q -- "$3" "$work/$1.out"; then
        say ok "$1: exit 1: $(grep -- "$3" "$work/$1.out")"
    else
        say FAIL "$1: exit $rc, $lines lines (want one matching '$3'): $(head -c 400 "$work/$1.out")"
    fi
}
