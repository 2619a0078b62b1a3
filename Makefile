# Two commands: `make run` and `make test`. Both bootstrap their own venv from Python 3.11.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: run test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/gateway serve $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check gateway tests loadtest
	$(BIN)/ruff format --check gateway tests loadtest
	$(BIN)/mypy
	$(BIN)/lint-imports

test: lint
	$(BIN)/pytest -q -ra $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python loadtest/ack_latency.py
	$(BIN)/python loadtest/bench.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) gateway-data .pytest_cache .mypy_cache .ruff_cache
