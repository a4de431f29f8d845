#!/usr/bin/env bash
# Stop the SGLang fleet started by run/launch_sglang.sh.
#
# Usage: run/stop_sglang.sh [options]
#
#   --config FILE      configuration (default: run/fleet.env); gives RUN_DIR and STOP_TIMEOUT
#   --run-dir DIR      run folder whose servers/server-PORT.pid files to stop (overrides RUN_DIR)
#   --timeout S        seconds to wait after SIGTERM before SIGKILL (default: STOP_TIMEOUT or 60)
#   --dry-run          print which pids would be signalled; signal nothing
#   -h, --help         show this help
#
# Only the pids recorded in $RUN_DIR/servers/*.pid are signalled, never processes found by name.
# Each gets SIGTERM; whatever is still alive after the timeout gets SIGKILL. launch_sglang.sh
# starts every server with setsid, so a recorded pid that leads its own process group is treated
# as that group: its TP worker children are waited for and killed too, and cannot linger holding
# GPU memory. A pid file whose process is gone, or whose pid was reused by a process started
# after the file was written, is removed without signalling anything.
#
# Exit codes:
#   0  every recorded server is stopped (or there was nothing to stop) and its pid file removed
#   1  unexpected error, or some process survived SIGKILL (its pid file is kept)
#   2  usage or configuration error
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(dirname -- "$SCRIPT_DIR")
readonly SCRIPT_DIR REPO_ROOT

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
log() { printf '%s\n' "$*" >&2; }
die() {
  local code=$1
  shift
  printf 'error: %s\n' "$*" >&2
  exit "$code"
}
is_uint() { [[ $1 =~ ^(0|[1-9][0-9]*)$ ]]; }

