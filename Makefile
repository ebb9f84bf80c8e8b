# symkit: `make repro` runs the experiment, `make test` runs the tests.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.symkit-installed
# Where .dvc/config's plots.html_template points (see the plots target below).
PLOTS_TEMPLATE := .cache/plots/offline.html
# Fixed CPU thread counts: results must not depend on the machine's core count.
export OMP_NUM_THREADS ?= 2
export MKL_NUM_THREADS ?= 2
export DVC_NO_ANALYTICS := 1
export PYTHONHASHSEED := 0

.PHONY: repro plots adaptation test test-slow test-gpu lint bench screenshot clean-venv help

help:
	@echo "make repro      - create .venv, install pinned deps, run the DVC pipeline"
	@echo "make plots      - dvc plots show, with a page that draws offline (dvc_plots/index.html)"
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

# Stage commands call `symkit`, so the venv's bin goes first on PATH. The plots template comes
# first, so that `dvc plots show` works right after.
repro: $(STAMP) $(PLOTS_TEMPLATE)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/dvc repro

# The template `dvc plots show` and `dvc plots diff` fill (.dvc/config's plots.html_template):
# Vega, Vega-Lite and vega-embed inlined from the pinned vl-convert-python, so the pages they
# write draw with no network. Generated (about 0.9 MB), not committed; remade with the venv.
$(PLOTS_TEMPLATE): $(STAMP)
	$(BIN)/symkit plots-template --out $@

plots: $(PLOTS_TEMPLATE)
	$(BIN)/dvc plots show

# Pretrain on Palestrina, adapt to the Bach chorales in every arm, choose (docs/adaptation.md).
# It runs the default pipeline's data stages first when their outputs are missing.
adaptation: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/dvc repro experiments/adaptation/dvc.yaml

# One test process per core (pytest-xdist); each test file runs whole in one process, so its
# module fixtures (the end-to-end project, say) are built once.
test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --dist loadfile

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --dist loadfile -m "not gpu"

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
