# Two commands on a fresh machine: `make demo` and `make test`.
# Each creates .venv and installs what it needs.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev

.PHONY: demo test lint typecheck bench fixtures clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/zephon demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples

typecheck: $(STAMP)
	$(BIN)/mypy src

bench: $(STAMP)
	$(BIN)/python benchmarks/storage_throughput.py
	$(BIN)/python benchmarks/discovery.py
	$(BIN)/python benchmarks/planner.py
	$(BIN)/python benchmarks/pipeline.py
	$(BIN)/python benchmarks/tokenize_pack.py

# MDS and LitData fixtures come from those projects' own writers, whose pins conflict with
# Zephon's dependencies: they run in a separate venv and their output is committed.
fixtures:
	$(PY) -m venv .venv-ref
	.venv-ref/bin/python -m pip install --quiet torch==2.13.0
	.venv-ref/bin/python -m pip install --quiet mosaicml-streaming litdata pyarrow
	.venv-ref/bin/python -m pip uninstall --quiet -y torchvision
	.venv-ref/bin/python tests/fixtures/make_reference_shards.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
