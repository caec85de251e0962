# One command for the main job, one for the tests; both set themselves up.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test bench-resnet bench-vit bench-smoke bench-overhead clean

install: $(STAMP)

# Re-installs only when the package metadata changes; the venv itself is kept.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

test: install
	$(BIN)/python -m pytest -q

bench-resnet: install
	$(BIN)/bench run experiments/resnet50.toml

bench-vit: install
	$(BIN)/bench run experiments/vit_b16.toml experiments/vit_l16.toml

bench-smoke: install
	$(BIN)/bench run experiments/smoke.toml

# The runner against a hand-written loop on the same cell: target within 3%.
bench-overhead: install
	$(BIN)/python scripts/bench_overhead.py

# One step as one batch and as K micro-batches, every variant -> results/equivalence/<device>/.
.PHONY: equivalence
equivalence: install
	$(BIN)/python scripts/equivalence_study.py

clean:
	rm -rf $(VENV) .pytest_cache
