# Two commands: `make run` and `make test`. Both bootstrap their own venv from Python 3.11
# and install exact pins from requirements/*.txt (compiled from pyproject.toml's ranges by
# `make lock`), then the package itself without dependencies.
#   make run      the runtime + the embedded demo upstream (requirements/demo.txt): no test tools
#   make clients  the README's clients (boto3, the AWS CLI, s3fs) into the same venv
#   make test     everything the suite needs (requirements/test.txt); torch is the CPU wheel
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/pip install --quiet
PYTEST_ARGS ?=

.PHONY: run clients test lint chart bench lock clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip

# One stamp per lock: each is installed once, and again when its lock changes.
$(VENV)/.installed-%: requirements/%.txt | $(BIN)/python
	$(PIP) -r $<
	$(PIP) --no-deps -e .
	touch $@

run: $(VENV)/.installed-demo
	$(BIN)/gateway serve $(ARGS)

clients: $(VENV)/.installed-clients

lint: $(VENV)/.installed-test
	$(BIN)/ruff check gateway tests loadtest
	$(BIN)/ruff format --check gateway tests loadtest
	$(BIN)/mypy
	$(BIN)/lint-imports

# The whole suite; tests/deploy renders and lints helm/s3-gateway with Helm's own engine
# (helm-python-sdk) and checks the Dockerfile statically. The status-page tests need
# Debian's chromium (.ci/run installs it; locally they skip without it).
# Three workers (pytest-xdist) on 2 cores, a test file each at a time: the suite mostly
# waits on real gateway processes, sockets and leases, and two workers left a quarter of
# the cores idle (12.5 min against 14.5 for the same tree). TEST_WORKERS=0 runs it in this
# process, serially. The longest files go first (tests/conftest.py). Tests
# marked `exclusive` (they measure rates against the clock) run after, alone (exit 5: the
# selection held none).
TEST_WORKERS ?= 3
# Only the files that mark tests `exclusive` are collected again for the second pass
# (collecting all of tests/ to deselect the rest took 14 s); all of tests/ if none does.
EXCLUSIVE_FILES = $(shell grep -rlE "mark\.exclusive" tests --include="test_*.py")
test: lint
	$(BIN)/pytest -q -ra -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
	  -m "not exclusive" $(PYTEST_ARGS)
	$(BIN)/pytest -q -ra -m exclusive $(PYTEST_ARGS) $(EXCLUSIVE_FILES) || [ $$? -eq 5 ]

# Just the deployment artefacts: chart lint + render checks, Dockerfile checks.
chart: $(VENV)/.installed-test
	$(BIN)/pytest -q -ra tests/deploy

bench: $(VENV)/.installed-test
	$(BIN)/python loadtest/ack_latency.py
	$(BIN)/python loadtest/bench.py $(BENCH_ARGS)

# Re-pin requirements/*.txt after a change to pyproject.toml (pip-tools' pip-compile, in its
# own venv). Existing pins are kept unless UPGRADE=1. test.txt is compiled first and the
# others within it, so every lock agrees. torch resolves to the local CPU wheel.
LOCK_VENV := .venv-lock
COMPILE = CUSTOM_COMPILE_COMMAND="make lock" $(LOCK_VENV)/bin/pip-compile --quiet \
	--strip-extras --no-emit-index-url --no-emit-find-links $(if $(UPGRADE),--upgrade)
lock:
	test -x $(LOCK_VENV)/bin/pip-compile || \
	  ($(PYTHON) -m venv $(LOCK_VENV) && $(LOCK_VENV)/bin/pip install --quiet pip-tools==7.6.2)
	$(COMPILE) --extra demo --extra test --extra clients -o requirements/test.txt pyproject.toml
	$(COMPILE) -c requirements/test.txt -o requirements/serve.txt pyproject.toml
	$(COMPILE) --extra demo -c requirements/test.txt -o requirements/demo.txt pyproject.toml
	$(COMPILE) --extra clients -c requirements/test.txt -o requirements/clients.txt pyproject.toml

clean:
	rm -rf $(VENV) $(LOCK_VENV) gateway-data .pytest_cache .mypy_cache .ruff_cache
