# shellcheck shell=bash
# The prelude shared by the scripts that set up the real test servers (run/llama/build.sh, run/vllm/setup.sh,
# run/sglang/setup.sh). Each sources it relative to its own directory, after setting:
#   LOG_PREFIX   the tag of its progress lines, e.g. "vllm/setup" -> "[vllm/setup] ..." on stderr
#   CACHE        the cache folder it fills
# Progress and errors go to stderr: stdout carries only the one path each script prints.

log() { printf '[%s] %s\n' "$LOG_PREFIX" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# cache_lock LOCKFILE [WAIT_MESSAGE]: create $CACHE and hold an exclusive lock on $CACHE/LOCKFILE (fd 9) until
# the script exits, so that parallel runs sharing a cache (e.g. CI jobs) set it up once: the second waits, then
# finds the result. WAIT_MESSAGE is logged when another run holds the lock. Without flock it does not lock.
cache_lock() {
    mkdir -p "$CACHE"
    exec 9>"$CACHE/$1"
    command -v flock >/dev/null 2>&1 || return 0
    flock -n 9 && return 0
    if [[ -n ${2:-} ]]; then
        log "$2"
    fi
    flock 9
}
