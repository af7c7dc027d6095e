# shellcheck shell=bash
# The multi-node fixture, sourced by tests/t_72_two_nodes.sh (tests/nodes_slurm.sh adds a Slurm
# cluster on it): N "nodes" on this one machine, each a network namespace of its own with one
# veth link to a bridge of the fixture's own. A node has its own network stack: its address, its
# loopback, its routes; what one rank sends another node's rank goes over the link (and shows in
# the link's counters), as between two machines. Files, shared memory and processes stay shared,
# as they would not on a real cluster.
#   nodes_up N       make nodes 0..N-1: namespace picotron-n<i>, address $NODES_NET.<i+1>/24 on
#                    link pn0 inside it; the bridge (root namespace) holds $NODES_NET.254
#   nodes_exec I CMD run CMD in node I's network namespace (nsenter --net: `ip netns exec` also
#                    remounts /sys, where slurmd then finds no cgroups)
#   nodes_rx_bytes   bytes the nodes sent into their links so far, summed (the host ends' rx)
#   nodes_down       remove every namespace, link and bridge nodes_up made (nodes_up arranges it
#                    on EXIT, also when the test fails)
#   nodes_leftovers  what of the fixture still exists: empty when all is gone
# Needs root (CAP_NET_ADMIN); nodes_can says why not in one line.
# The addresses are 198.18.0.0/24, of the range RFC 2544 keeps for tests (never routed); the
# namespaces get no default route, so the traffic stays between the nodes and the bridge.
NODES_NET=${NODES_NET:-198.18.33}
NODES_BRIDGE=pbr33
NODES_LOCK=/run/picotron-nodes.lock
NODES_COUNT=0

nodes_ns() { echo "picotron-n$1"; }
nodes_addr() { echo "$NODES_NET.$(($1 + 1))"; }
nodes_host_link() { echo "pv33-$1"; }

# nodes_can: exit 0 if this machine lets us make namespaces and links, else one line why
nodes_can() {
    [ "$(id -u)" = 0 ] || { echo "needs root (CAP_NET_ADMIN) to make network namespaces"; return 1; }
    command -v ip >/dev/null && command -v nsenter >/dev/null ||
        { echo "needs ip (iproute2) and nsenter (util-linux)"; return 1; }
    local probe=picotron-probe$$
    if ! ip netns add $probe 2>/dev/null; then
        echo "this machine forbids network namespaces (ip netns add failed)"
        return 1
    fi
    if ! ip link add pprobe$$ type veth peer name pprobe$$b 2>/dev/null; then
        ip netns del $probe
        echo "this machine forbids veth links (ip link add failed)"
        return 1
    fi
    ip link del pprobe$$
    ip netns del $probe
}

nodes_exec() {
    local i=$1
    shift
    nsenter --net="/run/netns/$(nodes_ns "$i")" -- "$@"
}

nodes_up() {
    local n=$1 i
    # one fixture at a time on this machine: its names and addresses are fixed
    exec 9>"$NODES_LOCK"
    flock -w 600 9 || { echo "another test's nodes hold $NODES_LOCK"; return 1; }
    NODES_COUNT=$n
    trap nodes_down EXIT
    trap 'exit 1' INT TERM HUP PIPE # and so through the EXIT trap
    nodes_down_links # an earlier run killed before its trap ran
    ip link add $NODES_BRIDGE type bridge || return 1
    ip addr add "$NODES_NET.254/24" dev $NODES_BRIDGE
    ip link set $NODES_BRIDGE up
    for ((i = 0; i < n; i++)); do
        ip netns add "$(nodes_ns $i)" || return 1
        ip link add "$(nodes_host_link $i)" type veth peer name pn0 netns "$(nodes_ns $i)" ||
            return 1
        ip link set "$(nodes_host_link $i)" master $NODES_BRIDGE up
        nodes_exec $i ip addr add "$(nodes_addr $i)/24" dev pn0
        nodes_exec $i ip link set pn0 up
        nodes_exec $i ip link set lo up
    done
    # a port forwards once it is up (no STP on this bridge); wait for each to say so
    for ((i = 0; i < n; i++)); do
        local tries=0
        until [ "$(cat "/sys/class/net/$(nodes_host_link $i)/brport/state" 2>/dev/null)" = 3 ]; do
            tries=$((tries + 1))
            [ $tries -lt 40 ] || { echo "node $i: its bridge port does not forward"; return 1; }
            sleep 0.25
        done
    done
}

nodes_rx_bytes() {
    local i sum=0
    for ((i = 0; i < NODES_COUNT; i++)); do
        sum=$((sum + $(cat "/sys/class/net/$(nodes_host_link $i)/statistics/rx_bytes")))
    done
    echo $sum
}

# the processes still inside a namespace of ours (slurmd, hydra's proxies, ranks), ended by pid
nodes_kill_inside() {
    local ns pid
    for ns in $(ip netns list 2>/dev/null | awk '/^picotron-n[0-9]/ {print $1}'); do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
    done
}

nodes_down_links() {
    local ns link tries
    nodes_kill_inside
    # each host end first: deleting it deletes its pair now, where a namespace's deletion only
    # queues its links' (the next nodes_up could still meet them)
    for link in $(ip -o link show 2>/dev/null | awk -F'[:@]' '$2 ~ /^ pv33-/ {print $2}'); do
        ip link del "$link" 2>/dev/null
    done
    for ns in $(ip netns list 2>/dev/null | awk '/^picotron-n[0-9]/ {print $1}'); do
        ip netns del "$ns" 2>/dev/null
    done
    ip link del $NODES_BRIDGE 2>/dev/null
    for ((tries = 0; tries < 40; tries++)); do
        [ -z "$(nodes_leftovers)" ] && break
        sleep 0.25
    done
    return 0
}

nodes_down() {
    [ -n "${NODES_DOWN_HOOK:-}" ] && $NODES_DOWN_HOOK
    nodes_down_links
    [ $NODES_COUNT -gt 0 ] && exec 9>&- # the lock, for the next nodes_up
    NODES_COUNT=0
}

nodes_leftovers() {
    ip netns list 2>/dev/null | awk '/^picotron-n[0-9]/ {printf "namespace %s ", $1}'
    ip -o link show 2>/dev/null | awk -F': ' '$2 ~ /^(pbr33|pv33-)/ {printf "link %s ", $2}'
    for ns in $(ip netns list 2>/dev/null | awk '/^picotron-n[0-9]/ {print $1}'); do
        ip netns pids "$ns" | sed 's/^/process /'
    done
    # daemons of tests/nodes_slurm.sh: theirs are the only ones reading a slurm.conf of ours
    pgrep -a -f 'slurm(ctld|d) .*picotron-layouts' | sed 's/^/daemon /'
}
