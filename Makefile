# gen-pipeline: every target runs inside .venv, which `make install` creates.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
GP := $(BIN)/gen-pipeline

# make generate: the main job against the configured fleet.
INPUT ?= prompts/sample.jsonl
OUT ?= runs/default
SERVERS ?= 127.0.0.1:30000-30007
TOKENIZER ?=
ARGS ?=

# make demo: a simulated 8-server fleet on localhost (ports chosen away from a real fleet's 30000-30007).
DEMO_PORTS ?= 31000-31007
DEMO_OUT ?= runs/demo

.PHONY: install generate demo simulate test lint fmt check bench nightly clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

generate: install
	$(GP) generate --input $(INPUT) --out $(OUT) --servers $(SERVERS) \
		$(if $(TOKENIZER),--tokenizer $(TOKENIZER)) $(ARGS)

demo: install
	bash run/demo.sh $(DEMO_PORTS) $(DEMO_OUT)

simulate: install
	$(GP) simulate --ports $(DEMO_PORTS) $(ARGS)

test: install
	$(BIN)/python -m pytest $(ARGS)

lint: install
	$(BIN)/ruff check gen_pipeline tests
	$(BIN)/ruff format --check gen_pipeline tests

fmt: install
	$(BIN)/ruff check --fix gen_pipeline tests
	$(BIN)/ruff format gen_pipeline tests

check: lint test

nightly: install
	bash run/nightly.sh $(ARGS)

bench: install
	$(BIN)/python bench/balance.py

clean:
	rm -rf $(VENV) runs .pytest_cache
