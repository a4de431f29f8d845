#!/usr/bin/env bash
# Start a fleet of SGLang servers on this node, each pinned to its GPUs and to their NUMA node.
#
# Usage: run/launch_sglang.sh [options]
#
#   --config FILE      configuration (default: run/fleet.env); environment variables override it
#   --gpus LIST        the GPUs to use, e.g. 0-3 or 0,1,4-5 (default: all; also GPUS=LIST)
#   --tp N             GPUs per server (tensor parallel); each server gets the next N of them (see below)
#   --num-servers N    number of servers (default: GPU count / TP)
#   --base-port P      server i listens on P+i (default 30000)
#   --dry-run          print the GPU/NUMA plan and the exact commands; start nothing
#   --force            start even if a TP group spans NUMA nodes, or MAX_RUNNING_REQUESTS > 2048
#   -h, --help         show this help
#
# Topology comes from `nvidia-smi topo -m` (the "CPU Affinity" and "NUMA Affinity" columns of
# each GPU row). With TP 1, server i gets the i-th GPU. With TP > 1 the GPUs are taken NUMA node by
# node (lowest index first within a node), so the groups stay on one node wherever the layout allows:
# on a node whose GPUs alternate between sockets (GPU0,2,4,6 on node 0), TP 2 gives GPU0,2 / GPU4,6 /
# GPU1,3 / GPU5,7. A TP group must stay on one NUMA node, or consist of whole nodes (TP 8 on a
# node with 4 GPUs per socket); any other group is refused unless --force. CPU pinning without
# numactl (taskset, or nothing) is warned about: taskset binds CPUs, not memory. Each server runs as
#   CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=<its GPUs> \
#     numactl --cpunodebind=<node> --membind=<node>  (or taskset -c <cpus> without numactl) \
#     $SGLANG_PYTHON -m sglang.launch_server --model-path ... --port P ...
# detached with setsid, writing $RUN_DIR/servers/server-PORT.log and server-PORT.pid. The script
# then waits until every server answers GET /health with 200 (HEALTH_TIMEOUT, default 1200 s,
# polled every HEALTH_INTERVAL, default 5 s) and reports any that did not, with the end of its
# log. A server whose process exits is reported at once. Stop the fleet with run/stop_sglang.sh.
#
# Examples:
#   run/launch_sglang.sh --dry-run                  # 8 x TP1 on ports 30000-30007
#   run/launch_sglang.sh --tp 4                     # 2 x TP4: GPUs 0-3 and 4-7
#   GPUS=0-3 run/launch_sglang.sh --tp 2            # 2 x TP2 on GPUs 0-3 only (4-7 left for other work)
#   MODEL_PATH=/models/big run/launch_sglang.sh --tp 8 --base-port 31000
#
# Exit codes:
#   0  every server is healthy (or --dry-run printed the plan)
#   1  unexpected error
#   2  usage or configuration error (bad flag or value, sglang or model not found)
#   3  topology error: nvidia-smi missing, failing or unparseable, or too few GPUs for the plan
#   4  refused: a TP group spans NUMA nodes, or MAX_RUNNING_REQUESTS is too high (see --force)
#   5  a server of this fleet is already running, or one of its ports is in use
#   6  servers were started but not all became healthy (died or timed out); see the report
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(dirname -- "$SCRIPT_DIR")
readonly SCRIPT_DIR REPO_ROOT

readonly MAX_RUNNING_REQUESTS_LIMIT=2048
readonly LOG_TAIL_LINES=25
readonly CONFIG_KEYS=(MODEL_PATH SERVED_MODEL_NAME CONTEXT_LENGTH MEM_FRACTION MAX_RUNNING_REQUESTS
  TP NUM_SERVERS BASE_PORT HOST EXTRA_ARGS RUN_DIR HEALTH_TIMEOUT SGLANG_PYTHON PIN_WITH GPUS)

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
log() { printf '%s\n' "$*" >&2; }
warn() { printf 'warning: %s\n' "$*" >&2; }
die() {
  local code=$1
  shift
  printf 'error: %s\n' "$*" >&2
  exit "$code"
}
is_uint() { [[ $1 =~ ^(0|[1-9][0-9]*)$ ]]; }
# require_int NAME MIN [MAX]: the variable NAME holds an integer in range, else exit 2.
require_int() {
  local name=$1 min=$2 max=${3:-} value=${!1}
  if ! is_uint "$value" || ((value < min)) || { [[ -n $max ]] && ((value > max)); }; then
    die 2 "$name must be an integer >= $min${max:+ and <= $max}, got '$value'"
  fi
}

# Shell-quote words only where needed, so printed commands stay readable and paste-able.
quote_cmd() {
  local out=() word
  for word in "$@"; do
    if [[ $word =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then out+=("$word"); else out+=("'${word//\'/\'\\\'\'}'"); fi
  done
  printf '%s' "${out[*]}"
}

# Process is alive and not a zombie.
is_alive() {
  local stat
  stat=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  [[ -n $stat && $stat != Z* ]]
}

# --- arguments ---------------------------------------------------------------------------------

config_file="$SCRIPT_DIR/fleet.env"
opt_tp="" opt_num_servers="" opt_base_port="" opt_gpus="" dry_run=0 force=0
need_value() { [[ $# -ge 2 && -n $2 ]] || die 2 "$1 needs a value (see --help)"; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --config) need_value "$@"; config_file=$2; [[ $config_file == */* ]] || config_file=./$config_file; shift 2 ;;
    --gpus) need_value "$@"; opt_gpus=$2; shift 2 ;;
    --tp) need_value "$@"; opt_tp=$2; shift 2 ;;
    --num-servers) need_value "$@"; opt_num_servers=$2; shift 2 ;;
    --base-port) need_value "$@"; opt_base_port=$2; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    --force) force=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die 2 "unknown argument: $1" ;;
  esac
done

# --- configuration: flag > environment > config file > default ----------------------------------

[[ -f $config_file ]] || die 2 "config file not found: $config_file"
declare -A from_env=()
for key in "${CONFIG_KEYS[@]}"; do
  if [[ -n ${!key+x} ]]; then from_env[$key]=${!key}; fi
done
# shellcheck source=/dev/null
source "$config_file"
for key in "${!from_env[@]}"; do printf -v "$key" '%s' "${from_env[$key]}"; done

MODEL_PATH=${MODEL_PATH:-}
SERVED_MODEL_NAME=${SERVED_MODEL_NAME:-}
CONTEXT_LENGTH=${CONTEXT_LENGTH:-}
MEM_FRACTION=${MEM_FRACTION:-}
MAX_RUNNING_REQUESTS=${MAX_RUNNING_REQUESTS:-}
TP=${opt_tp:-${TP:-1}}
NUM_SERVERS=${opt_num_servers:-${NUM_SERVERS:-auto}}
BASE_PORT=${opt_base_port:-${BASE_PORT:-30000}}
HOST=${HOST:-127.0.0.1}
EXTRA_ARGS=${EXTRA_ARGS:-}
RUN_DIR=${RUN_DIR:-runs/sglang}
HEALTH_TIMEOUT=${HEALTH_TIMEOUT:-1200}
HEALTH_INTERVAL=${HEALTH_INTERVAL:-5}
SGLANG_PYTHON=${SGLANG_PYTHON:-python}
PIN_WITH=${PIN_WITH:-auto}
GPUS=${opt_gpus:-${GPUS:-all}}

[[ -n $MODEL_PATH ]] || die 2 "MODEL_PATH is empty: set it in $config_file or the environment"
require_int TP 1
[[ $NUM_SERVERS == auto ]] || require_int NUM_SERVERS 1
require_int BASE_PORT 1 65535
require_int HEALTH_TIMEOUT 0
[[ $HEALTH_INTERVAL =~ ^[0-9]*\.?[0-9]+$ && ! $HEALTH_INTERVAL =~ ^[0.]+$ ]] \
  || die 2 "HEALTH_INTERVAL must be a positive number of seconds, got '$HEALTH_INTERVAL'"
[[ -z $CONTEXT_LENGTH ]] || require_int CONTEXT_LENGTH 1
[[ -z $MEM_FRACTION || $MEM_FRACTION =~ ^0?\.[0-9]*[1-9][0-9]*$ ]] \
  || die 2 "MEM_FRACTION must be a number strictly between 0 and 1 (e.g. 0.85), got '$MEM_FRACTION'"
[[ $PIN_WITH =~ ^(auto|numactl|taskset|none)$ ]] \
  || die 2 "PIN_WITH must be auto, numactl, taskset or none, got '$PIN_WITH'"
