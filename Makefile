# One command for the main job, one for the tests; both set themselves up.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install constraints test test-fast bench-resnet bench-vit bench-ddp bench-input bench-smoke bench-overhead bench-latency charts equivalence cost estimate estimate-speed bench-memory predict predict-speed predict-fit predict-validate bench-speed claims clean

install: $(STAMP)

# Re-installs only when the package metadata or the pinned versions change; the venv itself is kept.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,slurm,cloud]'  # the SLURM and SkyPilot paths' tests need them
	touch $(STAMP)

# The exact versions `make install` uses, resolved again from pyproject.toml (run after changing a dependency).
constraints: install
	$(BIN)/python -m pip install --quiet pip-tools
	$(BIN)/pip-compile --quiet --extra dev --extra slurm --extra cloud --strip-extras --no-emit-index-url --no-emit-find-links \
		--output-file constraints.txt pyproject.toml

# Every test, doctests included: first all but those marked serial, on pytest-xdist's workers, then the serial ones on
# one worker. test-fast (46-55 s on 2 EPYC cores, 60-61 s on 2 Xeon ones; the goal is 60 s) runs the first batch less those marked slow (more
# than about 1.5 s). Serial tests start processes (cells, torchrun, the `bench` command: tests/conftest.py refuses a
# process in a test not marked slow or serial), time steps, measure a CPU's peak or wait for a quiet machine: beside
# another worker they would measure its load, and their processes use both cores anyway (the whole suite on two
# workers took 659 s against 661 s on one). The slow tests that compute in their own process (traces, fits, readers
# racing a writer) run beside the fast ones; tests of one xdist_group share a worker (and its module fixture).
test: install
	$(BIN)/python -m pytest -q -m "not serial" -n auto --maxprocesses 4 --dist loadgroup
	$(BIN)/python -m pytest -q -m serial

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow" -n auto --maxprocesses 4 --dist loadgroup

bench-resnet: install
	$(BIN)/bench run experiments/resnet50.toml

bench-vit: install
	$(BIN)/bench run experiments/vit_b16.toml experiments/vit_l16.toml

# DDP through torchrun: 1, 2 and 8 GPUs (cells needing more GPUs than present are skipped rows).
bench-ddp: install
	$(BIN)/bench run experiments/ddp.toml

# The input pipeline (docs/input_pipeline.md): synthetic input against a JPEG DataLoader, ResNet-50 and
# ViT-B/16, then their reports. The ImageNet-like set is generated once into ~/.cache/bench
# ($$BENCH_CACHE_DIR); DATA_DIR=/path/to/imagenet/train reads a real ImageFolder tree instead.
# The grids' CPU profiles give every cell one intra-op thread (run.threads), so the workers get cores of their own.
INPUT_GRIDS := experiments/input_pipeline.toml experiments/input_pipeline_vit_b16.toml
bench-input: install
	$(BIN)/bench run $(INPUT_GRIDS) $(if $(DATA_DIR),--data-dir $(DATA_DIR))
	$(BIN)/bench report $$(ls -d results/input_pipeline/*/ results/input_pipeline_vit_b16/*/ | grep -v /estimate/)

bench-smoke: install
	$(BIN)/bench run experiments/smoke.toml

# The runner against a hand-written loop on the same cell: target within 3%.
bench-overhead: install
	$(BIN)/python scripts/bench_overhead.py

# Cold and warm wall times of help, list, probe, plan and estimate, side by side in one run (targets in the script).
bench-latency: install
	$(BIN)/python scripts/bench_latency.py

# Every results folder's charts and REPORT.md, regenerated from its rows (estimates get their chart only:
# they are not measurements), and the equivalence study's tables from its CSV.
MEASURED_RUNS = $(filter-out results/%/estimate/runs.csv results/%/predicted/runs.csv,$(wildcard results/*/*/runs.csv))
ESTIMATE_RUNS = $(filter-out results/claims_autotune/%,$(wildcard results/*/estimate/runs.csv))
RESULT_FOLDERS = $(sort $(dir $(MEASURED_RUNS)) $(dir $(ESTIMATE_RUNS)) $(dir $(wildcard results/equivalence/*/equivalence.csv)))
charts: install
	$(if $(RESULT_FOLDERS),$(BIN)/bench report $(RESULT_FOLDERS),@echo "no results/*/*/runs.csv to report on yet")

# One step as one batch and as K micro-batches, every variant -> results/equivalence/<device>/.
equivalence: install
	$(BIN)/bench equivalence --study

