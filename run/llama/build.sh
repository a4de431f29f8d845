#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Build llama.cpp's `llama-server` once, for integration tests, from the llama.cpp copy vendored in the
# llama-cpp-python sdist on PyPI (the only source reachable from CI), and keep the Qwen2/Qwen3 vocab GGUF
# (+ its .inp/.out test vectors), the real Qwen3 chat template and all of llama.cpp's chat templates next to it.
#
# Usage: run/llama/build.sh            -> prints the path of llama-server on stdout (progress goes to stderr)
#
# Cache layout (LLAMA_CACHE, default ${GEN_PIPELINE_CACHE:-$HOME/.cache/gen-pipeline}/llama):
#   bin/llama-server
#   models/ggml-vocab-qwen2.gguf{,.inp,.out}
#   models/Qwen-Qwen3-0.6B.jinja
#   models/templates/*.jinja            (every chat template of the sdist, for tests/test_template_parity.py)
#   llama_cpp_python-<ver>.tar.gz       (the sdist, kept so missing assets never need a rebuild or a download)
#   BUILD_INFO                          (version, cmake flags, build time)
# Nothing is done when all of these already exist. A cache with the binary but without some asset (one built
# by an older version of this script) gets the assets from the sdist, without rebuilding. A failed build
# leaves no binary behind.
#
# Environment:
#   GEN_PIPELINE_CACHE / LLAMA_CACHE    cache folder (see above)
#   LLAMA_SDIST      use this llama_cpp_python-<ver>.tar.gz instead of downloading it
#   LLAMA_JOBS       parallel compile jobs (default: nproc)
#   LLAMA_NATIVE     ON = -march=native; default OFF = portable x86-64 AVX2/FMA/F16C build (safe to cache across
#                    CI runners of the same architecture)
#   PYTHON           python with pip for `pip download` (default: python3)
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION=0.3.36
# sha256 of llama_cpp_python-0.3.36.tar.gz on PyPI (pip verifies it).
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e

CACHE="${LLAMA_CACHE:-${GEN_PIPELINE_CACHE:-$HOME/.cache/gen-pipeline}/llama}"
BIN="$CACHE/bin/llama-server"
MODELS="$CACHE/models"
ASSETS=(ggml-vocab-qwen2.gguf ggml-vocab-qwen2.gguf.inp ggml-vocab-qwen2.gguf.out templates/Qwen-Qwen3-0.6B.jinja)
PYTHON="${PYTHON:-python3}"
JOBS="${LLAMA_JOBS:-$(nproc 2>/dev/null || echo 2)}"
NATIVE="${LLAMA_NATIVE:-OFF}"

HERE="$(cd "$(dirname "$0")" && pwd)"
LOG_PREFIX=llama/build
# shellcheck source=../lib/setup-prelude.sh
source "$HERE/../lib/setup-prelude.sh"

TEMPLATES_DONE="$MODELS/templates/.complete"  # written after the last template is in place

complete() {
    [[ -x "$BIN" ]] || return 1
    [[ -f "$TEMPLATES_DONE" ]] || return 1
    local a
    for a in "${ASSETS[@]}"; do
        [[ -s "$MODELS/$(basename "$a")" ]] || return 1
    done
}

if complete; then
    echo "$BIN"
    exit 0
fi

# Serialise concurrent builds (e.g. parallel CI jobs sharing a cache); the second one waits, then finds the result.
cache_lock .build.lock "another build holds $CACHE/.build.lock; waiting"
if complete; then
    echo "$BIN"
    exit 0
fi

for tool in cmake c++ tar; do
    command -v "$tool" >/dev/null 2>&1 || die "'$tool' not found (need cmake, a C++17 compiler and tar)"
done
GENERATOR=()
if command -v ninja >/dev/null 2>&1; then
    GENERATOR=(-G Ninja)
fi

WORK="$CACHE/work"
rm -rf "$WORK"
mkdir -p "$WORK"
cleanup() { rm -rf "$WORK"; }
trap cleanup EXIT

# 1. the sdist
SDIST_NAME="llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
if [[ -n "${LLAMA_SDIST:-}" ]]; then
    [[ -f "$LLAMA_SDIST" ]] || die "LLAMA_SDIST=$LLAMA_SDIST does not exist"
    SDIST="$LLAMA_SDIST"
elif [[ -f "$CACHE/$SDIST_NAME" ]]; then
    SDIST="$CACHE/$SDIST_NAME"
