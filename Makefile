# vitkit: `make demo` trains a ViT on Fashion-MNIST; `make test` runs the tests.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0

.PHONY: venv data demo demo-5min reproduce reproduce-1 reproduce-2 reproduce-3 reproduce-4 test test-slow test-all test-peers lint format bench docs clean

$(BIN)/vitkit: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test,plot,reproduce,dev,peers,shards,onnx,docs,parquet,track,serve,runtimes]"
	@touch $@

venv: $(BIN)/vitkit

# Fashion-MNIST from Debian's package when we can install it; otherwise vitkit downloads it.
data:
	@if [ ! -d /usr/share/datasets/fashion-mnist ] && command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist || true; \
	fi

demo: venv data
	$(BIN)/vitkit train --config configs/fmnist_vit.yaml --out runs/demo

# The same recipe for a 5-minute budget: half the steps.
demo-5min: venv data
	$(BIN)/vitkit train --config configs/fmnist_vit.yaml --out runs/demo_5min --set train.steps=2228

# The paper's findings at desktop scale (vitkit reproduce) in four calls on 2 CPU cores
# (benchmarks/reproduce_budget.py estimates each on the machine at hand; docs/reproduce.md gives
# the figures); each call resumes what is finished and publishes the report into docs/reproduce.
# data-scaling and compute are longer than two sittings (how much longer depends on how many of
# their runs the plateau rule trains again and on the rates the grids choose): the first three
# calls stop after 110 minutes each, the fourth finishes them and runs the other experiments.
REPRODUCE = $(BIN)/vitkit reproduce --out runs/reproduce --budget desktop --publish docs/reproduce
reproduce: reproduce-1 reproduce-2 reproduce-3 reproduce-4

reproduce-1: venv data
	$(REPRODUCE) --stop-after 110 data-scaling

reproduce-2: venv data
	$(REPRODUCE) --stop-after 110 data-scaling

reproduce-3: venv data
	$(REPRODUCE) --stop-after 110 data-scaling compute

reproduce-4: venv data
	$(REPRODUCE) data-scaling compute pooling attention pos-embed resolution

# pytest-xdist runs a worker a core (tests/conftest.py gives each its share of the threads)
test: venv
	$(BIN)/python -m pytest -q -n auto

# The parity tests against timm's own models (they skip in `make test`: timm needs torchvision,
# whose PyPI wheels need CUDA torch). timm and torchvision go into .peers/ without dependencies,
# beside the venv's CPU torch; tests/peer_env/sitecustomize.py says why that imports.
TIMM ?= timm==1.0.31
TORCHVISION ?= torchvision==0.28.0
test-peers: venv
	$(BIN)/pip install -q --no-deps --upgrade --target .peers "$(TIMM)" "$(TORCHVISION)"
	cp tests/peer_env/sitecustomize.py .peers/
	PYTHONPATH=.peers $(BIN)/python -c "import timm"
	PYTHONPATH=.peers $(BIN)/python -m pytest -q -k timm tests

# The tests that take more than a few seconds each (whole runs, full-size models, the browser's
# screenshot); test-all is both, as CI runs them.
test-slow: venv
	$(BIN)/python -m pytest -q -n auto -m slow

test-all: test test-slow

lint: venv
	$(BIN)/ruff check src tests benchmarks tools
	$(BIN)/ruff format --check src tests benchmarks tools

format: venv
	$(BIN)/ruff format src tests benchmarks tools
	$(BIN)/ruff check --fix src tests benchmarks tools

# The documentation site (docs/, mkdocs.yml) into site/, with --strict: a broken link or reference fails.
# Not --quiet: with it, mkdocs does not count warnings, and --strict passes a broken link.
docs: venv
	$(BIN)/pip install -q -e ".[docs]"
	$(BIN)/python tools/gen_reference.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: venv
	$(BIN)/python benchmarks/demo_fmnist.py
	$(BIN)/python benchmarks/peers.py

clean:
	rm -rf $(VENV) .peers site build dist src/*.egg-info .pytest_cache .ruff_cache
