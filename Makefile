# symkit: `make repro` runs the experiment, `make test` runs the tests.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.symkit-installed
# Fixed CPU thread counts: results must not depend on the machine's core count.
export OMP_NUM_THREADS ?= 2
export MKL_NUM_THREADS ?= 2
export DVC_NO_ANALYTICS := 1
export PYTHONHASHSEED := 0

.PHONY: repro adaptation test test-slow test-gpu lint bench screenshot clean-venv help

help:
	@echo "make repro      - create .venv, install pinned deps, run the DVC pipeline"
	@echo "make adaptation - the adaptation experiment (experiments/adaptation, docs/adaptation.md)"
	@echo "make test       - create .venv, install pinned deps, run the default test suite"
	@echo "make test-slow  - also run tests marked slow"
	@echo "make test-gpu   - run the CUDA tests (needs a GPU)"
	@echo "make lint       - ruff check and the import-linter contracts"
	@echo "make bench      - run benchmarks/ (prints ratios against in-run baselines)"
	@echo "make screenshot - re-make the README's picture of reports/report.html (needs Chromium)"

# The virtual environment is rebuilt when the lock file or pyproject.toml changes.
$(STAMP): requirements.lock pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -qq -r requirements.lock
	$(BIN)/python -m pip install -qq --no-deps -e .
	@touch $(STAMP)

# Stage commands call `symkit`, so the venv's bin goes first on PATH.
repro: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/dvc repro

# Pretrain on Palestrina, adapt to the Bach chorales in every arm, choose (docs/adaptation.md).
# It runs the default pipeline's data stages first when their outputs are missing.
adaptation: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/dvc repro experiments/adaptation/dvc.yaml

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m "not gpu"

test-gpu: $(STAMP)
	$(BIN)/python -m pytest -q -m gpu

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do $(BIN)/python $$b || exit 1; done

# The README's picture of the report's first screen, drawn as tests/test_browser.py renders it.
screenshot: $(STAMP)
	$(BIN)/python docs/images/screenshot.py

clean-venv:
	rm -rf $(VENV)
