#!/usr/bin/env bash
# Hydra's remote shell for the nodes of tests/nodes_lib.sh: mpirun -launcher rsh -launcher-exec
# tests/node_launcher.sh calls it as `node_launcher.sh HOST COMMAND...`, as it would call rsh,
# to start its proxy on HOST. HOST is a node's address (198.18.33.<i+1>); the proxy runs in that
# node's network namespace, and the ranks it starts with it. `ip netns exec`, not nsenter: it
# also mounts a /sys of the namespace, where UCX looks for the network devices it may use (under
# nsenter it sees the root namespace's, finds none of them in its stack and keeps only lo).
host=$1
shift
while [[ $host == -* ]]; do host=$1; shift; done # options rsh would take (none expected)
i=$((${host##*.} - 1))
exec ip netns exec "picotron-n$i" /bin/sh -c "$*"
