"""Report tables: the per-cell table and "what accumulation costs", as DataFrames and markdown."""

from __future__ import annotations

import pandas as pd

from bench.report.rows import (
    PRECISION_ORDER,
    ordered,
    pair_label,
    reference_optimizer,
    variant_labels,
)
from bench.units import GIB


def cell_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per cell, rounded, units in the headers."""
    def gib(column: str) -> pd.Series:
        return (rows[column] / GIB).round(3)
    variants = variant_labels(rows)
    return pd.DataFrame({
        "model": rows.model,
        "image (px)": rows.image_size,
        "micro×K": [pair_label(m, k) for m, k in zip(rows.micro_batch, rows.accum_steps)],
        "precision": rows.precision,
        "ckpt": rows.checkpointing,
        "optimizer": rows.optimizer,
        **({"variant": variants} if (variants != "").any() else {}),
        "status": rows.status,
        "peak (GiB)": gib("peak_memory_bytes"),
        "reserved (GiB)": gib("peak_reserved_bytes"),
        "activations (GiB)": gib("activations_peak_bytes"),
        "optimizer state (GiB)": gib("optimizer_state_bytes"),
        "step (ms)": rows.step_time_median_ms.round(1),
        "samples/s": rows.samples_per_s.round(2),
        "MFU (%)": rows.mfu_pct.round(2),
        "HFU (%)": rows.hfu_pct.round(2),
    })


def accumulation_cost(rows: pd.DataFrame) -> pd.DataFrame:
    """Per model and precision: the large-batch end against the most-accumulated end.

    Compared at checkpointing off (when measured) with the reference optimizer, so only the
    micro-batch/accumulation split differs between the two cells.
    """
    optimizer = reference_optimizer(rows)
    subset = rows[rows.optimizer == optimizer]
    if (subset.checkpointing == "off").any():
        subset = subset[subset.checkpointing == "off"]
    lines = []
    for model in sorted(set(subset.model)):
        for precision in ordered(subset[subset.model == model].precision, PRECISION_ORDER):
            cells = subset[(subset.model == model) & (subset.precision == precision)]
            large, accumulated = cells.loc[cells.accum_steps.idxmin()], cells.loc[cells.accum_steps.idxmax()]
            if large.cell_id == accumulated.cell_id:
                continue
            lines.append(_compare(model, precision, optimizer, large, accumulated))
    return pd.DataFrame(lines)


def _compare(model: str, precision: str, optimizer: str, large: pd.Series, accumulated: pd.Series) -> dict:
    both_ok = large.status == "ok" and accumulated.status == "ok"

    def change_pct(column: str) -> float | None:
        return round(100 * (large[column] - accumulated[column]) / large[column], 1) if both_ok else None

    def value(row: pd.Series, column: str, digits: int, scale: float = 1.0) -> object:
        return round(row[column] / scale, digits) if row.status == "ok" else row.status

    return {
        "model": model, "precision": precision, "optimizer": optimizer,
        "large batch": pair_label(large.micro_batch, large.accum_steps),
        "accumulated": pair_label(accumulated.micro_batch, accumulated.accum_steps),
        "peak large (GiB)": value(large, "peak_memory_bytes", 3, GIB),
        "peak accumulated (GiB)": value(accumulated, "peak_memory_bytes", 3, GIB),
        "memory saved (%)": change_pct("peak_memory_bytes"),
        "throughput lost (%)": change_pct("samples_per_s"),
        "MFU large (%)": value(large, "mfu_pct", 2),
        "MFU accumulated (%)": value(accumulated, "mfu_pct", 2),
    }


def data_parallel(rows: pd.DataFrame) -> pd.DataFrame:
    """The DDP columns of every cell that has a world size (empty when none ran on several processes)."""
    if "world_size" not in rows or not (rows.world_size > 1).any():
        return pd.DataFrame()
    return pd.DataFrame({
        "model": rows.model,
        "micro×K": [pair_label(m, k) for m, k in zip(rows.micro_batch, rows.accum_steps)],
        "processes": rows.world_size,
        "sync": rows.ddp_sync.where(rows.world_size > 1, "-"),
        "status": rows.status,
        "peak per rank, max (GiB)": (rows.peak_memory_max_rank_bytes / GIB).round(3),
        "global samples/s": rows.global_samples_per_s.round(2),
        "scaling efficiency": rows.scaling_efficiency.round(3),
        "all-reduces per step": rows.allreduce_calls_per_step,
        "all-reduce (ms/step)": rows.allreduce_ms_per_step.round(1),
    })


ESTIMATE_COMPARED = ["cell_id", "peak_memory_bytes", "peak_reserved_bytes", "memory_source"]


def estimate_vs_measured(measured: pd.DataFrame, estimated: pd.DataFrame) -> pd.DataFrame:
    """One line per cell measured `ok` and `estimated` (same grid and profile, so the same ids),
    with the predicted / measured ratios of peak and reserved memory.

    >>> m = pd.DataFrame({"cell_id": ["a"], "status": ["ok"], "peak_memory_bytes": [100],
    ...                   "peak_reserved_bytes": [120], "memory_source": ["cuda_allocator"]})
    >>> e = m.assign(status="estimated", peak_memory_bytes=105, peak_reserved_bytes=110)
    >>> estimate_vs_measured(m, e).peak_ratio.tolist()
    [1.05]
    """
    joined = measured[measured.status == "ok"][ESTIMATE_COMPARED].merge(
        estimated[estimated.status == "estimated"][ESTIMATE_COMPARED], on="cell_id",
        suffixes=("_measured", "_estimated"))
    joined["peak_ratio"] = joined.peak_memory_bytes_estimated / joined.peak_memory_bytes_measured
    joined["reserved_ratio"] = joined.peak_reserved_bytes_estimated / joined.peak_reserved_bytes_measured
    joined["within_10pct"] = (joined.peak_ratio - 1).abs() <= 0.10
    return joined
