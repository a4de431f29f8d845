#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# A real SGLang server on CPU for the `realserver` tests, set up once into a cache:
#   ${GEN_PIPELINE_CACHE:-$HOME/.cache/gen-pipeline}/sglang/venv       sglang + torch (CPU), ~2.7 GB
#   ${GEN_PIPELINE_CACHE:-$HOME/.cache/gen-pipeline}/sglang/tiny-qwen3 a tiny random-weight Qwen3 model (~39 MB)
#                                                                      with the real Qwen3 tokenizer and template
# Usage: run/sglang/setup.sh TOKENIZER_DIR   -> prints the venv's python on stdout (progress on stderr)
# Nothing is done when both exist. sglang is installed with --no-deps: its declared dependencies pull CUDA
# packages a CPU machine cannot use; the runtime ones it imports are listed below, with torch pinned so that
# pip keeps the CPU build. The two compatibility pieces it needs on CPU live beside this script, in compat/
# (an sgl_kernel stand-in and the torchvision operator definitions); serve.py puts compat/ on the server's
# PYTHONPATH, and the one-line gen_pipeline_torchvision_ops.pth copied into the venv runs the latter's hook.
set -euo pipefail

SGLANG_VERSION=0.5.23
TORCH_VERSION=2.13.0
TOKENIZER="${1:?usage: run/sglang/setup.sh TOKENIZER_DIR}"
CACHE="${SGLANG_CACHE:-${GEN_PIPELINE_CACHE:-$HOME/.cache/gen-pipeline}/sglang}"
VENV="$CACHE/venv"
MODEL="$CACHE/tiny-qwen3"
PYTHON="${PYTHON:-python3}"
HERE="$(cd "$(dirname "$0")" && pwd)"
# What sglang imports at run time on the CPU text path (its own dependency list is CUDA-bound).
RUNTIME_DEPS=(
    numpy aiohttp fastapi "uvicorn>=0.51" uvloop orjson pydantic "transformers==5.19.0" "tokenizers==0.23.2"
    requests psutil "pyzmq>=25.1.2" setproctitle msgspec pybase64 python-multipart "prometheus-client>=0.20.0"
    partial_json_parser pillow einops tiktoken "sentencepiece==0.2.1" regex tqdm packaging interegular
    scipy watchfiles xxhash zstandard distro "openai==2.8.0" safetensors huggingface_hub
    "triton==3.9.0" ipython dill "apache-tvm-ffi==0.1.11" compressed-tensors gguf
    jsonschema xgrammar soundfile "torchvision==0.28.0"
)

LOG_PREFIX=sglang/setup
# shellcheck source=../lib/setup-prelude.sh
source "$HERE/../lib/setup-prelude.sh"

[[ -f "$TOKENIZER/tokenizer.json" ]] || die "no tokenizer.json in $TOKENIZER"
cache_lock .setup.lock

if [[ ! -f "$VENV/.installed" ]]; then
    log "installing sglang==$SGLANG_VERSION and torch==$TORCH_VERSION (CPU) into $VENV (4-5 minutes)"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
    "${pip[@]}" "torch==$TORCH_VERSION" >&2 || die "pip install torch failed"
    "${pip[@]}" --no-deps "sglang==$SGLANG_VERSION" >&2 || die "pip install sglang failed"
    "${pip[@]}" "torch==$TORCH_VERSION" "${RUNTIME_DEPS[@]}" >&2 || die "pip install of sglang's runtime deps failed"
    site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    cp "$HERE/gen_pipeline_torchvision_ops.pth" "$site/"
    PYTHONPATH="$HERE/compat" SGLANG_USE_CPU_ENGINE=1 "$VENV/bin/python" -c "import sglang.launch_server" >&2 \
        || die "sglang does not import"
    touch "$VENV/.installed"
fi

if [[ ! -f "$MODEL/config.json" ]]; then
    log "writing the tiny Qwen3 model into $MODEL"
    PYTHONPATH="$HERE/compat" "$VENV/bin/python" "$HERE/../vllm/make_tiny_model.py" "$TOKENIZER" "$MODEL.tmp" >&2
    rm -rf "$MODEL"
    mv "$MODEL.tmp" "$MODEL"
fi
echo "$VENV/bin/python"
