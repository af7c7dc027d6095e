#!/usr/bin/env bash
# One rank on a node of tests/nodes_lib.sh under Slurm (t_72's submit_slurm_jobs.sh --train): a
# slurmd entered only its node's network namespace (nsenter --net), so its tasks see the root
# namespace's /sys, where UCX looks for its network devices. This gives the rank a /sys of its
# own namespace (as `ip netns exec` does), UCX over TCP on the node's link, and
# tests/finalize_shim.c's MPI_Finalize (NODE_RANK_SHIM: the built library), then runs ./train.
train=$(dirname "$0")/../train
exec unshare --mount --propagation private /bin/sh -c 'mount -t sysfs sysfs /sys &&
    UCX_TLS=tcp UCX_NET_DEVICES=pn0 LD_PRELOAD=$NODE_RANK_SHIM exec "$0" "$@"' "$train" "$@"