config_file="$SCRIPT_DIR/fleet.env"
opt_run_dir="" opt_timeout="" dry_run=0
need_value() { [[ $# -ge 2 && -n $2 ]] || die 2 "$1 needs a value (see --help)"; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --config) need_value "$@"; config_file=$2; [[ $config_file == */* ]] || config_file=./$config_file; shift 2 ;;
    --run-dir) need_value "$@"; opt_run_dir=$2; shift 2 ;;
    --timeout) need_value "$@"; opt_timeout=$2; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die 2 "unknown argument: $1" ;;
  esac
done

# Configuration: flag > environment > config file > default (as in launch_sglang.sh).
if [[ -z $opt_run_dir || -z $opt_timeout ]]; then
  [[ -f $config_file ]] || die 2 "config file not found: $config_file"
  env_run_dir=${RUN_DIR-} env_stop_timeout=${STOP_TIMEOUT-}
  had_run_dir=${RUN_DIR+x} had_stop_timeout=${STOP_TIMEOUT+x}
  # shellcheck source=/dev/null
  source "$config_file"
  [[ -z $had_run_dir ]] || RUN_DIR=$env_run_dir
  [[ -z $had_stop_timeout ]] || STOP_TIMEOUT=$env_stop_timeout
fi
RUN_DIR=${opt_run_dir:-${RUN_DIR:-runs/sglang}}
STOP_TIMEOUT=${opt_timeout:-${STOP_TIMEOUT:-60}}
is_uint "$STOP_TIMEOUT" || die 2 "the stop timeout must be a whole number of seconds, got '$STOP_TIMEOUT'"
[[ $RUN_DIR == /* ]] || RUN_DIR="$REPO_ROOT/$RUN_DIR"
servers_dir="$RUN_DIR/servers"

# A process that exists and is not a zombie.
pid_alive() {
  local stat
  stat=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  [[ -n $stat && $stat != Z* ]]
}
# Some non-zombie process is in process group $1.
group_alive() { ps -e -o pgid=,stat= | awk -v g="$1" '$1 == g && $2 !~ /^Z/ { found = 1 } END { exit !found }'; }
# The process (or, for a group leader we started with setsid, its whole group) is still running.
target_alive() {
  local pid=$1 is_group=$2
  if ((is_group)); then group_alive "$pid"; else pid_alive "$pid"; fi
}
signal_target() {
  local sig=$1 pid=$2 is_group=$3
  if ((is_group)); then kill "-$sig" -- "-$pid" 2>/dev/null || true; fi
  kill "-$sig" "$pid" 2>/dev/null || true
}

shopt -s nullglob
pid_files=("$servers_dir"/*.pid)
if ((${#pid_files[@]} == 0)); then
  log "no pid files in $servers_dir: nothing to stop"
  exit 0
fi

now=$(date +%s)
targets=() target_files=() target_group=()
for pf in "${pid_files[@]}"; do
  pid=$(tr -d '[:space:]' <"$pf")
  if ! is_uint "$pid" || ((pid <= 1)); then
    log "$pf: does not hold a valid pid ('$pid'); removing it"
    ((dry_run)) || rm -f -- "$pf"
    continue
  fi
  if ! pid_alive "$pid"; then
    # A process group outlives its leader while children are left; the kernel does not reuse
    # a pid that is still a group id, so these are the dead server's own workers.
    if group_alive "$pid"; then
      log "$pf: server pid $pid is gone but processes of its group remain; stopping them"
      targets+=("$pid")
      target_files+=("$pf")
      target_group+=(1)
    else
      log "$pf: pid $pid is not running; removing the stale pid file"
      ((dry_run)) || rm -f -- "$pf"
    fi
    continue
  fi
  # The file is written right after the server starts, so the process cannot be younger than
  # the file; a younger one reused the pid of a server that died long ago.
  age=$(ps -o etimes= -p "$pid" | tr -d ' ')
  file_age=$((now - $(stat -c %Y -- "$pf")))
  if is_uint "$age" && ((age + 2 < file_age)); then
    log "$pf: pid $pid now belongs to a process started after the file was written" \
      "($(ps -o comm= -p "$pid")); not signalling it, removing the stale pid file"
    ((dry_run)) || rm -f -- "$pf"
    continue
  fi
  is_group=0
  [[ $(ps -o pgid= -p "$pid" | tr -d ' ') == "$pid" ]] && is_group=1
  targets+=("$pid")
  target_files+=("$pf")
  target_group+=("$is_group")
done

if ((${#targets[@]} == 0)); then
  log "no server of $servers_dir is running"
  exit 0
fi

for i in "${!targets[@]}"; do
  what="pid ${targets[i]}"
  ((target_group[i])) && what="process group ${targets[i]}"
  if ((dry_run)); then
    log "would send SIGTERM to $what ($(ps -o args= -p "${targets[i]}" | cut -c1-100)), from ${target_files[i]}"
  else
    log "SIGTERM -> $what (${target_files[i]})"
    # The server itself shuts its workers down on SIGTERM; an orphaned group gets it directly.
    if pid_alive "${targets[i]}"; then signal_target TERM "${targets[i]}" 0; else signal_target TERM "${targets[i]}" 1; fi
  fi
done
((dry_run)) && exit 0

# Wait for the processes (and the groups of group leaders) to go, then SIGKILL what is left.
deadline=$((SECONDS + STOP_TIMEOUT))
while :; do
  remaining=0
  for i in "${!targets[@]}"; do
    if target_alive "${targets[i]}" "${target_group[i]}"; then remaining=$((remaining + 1)); fi
  done
  ((remaining > 0 && SECONDS < deadline)) || break
  sleep 0.1
done

status=0
for i in "${!targets[@]}"; do
  pid=${targets[i]} is_group=${target_group[i]}
  if target_alive "$pid" "$is_group"; then
    log "pid $pid still running ${STOP_TIMEOUT}s after SIGTERM: SIGKILL"
    signal_target KILL "$pid" "$is_group"
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      target_alive "$pid" "$is_group" || break
      sleep 0.2
    done
  fi
  if target_alive "$pid" "$is_group"; then
    log "pid $pid survived SIGKILL (uninterruptible I/O?); keeping ${target_files[i]}"
    status=1
  else
    rm -f -- "${target_files[i]}"
  fi
done
if ((status == 0)); then log "stopped ${#targets[@]} server(s)"; fi
exit "$status"
