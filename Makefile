# Two commands on a fresh machine: `make demo` and `make test`.
# Each creates .venv and installs what it needs.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev
DEMO_STAMP := $(VENV)/.installed-demo
AZURITE := .npm-tools/node_modules/.bin/azurite-blob

.PHONY: demo test chaos docs lint typecheck bench bench-peers fixtures azurite clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml setup.py src/zephon/_jpeg.c | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The demo installs only what it needs (the package and the local S3 server).
$(DEMO_STAMP): pyproject.toml setup.py src/zephon/_jpeg.c | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[demo]'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/zephon demo

# Azurite (Azure Blob emulator) for the Azure tests, from npm into .npm-tools/.
# npm's registry fails now and then: three attempts.
$(AZURITE):
	for attempt in 1 2 3; do \
		npm install --silent --no-audit --no-fund --prefix .npm-tools azurite@3 && break; \
		sleep 5; \
	done; test -x $(AZURITE)

azurite: $(AZURITE)

# The types are checked first. The suite includes the docs: every Python block runs, and the
# site builds with --strict.
# Then a minute of the chaos harness, with a fresh seed it prints (see benchmarks/chaos.py).
test: $(STAMP) $(AZURITE)
	$(BIN)/mypy src
	$(BIN)/python -m pytest -q
	$(BIN)/python benchmarks/chaos.py --seconds 60

# Random pipelines killed and resumed under random changes, audited: `make chaos TRIALS=1000
# SEED=7` (a fresh seed if none is given; a failure prints the command that repeats it).
TRIALS ?= 1000
chaos: $(STAMP)
	$(BIN)/python benchmarks/chaos.py --trials $(TRIALS) $(if $(SEED),--seed $(SEED))

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples

typecheck: $(STAMP)
	$(BIN)/mypy src

bench-peers: $(STAMP)  ## Zephon against LitData, MosaicML Streaming, WebDataset, zephon 0.2.0
	$(BIN)/python benchmarks/peers.py

bench: $(STAMP)
	$(BIN)/python benchmarks/storage_throughput.py
	$(BIN)/python benchmarks/discovery.py
	$(BIN)/python benchmarks/planner.py
	$(BIN)/python benchmarks/pipeline.py
	$(BIN)/python benchmarks/tokenize_pack.py
	$(BIN)/python benchmarks/executors.py

# MDS and LitData fixtures come from those projects' own writers, whose pins conflict with
# Zephon's dependencies: they run in a separate venv and their output is committed.
fixtures:
	$(PY) -m venv .venv-ref
	echo torch==2.13.0 > .venv-ref/pin.txt
	.venv-ref/bin/python -m pip install --quiet -c .venv-ref/pin.txt torch mosaicml-streaming \
		litdata pyarrow zstd brotli python-snappy
	.venv-ref/bin/python -m pip uninstall --quiet -y torchvision
	.venv-ref/bin/python tests/fixtures/make_reference_shards.py

clean:
	rm -rf $(VENV) .npm-tools build *.egg-info src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
