#!/usr/bin/env bash
# Run `make generate` inside a named tmux session, so a lost SSH connection loses nothing.
#
# Usage: run/tmux_generate.sh [options] [--] [MAKE_ARGS...]
#
#   --session NAME     tmux session name (default: gen-pipeline)
#   --detach           start the session but do not attach to it
#   --dry-run          print the tmux commands; run nothing
#   -h, --help         show this help
#
# MAKE_ARGS go to `make generate` unchanged, e.g.
#   run/tmux_generate.sh INPUT=prompts/x.jsonl OUT=runs/x
#   run/tmux_generate.sh --session big INPUT=prompts/big.jsonl OUT=runs/big ARGS="--max-tokens 4096 --retry-failed all"
# To resume a run, run the same command again (generate skips what is done).
#
# If the session does not exist it is created in the repository root, `make generate MAKE_ARGS`
# is typed into its shell (which stays open afterwards, with the output and the exit status),
# and the script attaches to it. If it exists and its last job has ended (finished, failed or
# interrupted: its shell waits at the prompt), the new command is typed into that shell, which
# resumes the run, and the script attaches. If a job still runs there, nothing is started and the
# script attaches to it. Without MAKE_ARGS the script only (re-)attaches.
# Detach with Ctrl-b d; re-attach later with `tmux attach -t NAME` or by running this again.
# The job runs in tmux's login shell, whose environment is tmux's, not necessarily this shell's:
# pass settings as MAKE_ARGS (make generate uses .venv/bin directly, so PATH does not matter).
#
# Exit codes:
#   0  session started and/or attached (or --dry-run printed the commands)
#   1  tmux is not installed, or a tmux command failed
#   2  usage error
#   3  MAKE_ARGS were given but a job still runs in the session: nothing was started
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
# Shell-quote words only where needed, so printed commands stay readable and paste-able.
quote_cmd() {
  local out=() word
  for word in "$@"; do
    if [[ $word =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then out+=("$word"); else out+=("'${word//\'/\'\\\'\'}'"); fi
  done
  printf '%s' "${out[*]}"
}

session=gen-pipeline detach=0 dry_run=0
make_args=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --session)
      [[ $# -ge 2 && -n $2 ]] || die 2 "--session needs a name"
      session=$2
      shift 2
      ;;
    --detach) detach=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; make_args+=("$@"); break ;;
    -*) usage >&2; die 2 "unknown option: $1 (put make arguments after --)" ;;
    *) make_args+=("$1"); shift ;;
  esac
done
[[ $session =~ ^[A-Za-z0-9_-]+$ ]] || die 2 "session name may only use letters, digits, '_' and '-': '$session'"

have_tmux=1
command -v tmux >/dev/null || have_tmux=0
if ((!have_tmux && !dry_run)); then
  die 1 "tmux is not installed. Install it (e.g. 'sudo apt-get install tmux') or run 'make generate' directly
       under 'nohup ... &' so it survives a disconnect."
fi

# Run (or, with --dry-run, print) one tmux command.
run_tmux() {
  if ((dry_run)); then
    printf '%s\n' "$(quote_cmd tmux "$@")"
  else
    tmux "$@" || die 1 "tmux $1 failed"
  fi
}

target="=$session"  # '=' makes tmux match the session name exactly, not as a prefix
exists=0
if ((have_tmux)) && tmux has-session -t "$target" 2>/dev/null; then exists=1; fi
if ((!have_tmux)); then log "note: tmux is not installed here; printing the commands anyway"; fi

# Whether a job still runs in the session: its pane's shell has a child (the shell at its prompt has none).
job_running() {
  local shell_pid
  shell_pid=$(tmux display-message -p -t "$target:" '#{pane_pid}') || return 1
  pgrep -P "$shell_pid" >/dev/null
}

job=$(quote_cmd make generate "${make_args[@]}")
result=0
if ((exists)) && ((${#make_args[@]})) && job_running; then
  log "a job is still running in tmux session '$session': nothing was started; attaching to it
       (to start anew once it has ended, run this again; to end it: tmux kill-session -t $session)"
  result=3
elif ((exists)) && ((${#make_args[@]})); then
  run_tmux send-keys -t "$target:" "cd $(quote_cmd "$REPO_ROOT") && $job" Enter
  ((dry_run)) || log "its last job has ended: started '$job' in tmux session '$session' (it resumes the run)"
elif ((exists)); then
  log "tmux session '$session' already exists: re-attaching"
else
  run_tmux new-session -d -s "$session" -c "$REPO_ROOT"
  run_tmux send-keys -t "$target:" "$job" Enter
  ((dry_run)) || log "started '$job' in tmux session '$session' (in $REPO_ROOT)"
fi

log "re-attach at any time with: tmux attach -t $session   (detach: Ctrl-b d)"
if ((detach)); then
  exit "$result"
elif [[ -n ${TMUX:-} ]]; then
  run_tmux switch-client -t "$target"
elif [[ -t 0 && -t 1 ]] || ((dry_run)); then
  run_tmux attach-session -t "$target"
else
  log "not attaching: no terminal"
fi
exit "$result"
