#!/usr/bin/env bash
# Claim: across nodes that have separate network stacks (network namespaces joined by veth links
# to a bridge, tests/nodes_lib.sh), MPICH's Hydra starts the ranks on each node and they train as
# one rank: dp2 x tp2 x pp2 on 2 nodes of 4 ranks and on 4 nodes of 2 gives the single-rank
# losses and final weights (tests/layout_harness.sh's tolerances); the report shows each rank's
# node and local rank and which groups cross nodes; the bytes the links' own counters saw are
# within NODE_BYTES_TOL of what the report says crossed; and every namespace, link and process
# the test made is gone at its end. Needs root (CAP_NET_ADMIN); skipped otherwise.
cd "$(dirname "$0")/.." || exit 1
NODE_BYTES_TOL=0.10 # the links also carry TCP/IP headers, UCX's own messages and Hydra's PMI
skip() { echo "$*"; exit 77; }
source tests/nodes_lib.sh
why=$(nodes_can) || skip "skipped: $why"
[ -x ./train ] || skip "./train is not built"
source tests/layout_harness.sh
trap 'nodes_down; rm -rf "$HARNESS_DIR"' EXIT
nodes_up 4 || { echo "FAIL: could not make 4 nodes"; exit 1; }
trap 'nodes_down; rm -rf "$HARNESS_DIR"' EXIT # nodes_up set its own; keep the harness's too
mpicc -shared -fPIC -o "$HARNESS_DIR/finalize_shim.so" tests/finalize_shim.c ||
    { echo "FAIL: building tests/finalize_shim.c"; exit 1; }
# hydra RANKS_PER_NODE NODES: mpirun's options for the nodes; UCX over TCP on each node's link
# only (by default it would find the other nodes' ranks in this machine's shared memory)
hydra() {
    local hosts="" i
    for ((i = 0; i < $2; i++)); do hosts+="${hosts:+,}$(nodes_addr $i):$1"; done
    echo "mpirun -launcher rsh -launcher-exec $PWD/tests/node_launcher.sh -iface $NODES_BRIDGE" \
        "-genv UCX_TLS tcp -genv UCX_NET_DEVICES pn0" \
        "-genv LD_PRELOAD $HARNESS_DIR/finalize_shim.so -hosts $hosts"
}
fails=0
run_layout base ga=4 || exit 1
for layout in "4 2" "2 4"; do
    read -r per nodes <<<"$layout"
    name=n${nodes}x$per
    before=$(nodes_rx_bytes)
    HARNESS_MPIRUN=$(hydra "$per" "$nodes") check_layout base "$name" dp=2 tp=2 pp=2 ga=2 ||
        fails=$((fails + 1))
    link=$(($(nodes_rx_bytes) - before))
    log=$HARNESS_DIR/$name/log
    [ -n "${T72_KEEP:-}" ] && cp "$log" "/tmp/t72-$name.log"
    # each rank's node and local rank: the report's node:local column, rank r on node r / per
    want=$(seq 0 7 | awk -v p="$per" '{printf "%d %d:%d\n", $1, int($1 / p), $1 % p}')
    got=$(awk '/^bytes sent per step/ {t = 1; getline; next}
               t && /^ +[0-9]+ / {print $1, $3; next} t {exit}' "$log")
    if [ "$got" = "$want" ]; then
        echo "ok   $name: ranks on their nodes: $(echo "$got" | tr '\n' ' ')"
    else
        echo "FAIL $name: node:local per rank '$(echo "$got" | tr '\n' ' ')', want '$(echo "$want" | tr '\n' ' ')'"
        fails=$((fails + 1))
    fi
    grep -A1 '^across' "$log" | tail -n 1 | sed 's/^ */    /'
    report=$(sed -nE 's/^ *over the whole run ([0-9]+) bytes crossed nodes$/\1/p' "$log")
    if awk -v a="$link" -v b="${report:-0}" -v t=$NODE_BYTES_TOL 'BEGIN {
            d = a - b; if (d < 0) d = -d; printf "    links %d bytes, report %d, rel diff %.3f\n", a, b, b ? d / b : 1
            exit !(b > 0 && d <= t * b) }'; then
        echo "ok   $name: the links' counters match the report within $NODE_BYTES_TOL"
    else
        echo "FAIL $name: the links' counters vs the report's bytes across nodes"
        fails=$((fails + 1))
    fi
done
# tp inside a node on 4 x 2; dp and pp cross
grep -q "tp stays inside a node" "$HARNESS_DIR/n4x2/log" && grep -q "dp crosses nodes" "$HARNESS_DIR/n4x2/log" ||
    { echo "FAIL n4x2: want tp inside a node, dp across"; fails=$((fails + 1)); }

nodes_down
left=$(nodes_leftovers)
if [ -z "$left" ]; then
    echo "ok   every namespace, link and process of the nodes is gone"
else
    echo "FAIL left behind: $left"
    fails=$((fails + 1))
fi
[ $fails -eq 0 ] && [ $harness_failures -eq 0 ]
