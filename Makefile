# Two commands: `make run` and `make test`. Both bootstrap their own venv from Python 3.11.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: run test lint chart bench clean

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

# The whole suite; tests/deploy renders and lints helm/s3-gateway with Helm's own engine
# (helm-python-sdk) and checks the Dockerfile statically. The status-page tests need
# Debian's chromium (.ci/run installs it; locally they skip without it).
test: lint
	$(BIN)/pytest -q -ra $(PYTEST_ARGS)

# Just the deployment artefacts: chart lint + render checks, Dockerfile checks.
chart: $(STAMP)
	$(BIN)/pytest -q -ra tests/deploy

bench: $(STAMP)
	$(BIN)/python loadtest/ack_latency.py
	$(BIN)/python loadtest/bench.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) gateway-data .pytest_cache .mypy_cache .ruff_cache
