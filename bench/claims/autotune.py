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
from bench.results.provenance import PROVENANCE_COLUMNS, provenance, utc_now
from bench.results.schema import Column
from bench.results.store import RunsFile
from bench.units import GIB

EXPERIMENT = "claims_autotune"
MODEL = "resnet50"
CONFIGURATIONS = (("RTX-3090", "fp32", "off"), ("A100-40GB", "fp32", "off"), ("A100-40GB", "fp16", "off"),
                  ("A100-40GB", "fp16", "full"))
"""(GPU, precision, checkpointing): the auto-tuner's two GPUs, and the A100 loop with and without checkpointing."""
AUTOTUNE_COLUMNS: dict[str, Column] = {
    "cell_id": Column("str", "probe-<model>-<size>px-<precision>-<optimizer>-<gpu>"),
    "gpu": Column("str", "catalog GPU key"), "model": Column("str"), "image_size": Column("int"),
    "precision": Column("str"), "checkpointing": Column("str"), "optimizer": Column("str"),
    "budget_bytes": Column("int", "the GPU's nominal memory"),
    "largest_micro_batch": Column("int", "the estimator's largest micro-batch within the budget, no headroom"),
    "fake_steps": Column("int", "estimator trials the search took"),
    "status": Column("str", "estimated"), "error_message": Column("str"),
    "device_type": Column("str"), "device_name": Column("str"),
    "torch_version": Column("str"), "git_commit": Column("str"),
    **{name: Column("bool" if name == "git_dirty" else "str") for name in PROVENANCE_COLUMNS
       if name not in ("torch_version", "git_commit")},
    "started_utc": Column("str"),
}


def autotune_rows_path(results_root: Path) -> Path:
    return Path(results_root) / EXPERIMENT / "estimate" / "runs.csv"


def ensure_autotune_rows(results_root: Path) -> Path:
    """The estimator's answer for each configuration, computed only where the file lacks it."""
    path = autotune_rows_path(results_root)
    runs = RunsFile(path, AUTOTUNE_COLUMNS)
    done = {row["cell_id"] for row in runs.rows()}
    stamp = provenance()
    for gpu, precision, checkpointing in CONFIGURATIONS:
        config = ProbeConfig.of(MODEL, image_size=224, precision=precision, checkpointing=checkpointing,
                                optimizer="adamw")
        cell = config.base
        cell_id = f"probe-{cell.model}-{cell.image_size}px-{precision}-ckpt_{checkpointing}-{cell.optimizer}-{gpu}"
        if cell_id in done:
            continue
        budget = Budget(gpu_spec(gpu).memory_gib * GIB, gpu, headroom=0.0)
        predicted = probe_from_estimate(config, budget).predicted
        runs.write({"cell_id": cell_id, "gpu": gpu, "model": cell.model, "image_size": cell.image_size,
                    "precision": precision, "checkpointing": checkpointing,
                    "optimizer": cell.optimizer, "budget_bytes": int(budget.nbytes),
                    "largest_micro_batch": predicted.largest, "fake_steps": len(predicted.trials),
                    "status": "estimated", "error_message": "", "device_type": "estimate",
                    "device_name": "estimate for cuda (FakeTensorMode + MemTracker, no device)",
                    **stamp, "started_utc": utc_now()})
    return path
