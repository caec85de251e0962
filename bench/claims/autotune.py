"""Seed 002's largest batches, answered by the memory estimator: rows for the claims table.

`results/claims_autotune/estimate/runs.csv` holds one row per (GPU, precision, checkpointing):
the largest ResNet-50 micro-batch the estimator predicts fits (`bench probe resnet50 --gpu GPU`,
AdamW, no headroom, as the article's search keeps none). The article's auto-tuner (fp32) on a
3090 and an A100, and its A100 loop (fp16 autocast) with and without checkpointing. A missing
configuration is computed (minutes on a CPU); delete the file to recompute all.
"""

from __future__ import annotations

from pathlib import Path

from bench.measure.hardware import gpu_spec
from bench.memory.budget import Budget
from bench.memory.probe import ProbeConfig, probe_from_estimate
from bench.results.provenance import provenance, utc_now
from bench.results.rows import autotune_cell_id, autotune_row
from bench.results.schema import AUTOTUNE_COLUMNS
from bench.results.store import ESTIMATE_FOLDER, RunsFile, results_folder
from bench.units import GIB

EXPERIMENT = "claims_autotune"
MODEL = "resnet50"
CONFIGURATIONS = (("RTX-3090", "fp32", "off"), ("A100-40GB", "fp32", "off"), ("A100-40GB", "fp16", "off"),
                  ("A100-40GB", "fp16", "full"))
"""(GPU, precision, checkpointing): the auto-tuner's two GPUs, and the A100 loop with and without checkpointing."""


def autotune_rows_path(results_root: Path) -> Path:
    return results_folder(results_root, EXPERIMENT, ESTIMATE_FOLDER) / "runs.csv"


def ensure_autotune_rows(results_root: Path) -> Path:
    """The estimator's answer for each configuration, computed only where the file lacks it."""
    path = autotune_rows_path(results_root)
    runs = RunsFile(path, AUTOTUNE_COLUMNS)
    done = {row["cell_id"] for row in runs.rows()}
    stamp = provenance()
    for gpu, precision, checkpointing in CONFIGURATIONS:
        config = ProbeConfig.of(MODEL, image_size=224, precision=precision, checkpointing=checkpointing,
                                optimizer="adamw")
        if autotune_cell_id(config.base, gpu) in done:
            continue
        budget = Budget(gpu_spec(gpu).memory_gib * GIB, gpu, headroom=0.0)
        predicted = probe_from_estimate(config, budget).predicted
        runs.write(autotune_row(config.base, gpu, stamp, budget_bytes=int(budget.nbytes),
                                largest_micro_batch=predicted.largest, fake_steps=len(predicted.trials),
                                started_utc=utc_now()))
    return path