if [[ -n $MAX_RUNNING_REQUESTS ]]; then
  require_int MAX_RUNNING_REQUESTS 1
  if ((MAX_RUNNING_REQUESTS > MAX_RUNNING_REQUESTS_LIMIT)); then
    msg="MAX_RUNNING_REQUESTS=$MAX_RUNNING_REQUESTS per server is above $MAX_RUNNING_REQUESTS_LIMIT"
    msg+=": the KV cache cannot hold that many sequences, so the server only thrashes"
    ((force)) || die 4 "$msg. Lower it, leave it empty to let SGLang size it, or pass --force."
    warn "$msg (--force given, continuing)"
  fi
fi
read -r -a extra_args <<<"$EXTRA_ARGS"
[[ $RUN_DIR == /* ]] || RUN_DIR="$REPO_ROOT/$RUN_DIR"
servers_dir="$RUN_DIR/servers"

# --- topology ----------------------------------------------------------------------------------

# Prints "INDEX CPU_AFFINITY NUMA_AFFINITY" per GPU row of `nvidia-smi topo -m` (tab-separated
# matrix; the header row starts with a tab so its columns line up with the GPU rows' fields).
# Missing or empty affinity columns come out as N/A.
parse_topology() {
  awk -F'\t' '
    function trim(s) { gsub(/^[ \t]+|[ \t]+$/, "", s); return s }
    !header && /CPU Affinity/ {
      for (i = 1; i <= NF; i++) {
        f = trim($i)
        if (f == "CPU Affinity") cpu_col = i
        if (f == "NUMA Affinity") numa_col = i
      }
      header = 1
      next
    }
    header && trim($1) ~ /^GPU[0-9]+$/ {
      cpus = cpu_col ? trim($cpu_col) : ""
      node = numa_col ? trim($numa_col) : ""
      if (cpus == "") cpus = "N/A"
      if (node == "") node = "N/A"
      print substr(trim($1), 4), cpus, node
    }
    /^Legend/ { exit }
    END { if (!cpu_col) exit 1 }
  '
}

command -v nvidia-smi >/dev/null || die 3 "nvidia-smi not found on PATH: is this a GPU node with the NVIDIA driver?"
topo_out=$(nvidia-smi topo -m 2>&1) || die 3 "'nvidia-smi topo -m' failed: $topo_out"
topo_rows=$(parse_topology <<<"$topo_out") \
  || die 3 "could not find the 'CPU Affinity' column in the tab-separated output of 'nvidia-smi topo -m':
$topo_out"
declare -a gpu_cpus=() gpu_node=()
while read -r idx cpus node; do
  [[ -n ${idx:-} ]] || continue
  gpu_cpus[idx]=$cpus
  gpu_node[idx]=$node
done <<<"$topo_rows"
gpu_count=${#gpu_cpus[@]}
((gpu_count > 0)) || die 3 "'nvidia-smi topo -m' lists no GPU rows:
$topo_out"
for ((g = 0; g < gpu_count; g++)); do
  [[ -n ${gpu_cpus[g]+x} ]] || die 3 "'nvidia-smi topo -m' GPU indices are not 0..$((gpu_count - 1)) (GPU$g missing)"
done

# --- plan --------------------------------------------------------------------------------------

# The GPUs named by GPUS ("all", or a list like 0-3 or 0,1,4-5), in index order, into `chosen`.
declare -a chosen=()
if [[ $GPUS == all ]]; then
  for ((g = 0; g < gpu_count; g++)); do chosen+=("$g"); done
else
  IFS=, read -r -a gpu_parts <<<"$GPUS"
  for part in "${gpu_parts[@]}"; do
    if [[ $part =~ ^([0-9]+)-([0-9]+)$ ]] && ((10#${BASH_REMATCH[1]} <= 10#${BASH_REMATCH[2]})); then
      for ((g = 10#${BASH_REMATCH[1]}; g <= 10#${BASH_REMATCH[2]}; g++)); do chosen+=("$g"); done
    elif [[ $part =~ ^[0-9]+$ ]]; then
      chosen+=("$((10#$part))")
    else
      die 2 "GPUS must be all or a list of GPU indices like 0-3 or 0,1,4-5, got '$GPUS'"
    fi
  done
  mapfile -t chosen < <(printf '%s\n' "${chosen[@]}" | sort -n)
  [[ -z $(printf '%s\n' "${chosen[@]}" | uniq -d) ]] || die 2 "GPUS lists a GPU twice: '$GPUS'"
  for g in "${chosen[@]}"; do
    ((g < gpu_count)) || die 3 "GPUS=$GPUS names GPU$g, but nvidia-smi lists GPU0-GPU$((gpu_count - 1))"
  done
fi
n_chosen=${#chosen[@]}
of_gpus="$n_chosen GPU(s)" only_gpus="nvidia-smi lists only $n_chosen"
[[ $GPUS == all ]] || of_gpus+=" of GPUS=$GPUS" only_gpus="GPUS=$GPUS selects only $n_chosen"

declare -A per_node=()  # NUMA node -> number of the chosen GPUs on it
for g in "${chosen[@]}"; do per_node[${gpu_node[g]}]=$((${per_node[${gpu_node[g]}]:-0} + 1)); done
# The order servers take GPUs in: node by node for TP > 1 (a group then stays on one node when it can).
declare -a order=("${chosen[@]}")
if ((TP > 1)); then
  mapfile -t order < <(for g in "${chosen[@]}"; do printf '%s %s\n' "${gpu_node[g]}" "$g"; done | sort -k1,1V -k2,2n | cut -d' ' -f2)
fi

if [[ $NUM_SERVERS == auto ]]; then
  NUM_SERVERS=$((n_chosen / TP))
  ((NUM_SERVERS >= 1)) || die 3 "TP=$TP needs $TP GPUs but $only_gpus"
fi
if ((NUM_SERVERS * TP > n_chosen)); then
  die 3 "$NUM_SERVERS servers x TP $TP need $((NUM_SERVERS * TP)) GPUs but $only_gpus" \
    "(with --tp, set NUM_SERVERS=auto or pass --num-servers)"
fi
if ((BASE_PORT + NUM_SERVERS - 1 > 65535)); then
  die 2 "ports $BASE_PORT..$((BASE_PORT + NUM_SERVERS - 1)) go past 65535"
fi
if ((NUM_SERVERS * TP < n_chosen)); then
  idle=("${order[@]:NUM_SERVERS * TP}")
  if ((${#idle[@]} == 1)); then idle_text="GPU${idle[0]} stays"; else idle_text="GPUs $(IFS=,; echo "${idle[*]}") stay"; fi
  warn "$idle_text idle ($NUM_SERVERS server(s) x TP $TP of $of_gpus)"
fi
if [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
  warn "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES is set in the environment; each server gets its own instead"
fi

have_numactl=0 have_taskset=0
command -v numactl >/dev/null && have_numactl=1
command -v taskset >/dev/null && have_taskset=1
if [[ $PIN_WITH == numactl ]] && ((!have_numactl)); then die 2 "PIN_WITH=numactl but numactl is not installed"; fi
if [[ $PIN_WITH == taskset ]] && ((!have_taskset)); then die 2 "PIN_WITH=taskset but taskset is not installed"; fi

# Per server: GPUs, ports, NUMA nodes, CPUs, pinning prefix, environment, full command.
declare -a s_port=() s_gpus=() s_nodes=() s_cpus=() s_pin=() s_pinlabel=() s_crosses=()
crossing_msgs=()
unknown_numa=0 unbound_memory=0
for ((s = 0; s < NUM_SERVERS; s++)); do
  gpus=() nodes=() cpus=() where=""
  for g in "${order[@]:s * TP:TP}"; do
    gpus+=("$g")
    [[ " ${nodes[*]} " == *" ${gpu_node[g]} "* ]] || nodes+=("${gpu_node[g]}")
    [[ " ${cpus[*]} " == *" ${gpu_cpus[g]} "* ]] || cpus+=("${gpu_cpus[g]}")
    where+="${where:+, }GPU$g on node ${gpu_node[g]}"
  done
  node_list=$(IFS=,; echo "${nodes[*]}")
  cpu_list=$(IFS=,; echo "${cpus[*]}")
  s_port[s]=$((BASE_PORT + s))
  s_gpus[s]=$(IFS=,; echo "${gpus[*]}")
  s_nodes[s]=$node_list
  s_cpus[s]=$cpu_list
  s_crosses[s]=0
  numa_known=1 cpus_known=1
  if [[ ",$node_list," == *,N/A,* ]]; then numa_known=0 unknown_numa=1; fi
  if [[ ",$cpu_list," == *,N/A,* ]]; then cpus_known=0; fi
  if ((numa_known && ${#nodes[@]} > 1)); then
    # A group made of whole NUMA nodes (TP 8 on 2 x 4 GPUs) has no better placement: allowed.
    whole_nodes=1
    for n in "${nodes[@]}"; do
      on_node=0
      for g in "${gpus[@]}"; do [[ ${gpu_node[g]} != "$n" ]] || on_node=$((on_node + 1)); done
      ((on_node == per_node[$n])) || whole_nodes=0
    done
    if ((whole_nodes)); then
      log "note: server $s uses all GPUs of NUMA nodes $node_list; it is pinned to all of them"
    else
      s_crosses[s]=1
      crossing_msgs+=("server $s (port ${s_port[s]}) would use GPUs ${s_gpus[s]}, which span NUMA nodes $node_list ($where)")
    fi
  fi

  method=none
  case $PIN_WITH in
    auto)
      if ((have_numactl && numa_known)); then method=numactl
      elif ((have_taskset && cpus_known)); then method=taskset; fi ;;
    numactl) if ((numa_known)); then method=numactl; elif ((cpus_known && have_taskset)); then method=taskset; fi ;;
    taskset) if ((cpus_known)); then method=taskset; fi ;;
  esac
  case $method in
    numactl) s_pin[s]="numactl --cpunodebind=$node_list --membind=$node_list"; s_pinlabel[s]="numactl" ;;
    taskset) s_pin[s]="taskset -c $cpu_list"; s_pinlabel[s]="taskset" ;;
    none) s_pin[s]=""; s_pinlabel[s]="none" ;;
  esac
  if [[ $method == none && $PIN_WITH != none ]]; then
    warn "server $s: no NUMA/CPU affinity to pin to (nvidia-smi reports N/A, or no numactl/taskset); running unpinned"
  fi
  if [[ $method == taskset ]] && ((numa_known && !have_numactl)); then unbound_memory=1; fi
done
if ((unknown_numa)); then
  warn "nvidia-smi reports no NUMA affinity for some GPUs: cannot check that TP groups stay on one node"
fi
if ((unbound_memory)); then
  warn "numactl is not installed: pinning CPUs with taskset only, so the servers' memory is not bound to" \
    "their GPUs' NUMA node (install numactl, e.g. 'apt-get install numactl', to bind both)"
fi

# The launch_server command of server $1, into the global array `cmd` (without environment).
build_cmd() {
  local s=$1
  cmd=()
  if [[ -n ${s_pin[s]} ]]; then read -r -a cmd <<<"${s_pin[s]}"; fi
  cmd+=("$SGLANG_PYTHON" -m sglang.launch_server --model-path "$MODEL_PATH"
    --port "${s_port[s]}" --host "$HOST" --tp "$TP")
  if [[ -n $SERVED_MODEL_NAME ]]; then cmd+=(--served-model-name "$SERVED_MODEL_NAME"); fi
  if [[ -n $CONTEXT_LENGTH ]]; then cmd+=(--context-length "$CONTEXT_LENGTH"); fi
  if [[ -n $MEM_FRACTION ]]; then cmd+=(--mem-fraction-static "$MEM_FRACTION"); fi
  if [[ -n $MAX_RUNNING_REQUESTS ]]; then cmd+=(--max-running-requests "$MAX_RUNNING_REQUESTS"); fi
  cmd+=("${extra_args[@]}")
}
server_env() { echo "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=${s_gpus[$1]}"; }
log_file() { echo "$servers_dir/server-${s_port[$1]}.log"; }
pid_file() { echo "$servers_dir/server-${s_port[$1]}.pid"; }

print_plan() {
  local s node_col
  printf 'GPU/NUMA plan: %d server(s) x TP %d on %s, model %s\n' \
    "$NUM_SERVERS" "$TP" "$of_gpus" "$MODEL_PATH"
  printf '%-7s %-6s %-16s %-12s %-24s %s\n' SERVER PORT GPUS NUMA_NODE CPUS PINNING
  for ((s = 0; s < NUM_SERVERS; s++)); do
    node_col=${s_nodes[s]}
    if ((s_crosses[s])); then node_col+=" CROSSES!"; fi
    printf '%-7s %-6s %-16s %-12s %-24s %s\n' \
      "$s" "${s_port[s]}" "${s_gpus[s]}" "$node_col" "${s_cpus[s]}" "${s_pinlabel[s]}"
  done
}

print_plan
if ((${#crossing_msgs[@]})); then
  for m in "${crossing_msgs[@]}"; do log "  $m"; done
  hint="A group split across NUMA nodes cannot be pinned to one node's CPUs and memory, so its"
  hint+=" host-side traffic (and, without NVLink, its GPU-to-GPU traffic) crosses the inter-socket link."
  # Suggest the TPs that fit when every node has the same number of GPUs.
  counts=$(printf '%s\n' "${per_node[@]}" | sort -u)
  if [[ $counts != *$'\n'* ]]; then
    fits=()
    # GPUs are taken node by node, so a TP dividing the per-node count, or a multiple of it that
    # divides the total (whole nodes), never crosses: exactly the TPs to suggest.
    for ((d = 1; d <= n_chosen; d++)); do
      if ((counts % d == 0 || (d % counts == 0 && n_chosen % d == 0))); then fits+=("$d"); fi
    done
    hint+=" Each NUMA node here has $counts of the GPUs, so use --tp $(IFS=/; echo "${fits[*]}"), or pass --force."
  else
    hint+=" Use a TP that keeps each group on one node, or pass --force."
  fi
  ((force)) || die 4 "refusing to start: a TP group spans NUMA nodes. $hint"
  warn "a TP group spans NUMA nodes (--force given): pinning it to all of its nodes"
fi

if ((dry_run)); then
  printf '\nCommands (dry run, nothing started; each would run detached with setsid, pid in server-PORT.pid):\n'
  for ((s = 0; s < NUM_SERVERS; s++)); do
    build_cmd "$s"
    printf '%s %s >> %s 2>&1\n' "$(server_env "$s")" "$(quote_cmd "${cmd[@]}")" "$(quote_cmd "$(log_file "$s")")"
  done
  exit 0
fi

# --- pre-flight --------------------------------------------------------------------------------

probe_host=$HOST
[[ $probe_host == 0.0.0.0 || $probe_host == "::" ]] && probe_host=127.0.0.1

# shellcheck disable=SC2016  # $1/$2 expand in the inner bash
port_in_use() { timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$probe_host" "$1" 2>/dev/null; }

command -v "$SGLANG_PYTHON" >/dev/null || die 2 "SGLANG_PYTHON=$SGLANG_PYTHON not found on PATH"
"$SGLANG_PYTHON" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("sglang") is None)' \
  || die 2 "sglang is not importable by $SGLANG_PYTHON (set SGLANG_PYTHON to the right interpreter)"
if [[ $MODEL_PATH == /* || $MODEL_PATH == .* ]] && [[ ! -e $MODEL_PATH ]]; then
  die 2 "MODEL_PATH=$MODEL_PATH does not exist"
fi

mkdir -p "$servers_dir"
for ((s = 0; s < NUM_SERVERS; s++)); do
  pf=$(pid_file "$s")
  if [[ -f $pf ]]; then
    old_pid=$(<"$pf")
    if is_uint "$old_pid" && is_alive "$old_pid"; then
      die 5 "server on port ${s_port[s]} is already running (pid $old_pid, $pf); stop the fleet first: run/stop_sglang.sh"
    fi
    log "removing stale pid file $pf (pid ${old_pid:-?} is not running)"
    rm -f -- "$pf"
  fi
  if port_in_use "${s_port[s]}"; then
    die 5 "port ${s_port[s]} on $probe_host is already in use by another process (see: ss -ltnp 'sport = :${s_port[s]}')"
  fi
done

# --- launch ------------------------------------------------------------------------------------

# setsid: each server leads its own process group (stop_sglang.sh stops its workers with it),
# and a Ctrl-C in this terminal does not reach it.
detach=(setsid)
if ! command -v setsid >/dev/null; then
  warn "setsid not found: servers stay in this terminal's process group (Ctrl-C would stop them)"
  detach=()
fi
declare -a s_pid=()
for ((s = 0; s < NUM_SERVERS; s++)); do
  build_cmd "$s"
  read -r -a env_words <<<"$(server_env "$s")"
  lf=$(log_file "$s")
  {
    printf '# %s: started by run/launch_sglang.sh\n' "$(date '+%Y-%m-%d %H:%M:%S')"
    printf '# %s %s\n' "${env_words[*]}" "$(quote_cmd "${cmd[@]}")"
  } >"$lf"
  "${detach[@]}" env "${env_words[@]}" "${cmd[@]}" >>"$lf" 2>&1 </dev/null &
  s_pid[s]=$!
  echo "${s_pid[s]}" >"$(pid_file "$s")"
  log "started server $s: port ${s_port[s]}, GPUs ${s_gpus[s]}, pid ${s_pid[s]}, log $lf"
done

# --- wait for /health --------------------------------------------------------------------------

http_status() {
  local url=$1
  if command -v curl >/dev/null; then
    curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$url" || true
  else
    python3 - "$url" <<'EOF' || true
import sys, urllib.error, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=5).status, end="")
except urllib.error.HTTPError as e:
    print(e.code, end="")
except Exception:
    print("000", end="")
EOF
  fi
}

trap 'log ""; log "interrupted: the servers keep running; stop them with run/stop_sglang.sh"; exit 130' INT TERM

declare -a s_state=() s_last=()
for ((s = 0; s < NUM_SERVERS; s++)); do s_state[s]=pending; s_last[s]="no answer"; done
log "waiting up to ${HEALTH_TIMEOUT}s for GET /health on $NUM_SERVERS server(s)..."
start=$SECONDS
next_progress=$((start + 30))
while :; do
  pending=0 healthy=0
  for ((s = 0; s < NUM_SERVERS; s++)); do
    [[ ${s_state[s]} == pending ]] || { [[ ${s_state[s]} == healthy* ]] && healthy=$((healthy + 1)); continue; }
    code=$(http_status "http://$probe_host:${s_port[s]}/health")
    if [[ $code == 200 ]]; then
      s_state[s]="healthy after $((SECONDS - start))s"
      healthy=$((healthy + 1))
      log "server $s (port ${s_port[s]}) is healthy after $((SECONDS - start))s"
    elif ! is_alive "${s_pid[s]}"; then
      s_state[s]="DIED"
      log "server $s (port ${s_port[s]}) exited before becoming healthy"
    else
      [[ $code == 000 ]] || s_last[s]="HTTP $code"
      pending=$((pending + 1))
    fi
  done
  ((pending > 0)) || break
  if ((SECONDS - start >= HEALTH_TIMEOUT)); then
    for ((s = 0; s < NUM_SERVERS; s++)); do
      [[ ${s_state[s]} == pending ]] && s_state[s]="NOT HEALTHY after ${HEALTH_TIMEOUT}s (${s_last[s]})"
    done
    break
  fi
  if ((SECONDS >= next_progress)); then
    log "  $healthy/$NUM_SERVERS healthy, $pending still loading ($((SECONDS - start))s elapsed)"
    next_progress=$((SECONDS + 30))
  fi
  sleep "$HEALTH_INTERVAL"
done
trap - INT TERM

# --- report ------------------------------------------------------------------------------------

printf '\nFleet report:\n'
printf '%-7s %-6s %-16s %-8s %s\n' SERVER PORT GPUS PID STATUS
failed=()
for ((s = 0; s < NUM_SERVERS; s++)); do
  printf '%-7s %-6s %-16s %-8s %s\n' "$s" "${s_port[s]}" "${s_gpus[s]}" "${s_pid[s]}" "${s_state[s]}"
  [[ ${s_state[s]} == healthy* ]] || failed+=("$s")
done
if ((${#failed[@]} == 0)); then
  printf 'All %d server(s) healthy: http://%s:%d-%d  (stop with run/stop_sglang.sh)\n' \
    "$NUM_SERVERS" "$probe_host" "$BASE_PORT" "$((BASE_PORT + NUM_SERVERS - 1))"
  exit 0
fi
for s in "${failed[@]}"; do
  lf=$(log_file "$s")
  printf '\n--- server %s (port %s, GPUs %s): %s; last %d lines of %s ---\n' \
    "$s" "${s_port[s]}" "${s_gpus[s]}" "${s_state[s]}" "$LOG_TAIL_LINES" "$lf"
  tail -n "$LOG_TAIL_LINES" -- "$lf" || true
done
printf '\n%d of %d server(s) did not come up. The others are still running; stop all with run/stop_sglang.sh\n' \
  "${#failed[@]}" "$NUM_SERVERS" >&2
exit 6
