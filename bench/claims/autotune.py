"""Seed 002's auto-tuned batch, answered by the memory estimator: rows for the claims table.

`results/claims_autotune/estimate/runs.csv` holds one row per GPU: the largest ResNet-50
micro-batch the estimator predicts fits (`bench probe resnet50 --gpu GPU`, fp32, AdamW, no
headroom, as the article's search keeps none). Written once; delete the file to recompute.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from bench.hardware import gpu_spec
from bench.probe import Budget, ProbeConfig, probe_from_estimate
from bench.provenance import git_state, library_versions
from bench.units import GIB

EXPERIMENT = "claims_autotune"
GPUS = ("RTX-3090", "A100-40GB")
CONFIG = ProbeConfig(model="resnet50", image_size=224, precision="fp32", optimizer="adamw")
COLUMNS = ("cell_id", "gpu", "model", "image_size", "precision", "optimizer", "budget_bytes", "largest_micro_batch",
           "fake_steps", "status", "error_message", "device_type", "device_name", "torch_version", "git_commit")


def autotune_rows_path(results_root: Path) -> Path:
    return Path(results_root) / EXPERIMENT / "estimate" / "runs.csv"


def ensure_autotune_rows(results_root: Path) -> Path:
    """The estimator's answers for each GPU, computed only if their file is missing (minutes on a CPU)."""
    path = autotune_rows_path(results_root)
    if path.exists():
        return path
    commit, _ = git_state()
    rows = []
    for gpu in GPUS:
        budget = Budget(gpu_spec(gpu).memory_gib * GIB, gpu, headroom=0.0)
        predicted = probe_from_estimate(CONFIG, budget).predicted
        rows.append({"cell_id": f"probe-{CONFIG.model}-{CONFIG.image_size}px-{CONFIG.precision}-{CONFIG.optimizer}-{gpu}",
                     "gpu": gpu, "model": CONFIG.model, "image_size": CONFIG.image_size,
                     "precision": CONFIG.precision, "optimizer": CONFIG.optimizer, "budget_bytes": int(budget.nbytes),
                     "largest_micro_batch": predicted.largest, "fake_steps": len(predicted.trials),
                     "status": "estimated", "error_message": "", "device_type": "estimate",
                     "device_name": "estimate for cuda (FakeTensorMode + MemTracker, no device)",
                     "torch_version": library_versions()["torch_version"], "git_commit": commit})
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(buffer.getvalue())
    return path