else
    log "downloading llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION sdist (77 MB) with pip"
    printf 'llama-cpp-python==%s --hash=sha256:%s\n' "$LLAMA_CPP_PYTHON_VERSION" "$SDIST_SHA256" >"$WORK/req.txt"
    "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
        --require-hashes -r "$WORK/req.txt" -d "$WORK/dl" >&2 ||
        die "pip download of llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION failed"
    SDIST="$WORK/dl/$SDIST_NAME"
    [[ -f "$SDIST" ]] || die "pip did not produce $SDIST"
fi
if command -v sha256sum >/dev/null 2>&1; then
    echo "$SDIST_SHA256  $SDIST" | sha256sum --check --status || die "sha256 mismatch for $SDIST"
fi
if [[ "$SDIST" != "$CACHE/$SDIST_NAME" ]]; then
    cp "$SDIST" "$CACHE/.$SDIST_NAME.tmp"
    mv -f "$CACHE/.$SDIST_NAME.tmp" "$CACHE/$SDIST_NAME"
fi

# 2. extract only the vendored llama.cpp
log "extracting vendor/llama.cpp from $SDIST"
TOP="llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
tar -xzf "$SDIST" -C "$WORK" "$TOP/vendor/llama.cpp"
SRC="$WORK/$TOP/vendor/llama.cpp"
[[ -f "$SRC/CMakeLists.txt" ]] || die "no vendor/llama.cpp/CMakeLists.txt in $SDIST"

# 3. keep the vocab, its test vectors and the Qwen3 template
mkdir -p "$MODELS"
for a in "${ASSETS[@]}"; do
    [[ -s "$SRC/models/$a" ]] || die "sdist lacks models/$a"
    cp "$SRC/models/$a" "$MODELS/.$(basename "$a").tmp"
    mv -f "$MODELS/.$(basename "$a").tmp" "$MODELS/$(basename "$a")"
done
# every chat template, replaced as a whole
compgen -G "$SRC/models/templates/*.jinja" >/dev/null || die "sdist lacks models/templates/*.jinja"
rm -rf "$MODELS/.templates.tmp"
mkdir -p "$MODELS/.templates.tmp"
cp "$SRC"/models/templates/*.jinja "$MODELS/.templates.tmp/"
touch "$MODELS/.templates.tmp/.complete"
rm -rf "$MODELS/templates"
mv "$MODELS/.templates.tmp" "$MODELS/templates"
log "kept $(find "$MODELS/templates" -name '*.jinja' | wc -l) chat templates in $MODELS/templates"

# 4. build llama-server only (the UI flags stop it from downloading a web UI; no OpenSSL, no curl)
if [[ -x "$BIN" ]]; then
    log "llama-server already built; only the model assets were missing"
else
    CMAKE_FLAGS=(
        -DCMAKE_BUILD_TYPE=Release
        -DBUILD_SHARED_LIBS=OFF
        -DGGML_NATIVE="$NATIVE"
        -DLLAMA_BUILD_TESTS=OFF
        -DLLAMA_BUILD_EXAMPLES=OFF
        -DLLAMA_BUILD_UI=OFF
        -DLLAMA_USE_PREBUILT_UI=OFF
        -DLLAMA_OPENSSL=OFF
        -DLLAMA_CURL=OFF
    )
    log "configuring (${GENERATOR[*]:-default generator}; GGML_NATIVE=$NATIVE)"
    start=$(date +%s)
    cmake -S "$SRC" -B "$WORK/build" "${GENERATOR[@]}" "${CMAKE_FLAGS[@]}" >"$WORK/cmake.log" 2>&1 || {
        tail -n 40 "$WORK/cmake.log" >&2
        die "cmake configure failed"
    }
    log "building llama-server with $JOBS jobs (10-30 min on 2 cores; log $WORK/build.log)"
    cmake --build "$WORK/build" --target llama-server -j "$JOBS" >"$WORK/build.log" 2>&1 || {
        tail -n 60 "$WORK/build.log" >&2
        die "build failed"
    }
    secs=$(($(date +%s) - start))
    built="$WORK/build/bin/llama-server"
    [[ -x "$built" ]] || die "build finished but $built is missing"
    "$built" --version >&2 2>&1 || die "built llama-server does not run"
    mkdir -p "$CACHE/bin"
    cp "$built" "$BIN.tmp"
    mv -f "$BIN.tmp" "$BIN"
    {
        echo "llama-cpp-python sdist: $LLAMA_CPP_PYTHON_VERSION (sha256 $SDIST_SHA256)"
        echo "cmake flags: ${CMAKE_FLAGS[*]}"
        echo "build seconds: $secs (jobs $JOBS, $(nproc 2>/dev/null || echo '?') cpus)"
        echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m)"
    } >"$CACHE/BUILD_INFO"
    log "built in ${secs}s"
fi

complete || die "internal error: cache incomplete after build"
echo "$BIN"
