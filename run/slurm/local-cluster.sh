#!/usr/bin/env bash
# A real Slurm controller with two nodes (node1, node2), both this machine, for the tests and CI.
#
# Usage: run/slurm/local-cluster.sh start DIR | stop DIR
#   start: writes DIR/slurm.conf (every path under DIR), starts munged (its own key and socket under DIR),
#          slurmctld and `slurmd -N node1`, `slurmd -N node2`, and waits until `sinfo` shows both idle.
#          Clients then need SLURM_CONF=DIR/slurm.conf (start prints the export line).
#   stop:  cancels the cluster's jobs, ends exactly the processes start started (by the pids in DIR's pid
#          files, never by name) and removes DIR.
# It installs nothing: `apt-get install -y slurmctld slurmd slurm-client munge` first (.ci/run does).
# Ports: SLURM_LOCAL_PORT (default 46817) for slurmctld, +1 for slurmd's default, +3 and +4 for the nodes.
set -euo pipefail

usage() { sed -n '2,11p' "$0" >&2; exit 2; }
[ $# -eq 2 ] || usage
cmd=$1
DIR=$(realpath -m "$2")
PORT=${SLURM_LOCAL_PORT:-46817}
START_TIMEOUT=${SLURM_LOCAL_TIMEOUT:-60}
export SLURM_CONF="$DIR/slurm.conf"

write_conf() {
    cat >"$SLURM_CONF" <<EOF
ClusterName=gpci
SlurmctldHost=localhost
SlurmUser=root
SlurmctldPort=$PORT
SlurmdPort=$(( PORT + 1 ))
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket,cred_expire=${SLURM_LOCAL_CRED_EXPIRE:-5}
CredType=cred/munge
MpiDefault=none
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool-%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
KillWait=5
MinJobAge=300
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd-%n.log
NodeName=node1 NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=2 RealMemory=2000 Port=$(( PORT + 3 ))
NodeName=node2 NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=2 RealMemory=2000 Port=$(( PORT + 4 ))
PartitionName=debug Nodes=node[1-2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
EOF
}

start_munge() {
    # own key, socket and pid file under DIR: the machine's /etc/munge and /run/munge are left alone
    mkdir -p "$DIR/munge"
    chmod 700 "$DIR/munge"
    [ -f "$DIR/munge/munge.key" ] || mungekey --create --keyfile="$DIR/munge/munge.key" >/dev/null
    chmod 600 "$DIR/munge/munge.key"
    munged --force --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
        --pid-file="$DIR/munge.pid" --log-file="$DIR/munge/munged.log" --seed-file="$DIR/munge/munged.seed"
    munge -n --socket="$DIR/munge/munge.socket" | unmunge --socket="$DIR/munge/munge.socket" >/dev/null
}

wait_pidfile() {
    local file=$1 deadline=$(( SECONDS + START_TIMEOUT ))
    until [ -s "$file" ]; do
        [ "$SECONDS" -lt "$deadline" ] || { echo "local-cluster: no $file" >&2; return 1; }
        sleep 0.2
    done
}

wait_idle() {
    local deadline=$(( SECONDS + START_TIMEOUT ))
    until [ "$(sinfo -h -N -o '%N %t' 2>/dev/null | grep -c ' idle$')" = 2 ]; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "local-cluster: nodes not idle after ${START_TIMEOUT}s:" >&2
            sinfo -N >&2 || true
            tail -n 20 "$DIR/slurmctld.log" >&2 || true
            return 1
        fi
        sleep 0.5
    done
}

start() {
    if [ -e "$DIR/slurmctld.pid" ]; then
        echo "local-cluster: $DIR already has a cluster; stop it first" >&2
        exit 1
    fi
    mkdir -p "$DIR/state" "$DIR/spool-node1" "$DIR/spool-node2"
    write_conf
    start_munge
    slurmctld -i
    wait_pidfile "$DIR/slurmctld.pid"
    slurmd -N node1
    slurmd -N node2
    wait_pidfile "$DIR/slurmd-node1.pid"
    wait_pidfile "$DIR/slurmd-node2.pid"
    # slurmctld's helper slurmscriptd: remembered so stop can check it is gone
    sleep 0.5
    cat "/proc/$(cat "$DIR/slurmctld.pid")/task/"*/children 2>/dev/null | tr ' ' '\n' | sed '/^$/d' \
        >"$DIR/slurmscriptd.pid" || true
    wait_idle
    echo "export SLURM_CONF=$SLURM_CONF"
}

alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

end_pid() {
    # TERM, then KILL after 10 s, of one pid we started
    local pid=$1
    alive "$pid" || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do
        alive "$pid" || return 0
        sleep 0.2
    done
    echo "local-cluster: pid $pid ignored TERM; killing it" >&2
    kill -KILL "$pid" 2>/dev/null || true
}

step_pids() {
    # processes started by this cluster's slurmd: its step daemons (they run in DIR, slurmd's working
    # directory; not in a pid file) and everything under them (batch scripts and what they run), children first
    local p known
    known=" $(cat "$DIR"/*.pid 2>/dev/null | tr '\n' ' ') "
    for p in /proc/[0-9]*; do
        [ "$(readlink "$p/cwd" 2>/dev/null)" = "$DIR" ] || continue
        case "$known" in *" ${p#/proc/} "*) ;; *) descendants "${p#/proc/}"; echo "${p#/proc/}" ;; esac
    done
}

descendants() {
    local c
    # shellcheck disable=SC2013  # a children file is one line of pids
    for c in $(cat "/proc/$1/task/"*/children 2>/dev/null); do
        descendants "$c"
        echo "$c"
    done
}

stop() {
    [ -d "$DIR" ] || return 0
    if [ -e "$DIR/slurmctld.pid" ] && alive "$(cat "$DIR/slurmctld.pid")"; then
        scancel --full --quiet --clusters=gpci --state=RUNNING 2>/dev/null || true
        scancel --quiet 2>/dev/null || true
        local deadline=$(( SECONDS + 20 ))
        while [ -n "$(squeue -h -o %i 2>/dev/null)" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.5; done
    fi
    local f pid
    # a cancelled job's step daemon (and its batch script) can outlive slurmd: end them first
    for pid in $(step_pids); do end_pid "$pid"; done
    for f in slurmd-node1.pid slurmd-node2.pid slurmctld.pid slurmscriptd.pid munge.pid; do
        [ -s "$DIR/$f" ] || continue
        while read -r pid; do end_pid "$pid"; done <"$DIR/$f"
    done
    rm -rf "$DIR"
}

case "$cmd" in
    start) start ;;
    stop) stop ;;
    *) usage ;;
esac
