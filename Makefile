# The two set-up commands of the README are `make run` and `make test`; each creates .venv when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP_FLAGS := --disable-pip-version-check -q
# Re-install only when the package metadata changes.
STAMP := $(VENV)/.installed-$(shell cksum setup.cfg | cut -d' ' -f1)
PYTEST_ARGS ?=
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: install run test test-slow test-all test-core-install lint format docs bench bench-full clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install $(PIP_FLAGS) --upgrade pip setuptools wheel

$(STAMP): $(VENV)/bin/python setup.cfg pyproject.toml
	$(PY) -m pip install $(PIP_FLAGS) -e ".[dev,data,docs,flower]"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

## The main job: FSGP on a real dataset across simulated clients (LocalRuntime), outputs under runs/.
run: $(STAMP)
	$(VENV)/bin/gpflow-fed fsgp --logdir runs/fsgp

## The default test suite (slow tests excluded), two workers. GPFLOW_FED_NO_SKIPS=1: a skipped test (e.g. an
## optional dependency missing) fails instead (tests/conftest.py).
test: $(STAMP)
	GPFLOW_FED_NO_SKIPS=1 $(PY) -m pytest -n 2 -m "not slow" $(PYTEST_ARGS)

## Only the slow tests (integration runs, large reproductions).
test-slow: $(STAMP)
	GPFLOW_FED_NO_SKIPS=1 $(PY) -m pytest -n 2 -m slow $(PYTEST_ARGS)

test-all: $(STAMP)
	GPFLOW_FED_NO_SKIPS=1 $(PY) -m pytest -n 2 $(PYTEST_ARGS)

## The core install, as a library user gets it: the package WITHOUT extras in a fresh venv ($(CORE_VENV), rebuilt
## each time; pip's cache makes reruns fast), then the README quickstart and `gpflow-fed fsgp --quick --dataset
## synthetic1` from outside the checkout, and the default dataset's one-line error naming the 'data' extra.
CORE_VENV ?= build/core-venv
test-core-install:
	rm -rf $(CORE_VENV)
	$(PYTHON) -m venv $(CORE_VENV)
	$(CORE_VENV)/bin/python -m pip install $(PIP_FLAGS) --upgrade pip setuptools wheel
	$(CORE_VENV)/bin/python -m pip install $(PIP_FLAGS) .
	mkdir -p $(CORE_VENV)/work
	cd $(CORE_VENV)/work && ../bin/python $(CURDIR)/.ci/readme_quickstart.py $(CURDIR)/README.md
	cd $(CORE_VENV)/work && ../bin/gpflow-fed fsgp --quick --dataset synthetic1 --no-progress --logdir runs
	cd $(CORE_VENV)/work && { ../bin/gpflow-fed fsgp --quick > no-data.txt 2>&1; test $$? -eq 2; }
	grep -q 'pip install "gpflow-fed\[data\]"' $(CORE_VENV)/work/no-data.txt
	test "$$(wc -l < $(CORE_VENV)/work/no-data.txt)" -eq 1

## Formatting and lint (ruff), then type checking of the package (mypy), both configured in pyproject.toml; CI
## runs it before the tests. `make format` fixes what ruff can.
lint: $(STAMP)
	$(VENV)/bin/ruff format --check
	$(VENV)/bin/ruff check
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff format
	$(VENV)/bin/ruff check --fix

docs: $(STAMP)
	$(VENV)/bin/sphinx-build -W --keep-going -b html docs docs/_build/html

bench: $(STAMP)  ## quick profile (≤ 30 min): every table of BENCHMARKS.md at reduced size
	$(PY) benchmarks/run_all.py --profile quick $(BENCH_ARGS)

bench-full: $(STAMP)  ## the protocols behind BENCHMARKS.md (hours on 2 cores)
	$(PY) benchmarks/run_all.py --profile full $(BENCH_ARGS)

clean:
	rm -rf docs/_build runs .pytest_cache $(CORE_VENV)
