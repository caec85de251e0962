"""Reading a results folder's rows for reporting, and the facts every chart's subtitle states."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bench.errors import ResultsFileError
from bench.grid.cell import extra_axis_defaults
from bench.results.keys import away_from_default, configuration_key, varying
from bench.results.read import read_runs

PRECISION_ORDER = ("fp32", "bf16", "fp16")
OPTIMIZER_ORDER = ("adamw", "adamw8bit", "sgd")
SHOWN = ("model", "image_size", "precision", "checkpointing", "optimizer", "micro_batch", "accum_steps")
"""What the cell table gives a column of its own (the other axes go in its variant column)."""


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
    """The rows of `folder/runs.csv` (`bench.results.read.read_runs`); at least one."""
    path = Path(folder) / "runs.csv"
    if not path.is_file():
        raise ResultsFileError(f"{path}: no such rows file; pass a results folder such as "
                               "results/<experiment>/<device-tag>")
    rows = read_runs(path)
    if rows.empty:
        raise ResultsFileError(f"{path}: no rows to report on")
    return rows


def context_of(rows: pd.DataFrame) -> ReportContext:
    ok = rows[rows.status == "ok"]
    source = ok.memory_source[ok.memory_source != ""]
    return ReportContext(experiment=str(rows.experiment.iloc[0]), device_name=str(rows.device_name.iloc[0]),
                         profile=str(rows.profile.iloc[0]),
                         memory_source=str(source.iloc[0]) if len(source) else "")


def variant_labels(rows: pd.DataFrame) -> pd.Series:
    """Per row, the later-added axes away from their default ("world_size 2, ddp_sync every_step"), and any other
    axis the table's own columns do not show that differs between its rows ("channels_last True"); "" if none."""
    if not len(rows):
        return pd.Series(dtype=str)
    keys = [configuration_key(row) for row in rows.to_dict("records")]
    extras = extra_axis_defaults()
    apart = set(varying(keys)) - set(SHOWN) - set(extras)  # a later-added axis is named only away from its default

    def label(key: tuple) -> str:
        told = set(away_from_default(key)) & set(extras) | apart
        return ", ".join(f"{name} {value}" for name, value in key if name in told)
    return pd.Series([label(key) for key in keys], index=rows.index, dtype=str)


def at_defaults(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows whose later-added axes (world size, loss tracking, ...) are all at their default:
    single-process cells of the plain step, which the charts and the accumulation table compare.
    All rows when none qualifies."""
    extras = extra_axis_defaults()

    def plain(row: dict) -> bool:
        return not any(name in extras for name in away_from_default(configuration_key(row)))
    chosen = rows[[plain(row) for row in rows.to_dict("records")]] if len(rows) else rows
    return chosen if len(chosen) else rows


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


def timing_flags(row: pd.Series) -> str:
    """`NOISY LOADED remeasured`: what the cell table's spread column says about a row's timing, for every other
    table that shows the row (accumulation, data parallel, input pipeline)."""
    return " ".join(word for word, column in (("NOISY", "noisy"), ("LOADED", "loaded"), ("remeasured", "remeasured"))
                    if pd.notna(row.get(column)) and bool(row.get(column)))
