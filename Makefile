# Two commands on a fresh machine: `make run` starts a node on the embedded store; `make test` passes the suite.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
ARGS ?=

.PHONY: run test install dev lint typecheck bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q -e .

dev: $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'

run: install
	$(BIN)/tidewire serve $(ARGS)

test: dev
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest -q $(ARGS)

lint: dev
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: dev
	$(BIN)/python -m loadtest.bench all

clean:
	rm -rf $(VENV) data .pytest_cache .mypy_cache .ruff_cache
