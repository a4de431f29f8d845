#!/usr/bin/env bash
# Nightly expansion: prepare tonight's new prompts, minus everything the dataset already holds, and
# generate them into the same dataset directory. See docs/how-to/nightly.md.
#
#   run/nightly.sh --source /data/incoming.parquet --dataset-dir /data/gen/nightly \
#       [--servers 127.0.0.1:30000-30007] [--tokenizer DIR] [--config FILE] [--log-dir DIR] [-- GENERATE_ARGS...]
#
# --config FILE: generate's settings in a TOML file (`generate --config`); the flags here win over it.
# Every flag has an environment twin (the flag wins): NIGHTLY_SOURCE (one source), NIGHTLY_DATASET_DIR,
# NIGHTLY_SERVERS, NIGHTLY_TOKENIZER, NIGHTLY_CONFIG, NIGHTLY_LOG_DIR (default DATASET_DIR/logs; empty: no
# log file), NIGHTLY_GENERATE_ARGS and NIGHTLY_PREPARE_ARGS (extra flags, split on spaces), NIGHTLY_DATE
# (YYYY-MM-DD, default today) and GEN_PIPELINE (the command, default the repo's .venv/bin/gen-pipeline).
#
# Layout under DATASET_DIR: completions.jsonl, failures.jsonl, manifest.json, summary.json (the run
# directory `generate` resumes), prompts/nightly-DATE.jsonl (+ .report.json from prepare, + .done once
# generated), logs/nightly-DATE.log. Each night's prompts file is prepared once; every prompts file
# without a .done marker is (re)generated in date order, so a night that failed is finished next time.
#
# Exit codes: 0 done, or nothing to do; 1 error (config, prepare, or generate's fleet/config error);
# 2 usage; 3 incomplete (transient failures remain; the next run retries them); 4 fleet outage timeout;
# 5 output write failure (disk); 75 another nightly run holds the lock; 130 interrupted.
set -euo pipefail

readonly EXIT_USAGE=2 EXIT_LOCKED=75
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

SOURCES=()
[[ -n ${NIGHTLY_SOURCE:-} ]] && SOURCES+=("$NIGHTLY_SOURCE")
DATASET_DIR=${NIGHTLY_DATASET_DIR:-}
SERVERS=${NIGHTLY_SERVERS:-}
TOKENIZER=${NIGHTLY_TOKENIZER:-}
CONFIG=${NIGHTLY_CONFIG:-}
LOG_DIR_SET=${NIGHTLY_LOG_DIR+set}
LOG_DIR=${NIGHTLY_LOG_DIR:-}
DATE=${NIGHTLY_DATE:-$(date +%F)}
read -r -a GENERATE_ARGS <<<"${NIGHTLY_GENERATE_ARGS:-}"
read -r -a PREPARE_ARGS <<<"${NIGHTLY_PREPARE_ARGS:-}"
if [[ -n ${GEN_PIPELINE:-} ]]; then
    read -r -a GP <<<"$GEN_PIPELINE"
elif [[ -x $REPO/.venv/bin/gen-pipeline ]]; then
    GP=("$REPO/.venv/bin/gen-pipeline")
else
    GP=(gen-pipeline)
fi

log() { printf '%s nightly: %s\n' "$(date '+%F %T')" "$*"; }

# TERM, INT and HUP go to the running child (prepare or generate), which stops cleanly (generate: exit
# 130, summary written); the script then reports and exits with the child's code. The child runs in a
# process group of its own, so a Ctrl-C reaches it once (from us), not twice (a second one exits at once).
# That group also keeps it out of a kill of ours, so the kernel kills it when this shell dies, even by
# kill -9 (setpriv's parent-death signal); and it never holds the nightly lock (fd 9), so a child that
# outlived us anyway could not keep the next night out. setpriv loses the signal if we die before it has
# set it; GEN_PIPELINE_SUPERVISOR_PID has gen-pipeline set it again and check that we are still there.
CHILD=""
DIE_WITH_US=()
if setpriv --help 2>/dev/null | grep -q -- --pdeathsig; then
    DIE_WITH_US=(setpriv --pdeathsig KILL --)
fi
# shellcheck disable=SC2317  # invoked by the traps below
forward() { [[ -z $CHILD ]] || kill -s "$1" "$CHILD" 2>/dev/null || true; }
for sig in TERM INT HUP; do
    # shellcheck disable=SC2064  # the signal name is meant to be expanded now
    trap "forward $sig" "$sig"
done

# Run "$@" as that child; its exit code is ours.
run_child() {
    local rc
    set -m
    GEN_PIPELINE_SUPERVISOR_PID=$$ "${DIE_WITH_US[@]}" "$@" 9>&- &
    CHILD=$!
    set +m
    # wait returns early when a trap ran; go on waiting while the child still runs
    while rc=0; wait "$CHILD" || rc=$?; kill -0 "$CHILD" 2>/dev/null; do :; done
    rc=0
    wait "$CHILD" || rc=$?  # its own status, also when a trap cut the last wait short
    CHILD=""
    return "$rc"
}
usage() { echo "nightly: $*" >&2; sed -n '5,6p' "${BASH_SOURCE[0]}" >&2; exit "$EXIT_USAGE"; }

