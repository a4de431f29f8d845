#!/usr/bin/env bash
# Submit run/slurm/generate.sbatch: one array task per node over one run directory.
#
# Usage: run/slurm/submit.sh INPUT OUT [sbatch options]   e.g.
#   run/slurm/submit.sh prompts.jsonl /shared/runs/r1 --array=0-15 --gres=gpu:8 --partition=gpu --time=4:00:00
# Flags for generate go in GEN_ARGS (e.g. GEN_ARGS="--max-tokens 2048 --shards 512"); FLEET=simulate starts
# `gen-pipeline simulate` per task instead of SGLang (how the tests run it). OUT must be on a filesystem
# every node sees, with working flock (NFSv4, Lustre with flock, GPFS). The model is MODEL_PATH in
# run/fleet.env; the tasks run gen-pipeline from PATH (activate the venv first) or GEN_PIPELINE.
set -euo pipefail
if [ $# -lt 2 ]; then
    sed -n '2,9p' "$0" >&2
    exit 2
fi
if [ "${FLEET:-sglang}" = sglang ] && ! printf '%s\n' "$@" | grep -qE '^--(gres|gpus)'; then
    echo "submit.sh: no --gres or --gpus* option: on most clusters the task gets no GPU and SGLang cannot start" >&2
fi
INPUT=$(realpath "$1") OUT=$(realpath -m "$2")
shift 2
mkdir -p "$OUT/slurm"
GEN_SLURM_DIR=$(cd "$(dirname "$0")" && pwd)
GEN_SBATCH_ARGS=$(printf '%s\n' "$@")  # one a line: a task that cannot be requeued resubmits with them
export INPUT OUT GEN_SLURM_DIR GEN_SBATCH_ARGS
exec sbatch --export=ALL --output="$OUT/slurm/%A_%a.out" "$@" "$GEN_SLURM_DIR/generate.sbatch"
