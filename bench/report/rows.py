"""Reading a results folder's rows for reporting, and the facts every chart's subtitle states."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bench.cell import extra_axis_defaults
from bench.results import COLUMNS

# What the report reads; a rows file without these cannot be reported on.
REQUIRED_COLUMNS = (
    "cell_id", "experiment", "profile", "model", "image_size", "micro_batch", "accum_steps",
    "effective_batch", "precision", "checkpointing", "optimizer", "device_name", "status",
    "error_type", "error_message", "memory_source", "peak_memory_bytes", "peak_reserved_bytes",
    "params_bytes", "grads_bytes", "optimizer_state_bytes", "activations_peak_bytes", "phase_memory",
    "samples_per_s", "step_time_median_ms", "mfu_pct", "hfu_pct", "peak_flops_source",
)
assert set(REQUIRED_COLUMNS) <= set(COLUMNS)

PRECISION_ORDER = ("fp32", "bf16", "fp16")
OPTIMIZER_ORDER = ("adamw", "adamw8bit", "sgd")


class RowsError(Exception):
    """A rows file the report cannot use; the message is one line."""


@dataclass(frozen=True)
class ReportContext:
    experiment: str
    device_name: str
    profile: str
    memory_source: str

    @property
    def subtitle(self) -> str:
        memory = {"cuda_allocator": "CUDA allocator", "tracked_tensors": "tracked tensors (MemTracker, CPU)"}
        return (f"{self.device_name} · profile {self.profile} · memory: "
                f"{memory.get(self.memory_source, self.memory_source or 'n/a')}")


def load_rows(folder: Path) -> pd.DataFrame:
    """The rows of `folder/runs.csv`, checked for the columns the report needs."""
    path = Path(folder) / "runs.csv"
    if not path.exists():
        raise RowsError(f"{path}: no such rows file")
    rows = pd.read_csv(path)
    missing = [column for column in REQUIRED_COLUMNS if column not in rows.columns]
    if missing:
        raise RowsError(f"{path}: missing columns {', '.join(missing)}; a runs.csv written by `bench run` has them")
    if rows.empty:
        raise RowsError(f"{path}: no rows to report on")
    return rows


def context_of(rows: pd.DataFrame) -> ReportContext:
    ok = rows[rows.status == "ok"]
    source = ok.memory_source.dropna()
    return ReportContext(experiment=str(rows.experiment.iloc[0]), device_name=str(rows.device_name.iloc[0]),
                         profile=str(rows.profile.iloc[0]),
                         memory_source=str(source.iloc[0]) if len(source) else "")


def variant_labels(rows: pd.DataFrame) -> pd.Series:
    """Per row, the later-added axes away from their default ("world_size 2, ddp_sync every_step"); "" if none."""
    def text(value: object) -> str:  # a column with gaps reads as floats: 2.0 is the axis value 2
        return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)

    def label(row: pd.Series) -> str:
        return ", ".join(f"{name} {text(row[name])}" for name, default in extra_axis_defaults().items()
                         if name in row.index and pd.notna(row[name]) and text(row[name]) != str(default))
    return rows.apply(label, axis=1) if len(rows) else pd.Series(dtype=str)


def at_defaults(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows whose later-added axes (world size, loss tracking, ...) are all at their default:
    single-process cells of the plain step, which the charts and the accumulation table compare.
    All rows when none qualifies."""
    plain = rows[variant_labels(rows) == ""]
    return plain if len(plain) else rows


def reference_optimizer(rows: pd.DataFrame) -> str:
    """The optimizer single-optimizer charts use: adamw when measured, else the first present."""
    present = [name for name in OPTIMIZER_ORDER if name in set(rows.optimizer)]
    return present[0] if present else str(rows.optimizer.iloc[0])


def ordered(values, order) -> list:
    """`values` in the given preferred order, unknown ones after, sorted."""
    values = set(values)
    return [v for v in order if v in values] + sorted(v for v in values if v not in order)


def pair_label(micro_batch: int, accum_steps: int) -> str:
    return f"{int(micro_batch)}×{int(accum_steps)}"
