# Tandem — two commands from a fresh clone: `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0
# On a CPU-only machine elsewhere, point pip at a CPU wheel index, e.g. TORCH_PIP_ARGS="--index-url URL".
TORCH_PIP_ARGS ?=
TEST_WORKERS ?= 2
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_NO_ADVISORY_WARNINGS := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup demo test lint bench clean

# Setup is stamped so repeated `make` calls are instant. Torch goes in first, as a CPU build on
# machines without an NVIDIA driver, so no later requirement can pull a multi-GB CUDA wheel.
# `make demo` needs only the core package; `make test` adds the dev extra (test tools, server, export).
$(VENV)/.core: pyproject.toml Makefile
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "torch==$(TORCH_VERSION)" $(TORCH_PIP_ARGS)
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.dev: $(VENV)/.core
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

setup: $(VENV)/.core

demo: setup
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/tandem demo

lint: $(VENV)/.dev
	$(BIN)/ruff check tandem tests bench
	$(BIN)/ruff format --check tandem tests bench
	$(BIN)/lint-imports

# Two workers, one torch thread each: on a 2-core machine more threads than cores thrash (10x slower).
test: lint
	OMP_NUM_THREADS=1 $(BIN)/pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --timeout 600 tests

bench: $(VENV)/.dev
	$(BIN)/pip install -q -e ".[dev,bench]"
	$(BIN)/python bench/grpo_vs_trl.py

clean:
	rm -rf $(VENV) runs .pytest_cache