parse_args() {
    local cli_sources=()
    while (($#)); do
        case $1 in
            --source) cli_sources+=("${2:?--source needs a value}"); shift 2 ;;
            --dataset-dir) DATASET_DIR=${2:?}; shift 2 ;;
            --servers) SERVERS=${2:?}; shift 2 ;;
            --tokenizer) TOKENIZER=${2:?}; shift 2 ;;
            --config) CONFIG=${2:?}; shift 2 ;;
            --log-dir) LOG_DIR=${2?}; LOG_DIR_SET="set"; shift 2 ;;
            --date) DATE=${2:?}; shift 2 ;;
            --) shift; GENERATE_ARGS+=("$@"); break ;;
            -h|--help) sed -n '2,21p' "${BASH_SOURCE[0]}"; exit 0 ;;
            *) usage "unknown argument $1" ;;
        esac
    done
    ((${#cli_sources[@]})) && SOURCES=("${cli_sources[@]}")
    ((${#SOURCES[@]})) || usage "no source: give --source or NIGHTLY_SOURCE"
    [[ -n $DATASET_DIR ]] || usage "no dataset dir: give --dataset-dir or NIGHTLY_DATASET_DIR"
    [[ $DATE =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}$ ]] || usage "bad date $DATE (want YYYY-MM-DD)"
    [[ -n $LOG_DIR_SET ]] || LOG_DIR=$DATASET_DIR/logs
    PROMPTS=$DATASET_DIR/prompts
    [[ -n $SERVERS ]] && GENERATE_ARGS=(--servers "$SERVERS" "${GENERATE_ARGS[@]}")
    [[ -n $TOKENIZER ]] && GENERATE_ARGS=(--tokenizer "$TOKENIZER" "${GENERATE_ARGS[@]}")
    [[ -n $CONFIG ]] && GENERATE_ARGS=(--config "$CONFIG" "${GENERATE_ARGS[@]}")
    return 0
}

# Everything after this line also goes to LOG_DIR/nightly-DATE.log.
start_log() {
    [[ -n $LOG_DIR ]] || return 0
    mkdir -p "$LOG_DIR"
    # tee ignores the stop signals (systemd sends them to the whole unit): the summary still reaches the log
    exec > >(trap '' TERM INT HUP; exec tee -a "$LOG_DIR/nightly-$DATE.log") 2>&1
}

# One nightly run per dataset directory; the kernel drops the lock if this shell dies.
take_lock() {
    exec 9>"$DATASET_DIR/.nightly.lock"
    if ! flock -n 9; then
        log "another nightly run holds $DATASET_DIR/.nightly.lock; exiting $EXIT_LOCKED"
        exit "$EXIT_LOCKED"
    fi
}

# Tonight's prompts: the sources minus every earlier prompts file and every finished completion.
prepare_tonight() {
    local tonight=$PROMPTS/nightly-$DATE.jsonl inputs=() src rc=0
    if [[ -e $tonight ]]; then
        log "prompts for $DATE already prepared: $tonight"
        return 0
    fi
    for src in "${SOURCES[@]}"; do inputs+=(--input "$src"); done
    log "prepare ${SOURCES[*]} -> $tonight"
    run_child "${GP[@]}" prepare "${inputs[@]}" --out "$tonight" --exclude "$DATASET_DIR" \
        --exclude "$PROMPTS" --report "$PROMPTS/nightly-$DATE.report.json" \
        "${PREPARE_ARGS[@]}" || rc=$?
    if ((rc)); then
        log "prepare failed (exit $rc)"
        exit "$rc"
    fi
}

# Generate every prompts file not yet marked done, oldest first, into RESULT (the exit code):
# 3 (incomplete) moves on to the next file and is reported at the end; any other failure stops.
generate_pending() {
    local f rc pending=0
    RESULT=0
    for f in "$PROMPTS"/nightly-*.jsonl; do
        [[ -e $f && ! -e $f.done ]] || continue
        pending=$((pending + 1))
        if [[ ! -s $f ]]; then
            log "$f has no new prompts"
            echo '{}' >"$f.done"
            continue
        fi
        log "generate $f -> $DATASET_DIR"
        rc=0
        run_child "${GP[@]}" generate --input "$f" --out "$DATASET_DIR" --append-input "${GENERATE_ARGS[@]}" || rc=$?
        case $rc in
            0) cp "$DATASET_DIR/summary.json" "$f.done" ;;
            3) log "$f is incomplete (transient failures); the next run retries it"; RESULT=3 ;;
            130) log "generate was stopped on $f (exit 130); the next run resumes it"; RESULT=130; return 0 ;;
            *) log "generate failed on $f (exit $rc)"; RESULT=$rc; return 0 ;;
        esac
    done
    ((pending)) || log "nothing to do: every prompts file is generated"
    return 0
}

summarize() {
    local rc=$1 done_rows=0 files
    # the single writer's file, an earlier version's worker files and a claimed-shard run's shard files
    shopt -s nullglob
    files=("$DATASET_DIR"/completions*.jsonl "$DATASET_DIR"/shards/*/completions.jsonl)
    shopt -u nullglob
    if ((${#files[@]})); then
        done_rows=$(cat "${files[@]}" | wc -l)
    fi
    log "$DATE: exit $rc; completions in $DATASET_DIR: $done_rows"
    if [[ -e $PROMPTS/nightly-$DATE.report.json ]]; then
        log "tonight's prepare report:"
        cat "$PROMPTS/nightly-$DATE.report.json"
    fi
}

main() {
    parse_args "$@"
    mkdir -p "$PROMPTS"
    start_log
    take_lock
    prepare_tonight
    generate_pending
    summarize "$RESULT"
    exit "$RESULT"
}

main "$@"
