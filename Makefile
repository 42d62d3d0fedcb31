# vitkit: `make demo` trains a ViT on Fashion-MNIST; `make test` runs the tests.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0

.PHONY: venv demo test test-all lint format bench clean

$(BIN)/vitkit: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test,plot,dev]"
	@touch $@

venv: $(BIN)/vitkit

demo: venv
	$(BIN)/vitkit train --config configs/fmnist_vit.yaml --out runs/demo

test: venv
	$(BIN)/python -m pytest -q

test-all: venv
	$(BIN)/python -m pytest -q -m "slow or not slow"

lint: venv
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

format: venv
	$(BIN)/ruff format src tests benchmarks
	$(BIN)/ruff check --fix src tests benchmarks

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache
