"""The host's cost per dispatched op: measured once on this CPU, stored with its date.

Eager PyTorch issues every op from Python; a GPU step cannot finish before its host has issued
all of them. The cost is measured on a tiny timm model's real training step on the CPU (tensors
so small that the kernels are a fraction of the dispatch): wall time per step over the aten ops
the step dispatches (`OpRecorder`). It is stored in `bench/data/host_dispatch.csv`; the fit and
every prediction use the stored figure.
"""

from __future__ import annotations

import csv
import io
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path

import torch

from bench.grid.cell import Cell
from bench.measure.cpu import cpu_model_name
from bench.measure.ops import OpRecorder
from bench.train.setup import cell_batch, cell_training
from bench.train.step import train_step

HOST_FILE = "host_dispatch.csv"
HOST_COLUMNS = ("us_per_op", "ops_per_step", "step_ms", "model", "image_size", "micro_batch", "threads",
                "cpu_model", "torch_version", "measured_utc")
_CELL = Cell(experiment="host_dispatch", profile="cpu", model="test_vit", image_size=16, micro_batch=1, accum_steps=1,
             precision="fp32", checkpointing="off", optimizer="sgd", channels_last=False, warmup_steps=1,
             measured_steps=50)
"""The tiny step measured: tensors so small that its kernels are a fraction of the dispatch."""


@dataclass(frozen=True)
class HostDispatch:
    us_per_op: float
    source: str


def stored_host_dispatch() -> HostDispatch:
    """The stored measurement, with its basis in words."""
    row = next(csv.DictReader(resources.files("bench.data").joinpath(HOST_FILE).read_text().splitlines()))
    return HostDispatch(float(row["us_per_op"]), f"measured {row['measured_utc'][:10]} on {row['cpu_model']} "
                        f"({row['model']} step, {row['ops_per_step']} ops, torch {row['torch_version']})")


def measure_host_dispatch() -> dict:
    """The fastest of 50 tiny eager training steps on the CPU, per aten op it dispatches (the fastest:
    what the host costs when nothing else shares its core)."""
    training = cell_training(_CELL, "cpu")
    step = [cell_batch(_CELL, "cpu")]
    with OpRecorder() as recorder:
        train_step(training.model, training.optimizer, step, _CELL.precision)
    times = []
    for _ in range(_CELL.measured_steps):
        began = time.perf_counter()
        train_step(training.model, training.optimizer, step, _CELL.precision)
        times.append(time.perf_counter() - began)
    step_s = min(times)
    ops = len(recorder.records)
    return {"us_per_op": round(step_s / ops * 1e6, 3), "ops_per_step": ops, "step_ms": round(step_s * 1e3, 3),
            "model": _CELL.model, "image_size": _CELL.image_size, "micro_batch": _CELL.micro_batch,
            "threads": torch.get_num_threads(), "cpu_model": cpu_model_name(), "torch_version": torch.__version__,
            "measured_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def write_host_dispatch(row: dict, path: Path) -> None:
    text = io.StringIO()
    writer = csv.DictWriter(text, HOST_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerow(row)
    path.write_text(text.getvalue())
