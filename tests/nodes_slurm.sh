# shellcheck shell=bash
# A Slurm cluster on the nodes of tests/nodes_lib.sh (sourced after it, by t_72): slurmctld in the
# root namespace, on the bridge's address and ports of its own (the one-node cluster of t_70 keeps
# 6817/6818), and one slurmd per node, each started in its node's network namespace with
# `nsenter --net` and `slurmd -N pn<i>` (Debian's Slurm is built for several slurmd on one host:
# %n in the paths below). munged is the machine's own if one answers, else one of ours.
#   slurm_nodes_up DIR N   write DIR/slurm.conf, start the daemons, wait until N nodes are idle;
#                          exports SLURM_CONF
#   slurm_nodes_down       stop what slurm_nodes_up started (by its pid files), cancel its jobs
SLURM_NODES_DIR=""

slurm_nodes_pid_alive() { # PIDFILE NAME: the pid in PIDFILE is a live NAME
    local pid
    pid=$(head -n1 "$1" 2>/dev/null | tr -dc '0-9')
    [ -n "$pid" ] && [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$2"* ]]
}

slurm_nodes_up() {
    local dir=$1 n=$2 i host last
    SLURM_NODES_DIR=$dir
    NODES_DOWN_HOOK=slurm_nodes_down # nodes_down stops the daemons before the links go
    host=$(hostname -s)
    last=$((n - 1))
    mkdir -p "$dir/state" "$dir/log" "$dir/munge"
    chmod 755 "$dir" # munged runs as munge
    for ((i = 0; i < n; i++)); do mkdir -p "$dir/spool/pn$i"; done
    cat >"$dir/slurm.conf" <<CONF
ClusterName=picotron-nodes
SlurmctldHost=$host($NODES_NET.254)
SlurmctldPort=7817
SlurmdPort=7818
AuthType=auth/munge
CryptoType=crypto/munge
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmi2
ReturnToService=2
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.%n.log
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
MinJobAge=300
KillWait=5
Waittime=0
SlurmdParameters=config_overrides
NodeName=pn[0-$last] NodeHostname=$host NodeAddr=$NODES_NET.[1-$n] CPUs=4 RealMemory=2000
PartitionName=nodes Nodes=pn[0-$last] Default=YES MaxTime=INFINITE State=UP
CONF
    export SLURM_CONF=$dir/slurm.conf
    if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        install -d -o munge -g munge -m 0755 /run/munge
        chown munge:munge "$dir/munge"
        runuser -u munge -- munged --pid-file="$dir/munge/munged.pid" \
            --log-file="$dir/munge/munged.log" || { echo "munged did not start"; return 1; }
        sleep 0.5
    fi
    slurmctld -c -f "$SLURM_CONF" || { echo "slurmctld did not start"; return 1; }
    for ((i = 0; i < n; i++)); do
        nodes_exec $i slurmd -f "$SLURM_CONF" -N "pn$i" ||
            { echo "slurmd pn$i did not start"; tail -n 5 "$dir/log/slurmd.pn$i.log"; return 1; }
    done
    local tries idle
    for ((tries = 0; tries < 120; tries++)); do
        idle=$(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)
        [ "$idle" = "$n" ] && return 0
        sleep 0.5
    done
    echo "only $idle of $n Slurm nodes idle after 60 s:"
    sinfo -N 2>&1 | head -n 5
    tail -n 5 "$dir/log/slurmctld.log"
    return 1
}

slurm_nodes_down() {
    local dir=$SLURM_NODES_DIR f
    [ -n "$dir" ] || return 0
    jobs=$(squeue -h -o %A 2>/dev/null)
    # shellcheck disable=SC2086  # one argument per job id
    [ -n "$jobs" ] && scancel $jobs 2>/dev/null && sleep 1
    for f in "$dir"/slurmd.*.pid "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
        local name=slurmd
        [[ $f == *slurmctld.pid ]] && name=slurmctld
        [[ $f == *munged.pid ]] && name=munged
        slurm_nodes_pid_alive "$f" $name && kill "$(head -n1 "$f")"
    done
    for f in "$dir"/slurmd.*.pid "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
        local tries
        for ((tries = 0; tries < 40; tries++)); do
            slurm_nodes_pid_alive "$f" "$(basename "$f" | cut -d. -f1)" || break
            sleep 0.25
        done
    done
    SLURM_NODES_DIR=""
}
