# The two commands: `make run` and `make test`. Both build .venv from pyproject.toml first.
# `make run` installs only what serving needs; `make test` adds the dev extra (linters, mypy,
# pytest, schemathesis...). Each has its own stamp, rebuilt when pyproject.toml changes.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
RUN_STAMP := $(VENV)/.installed-run
STAMP  := $(VENV)/.installed

.PHONY: run test check fast lint typecheck unit bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(RUN_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $(RUN_STAMP)

# the dev venv also holds the Python client (clients/python, with its pandas extra): its tests
# run against the app in tests/client. It holds everything `make run` installs too, so its
# stamp is `make run`'s as well (the README's walk-through test runs `make run` in the clone)
$(STAMP): pyproject.toml clients/python/pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]' -e 'clients/python[pandas]'
	touch $(STAMP) $(RUN_STAMP)

run: $(RUN_STAMP)
	$(BIN)/gatekeeper serve

lint: $(STAMP)
	$(BIN)/ruff check app tests bench clients/python
	$(BIN)/ruff format --check app tests bench clients/python
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy
	cd clients/python && ../../$(BIN)/mypy

# three test processes on the two cores: a test process waits much of its time (for PostgreSQL,
# a server it started, a child command), and a third one fills those gaps — the same 1,981
# service tests took 0.90-0.96 of -n 2's time on a quiet machine and 0.74-0.93 beside two
# CPU-bound processes (docs/benchmarks.md, "CI time, sixth part" and "CI time after the tenth
# session's merges"). One BLAS thread per test process: BLAS threads on top slow the suite
# down and inflate the CPU-time checks of the search's time limits.
# worksteal: a process that is done takes queued tests from the other one, which may be held
# for minutes by one long test (tests/conftest.py puts half of the slow tests first in each
# process's share)
# PYTHONDONTWRITEBYTECODE emptied: the suite starts hundreds of Python processes (gatekeeper
# commands, servers and their workers, spawned pools); where the environment sets it (this
# project's CI machine does) each of them compiled app/ from source again, and each pytest
# process re-ran pytest's assertion rewrite of its plugins (hypothesis, schemathesis...). The
# caches go to __pycache__ folders of the clone and of .venv, both ignored by git.
TEST_ENV := PYTHONDONTWRITEBYTECODE= OPENBLAS_NUM_THREADS=1
unit: $(STAMP)
	$(TEST_ENV) $(BIN)/pytest -n 3 --dist worksteal

test: lint typecheck unit

# the development loop: lint, types and the fast tests (every test not marked slow), in
# minutes; `make test` (the README's command and CI's) still runs everything
fast: $(STAMP)
	$(TEST_ENV) $(BIN)/pytest -n 3 --dist worksteal -m "not slow" -q

check: lint typecheck fast

bench: $(STAMP)
	$(BIN)/python bench/engine_bench.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