# Dollars per run for every results folder -> <folder>/cost/ (folders without ok rows are skipped).
# CPU-profile rows are priced only as labelled projections: make cost COST_FLAGS=--allow-cpu-projection
cost: install
	@folders="$(dir $(MEASURED_RUNS))"; \
	if [ -z "$$folders" ]; then echo "cost: no results/*/*/runs.csv to price"; \
	else $(BIN)/bench cost $$folders $(COST_FLAGS); fi

# Predicted peak memory of every cell of the shipped grids on a GPU, without one
# -> results/<experiment>/estimate/{runs.csv,memory_estimate.png}.
estimate: install
	$(BIN)/bench estimate experiments/resnet50.toml experiments/vit_b16.toml experiments/vit_l16.toml

# The estimator against every row of timm's RTX 3090 AMP training benchmark (fit/OOM per row,
# docs/estimator.md) -> docs/memory/{validation.csv,summary.md}: agreement on both sides and margins, by
# family and memory format. Resumable: rows already there are kept, so with every row committed it only
# rewrites the summary; LIMIT_S bounds one sitting (every row from scratch: about 3 CPU-hours on 2 cores).
bench-memory: install
	nice -n 10 $(BIN)/python scripts/memory_validate.py $(if $(LIMIT_S),--limit-s $(LIMIT_S))

# Seconds per estimated cell: ViT-L/16 at micro-batch 32 (target <= 10 s on 2 cores).
estimate-speed: install
	$(BIN)/python scripts/estimate_speed.py

# The throughput model (docs/speed.md): every shipped study's cells predicted on every catalog GPU ->
# results/<experiment>/predicted/ (runs.csv + accumulation.csv), without a GPU.
# The ViT grids' AdamW cells only (their 8-bit AdamW and SGD cells would double the tracing, which is most of the
# 25-40 minutes on 2 cores); and the GPU check's memory-format pairs, which its report sets beside the measurement.
predict: install
	$(BIN)/bench predict experiments/resnet50.toml
	$(BIN)/bench predict experiments/vit_b16.toml experiments/vit_l16.toml --only optimizer=adamw
	$(BIN)/bench predict experiments/gpu_check/formats.toml

# Seconds to predict one ViT-L/16 cell on every catalog GPU (target <= 10 s on 2 cores).
predict-speed: install
	$(BIN)/python scripts/predict_speed.py

# Refit the throughput model on the committed reference traces (bench/data/speed_params.json, reproducible),
# then its leave-one-family-out validation (docs/speed/).
predict-fit: install
	$(BIN)/bench predict --fit

predict-validate: install
	$(BIN)/bench predict --validate

# The throughput model's targets table (issue #36), its Hopper/Blackwell rows held out and its channels-last / contiguous
# ratios -> docs/speed/{targets,hopper_blackwell,memory_format}.md:
# from the committed held-out predictions (docs/speed/validation.csv), no fit, no timing
bench-speed: install
	$(BIN)/python scripts/speed_targets.py

# The seed articles' claims: the claims grids (resume: only missing cells run), the estimator's
# 224 px memory for the grids whose claims accept it (redone when a grid file changes), the throughput
# model's predictions on the articles' GPUs for the grids of the GPU-speed claims (a predicted verdict
# beside "not testable here" until GPU rows exist), then the table -> results/claims/<device-tag>/{CLAIMS.md,claims.csv}.
CLAIMS_GRIDS := $(sort $(wildcard experiments/claims/*.toml))
CLAIMS_ESTIMATES := $(foreach study,strategies vit_l16 detach checkpointing precision,results/claims_$(study)/estimate/runs.csv)
CLAIMS_PREDICTIONS := $(foreach study,strategies checkpointing vit_sizes,results/claims_$(study)/predicted/runs.csv)
claims: install
	$(BIN)/bench run $(CLAIMS_GRIDS)
	$(MAKE) --no-print-directory $(CLAIMS_ESTIMATES) $(CLAIMS_PREDICTIONS)
	$(BIN)/bench claims

results/claims_%/estimate/runs.csv: experiments/claims/%.toml
	$(BIN)/bench estimate $<

# The GPUs the articles name (002: A100; 000: RTX 3090), bench.claims.registry.ARTICLE_GPUS.
results/claims_%/predicted/runs.csv: experiments/claims/%.toml
	$(BIN)/bench predict $< --gpu A100-40GB --gpu RTX-3090

clean:
	rm -rf $(VENV) .pytest_cache
