"""A grid's estimates: one row per cell in `results/<experiment>/estimate/runs.csv`.

The rows carry the runner's columns (`bench.results.schema.COLUMNS`, built by the same
`bench.results.rows.memory_columns`) with status `estimated`, plus the few that only an estimate has
(`bench.results.schema.ESTIMATE_COLUMNS`). Reports, `bench cost` and `bench plan` read status-ok
rows only, so an estimate is never mistaken for a measurement.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch

from bench.grid.cell import Cell
from bench.grid.spec import Grid
from bench.measure.device import DeviceInfo
from bench.memory.estimate import CUDA_MODEL, CUDA_UNMODELLED, Estimate, Target
from bench.memory.fake_models import FakeModels
from bench.measure.memory import TracedStep
from bench.memory.fit import DEFAULT_HEADROOM, fitting_gpus
from bench.memory.traces import traced, tracing_from_both_ends
from bench.results.provenance import provenance, utc_now
from bench.results.rows import cell_row, failure_from, memory_columns
from bench.results.schema import ESTIMATE_COLUMNS
from bench.results.store import ESTIMATE_FOLDER, RunsFile, preflight, results_folder
from bench.units import gib

if TYPE_CHECKING:
    from bench.memory.validate import Agreement


@dataclass(frozen=True)
class GridEstimate:
    """A grid estimated: its rows (as written), where they went, the chart drawn of them (None when no cell could be
    estimated) and, per model, the estimator's measured agreement with public fit/OOM rows."""

    grid: Grid
    runs_file: Path
    rows: tuple[dict, ...]
    chart: Path | None
    agreements: dict[str, Agreement | None]


def estimate_device(target: Target) -> DeviceInfo:
    """The pseudo-device an estimate's rows name: no device ran anything."""
    precisions = ("fp32", "bf16", "fp16")
    return DeviceInfo(target, f"estimate for {target} (FakeTensorMode + MemTracker, no device)", precisions,
                      torch.get_num_threads())


def estimate_row(cell: Cell, estimate: Estimate, headroom: float = DEFAULT_HEADROOM) -> dict:
    """The runs.csv row of one estimated cell.

    Example:
        >>> from bench.memory.estimate import estimate_cell
        >>> cell = Cell(experiment="e", profile="cuda", model="test_resnet", image_size=32, micro_batch=2,
        ...             accum_steps=1, precision="fp32", checkpointing="off", optimizer="sgd",
        ...             channels_last=False, warmup_steps=1, measured_steps=1)
        >>> estimate_row(cell, estimate_cell(cell))["status"]
        'estimated'
    """
    cuda = estimate.target == "cuda"
    return {
        "status": "estimated",
        **memory_columns(memory_source="estimate_cuda_allocator" if cuda else "estimate_tracked_tensors",
                         traced=estimate.traced, peak_allocated_bytes=estimate.peak_allocated_bytes,
                         peak_reserved_bytes=estimate.peak_reserved_bytes, params_bytes=estimate.params_bytes,
                         optimizer_state_bytes=estimate.traced.optimizer_state_bytes,
                         param_count=estimate.param_count, peak_bytes=estimate.peak_bytes),
        "estimate_inputs_bytes": estimate.inputs_bytes if cuda else None,
        "estimate_workspace_bytes": estimate.workspace_bytes if cuda else None,
        "tracked_autocast_cache_bytes": estimate.autocast_cache_bytes,
        "estimate_attention": estimate.attention,
        "fits_gpus": ";".join(fitting_gpus(estimate.peak_reserved_bytes, headroom)) if cuda else None,
        "estimate_method": f"{CUDA_MODEL}; {CUDA_UNMODELLED}" if cuda else
                           "tracked tensors of the runner's step (MemTracker, fake tensors): what the CPU runner reports",
    }


def estimated_row(cell: Cell, target: Target, models: FakeModels | None = None) -> dict:
    """`estimate_row` of `cell`, from its trace at K = min(K, 2) (`bench.memory.traces`: the same configuration
    in another grid, run or command is not traced again) with the later micro-steps repeated."""
    estimate = traced(cell, target, models)[0].estimate
    return estimate_row(cell, replace(estimate, traced=repeat_micro_steps(estimate.traced, cell.accum_steps)))


def repeat_micro_steps(traced: TracedStep, accum_steps: int) -> TracedStep:
    """A step of `accum_steps` micro-batches from a trace of two (or one, when `accum_steps` is 1).

    From the second micro-batch on, every micro-step holds the same tensors (the gradients exist and are
    accumulated into), so its phases repeat the second's, and the update follows the last; the peak and every
    other figure of the trace are already those of the longer step (checked against full traces in the tests).

    >>> two = TracedStep(phases=[{"step": 0, "phase": p, "micro_step": m, "allocated_bytes": b, "weights_version": 0}
    ...     for p, m, b in [("forward", 0, 5), ("backward", 0, 2), ("forward", 1, 6), ("backward", 1, 2),
    ...                     ("optimizer", 1, 3), ("zero_grad", 1, 1)]])
    >>> [(p["phase"], p["micro_step"]) for p in repeat_micro_steps(two, 3).phases][4:]
    [('forward', 2), ('backward', 2), ('optimizer', 2), ('zero_grad', 2)]
    """
    if accum_steps <= 2:
        return traced
    phases = []
    for step in sorted({p["step"] for p in traced.phases}):
        entries = [p for p in traced.phases if p["step"] == step]
        micro = [p for p in entries if p["phase"] in ("forward", "backward")]
        update = [p for p in entries if p["phase"] not in ("forward", "backward")]
        phases += [p for p in micro if p["micro_step"] == 0]
        second = [p for p in micro if p["micro_step"] == 1]
        phases += [{**p, "micro_step": index} for index in range(1, accum_steps) for p in second]
        phases += [{**p, "micro_step": accum_steps - 1} for p in update]
    return replace(traced, phases=phases)


def estimate_grid(grid: Grid, results_root: Path, on_row: Callable[[dict, int, int], None] | None = None,
                  models: FakeModels | None = None) -> Path:
    """Estimate every cell of `grid` (its profile decides the target) and write the rows; returns the file.

    The fake models are shared between cells (see `FakeModels`), each cell is traced with at most two
    micro-batches, and a cell estimated before with the same code and versions comes from the disk cache.
    Every cell's row is replaced; rows of the other profile are kept.
    """
    target: Target = "cuda" if grid.profile == "cuda" else "cpu"
    device = estimate_device(target)
    runs = RunsFile(results_folder(results_root, grid.name, ESTIMATE_FOLDER) / "runs.csv", ESTIMATE_COLUMNS)
    runs.rows()  # a corrupt file stops here, before anything is estimated
    preflight(runs.path.parent, "estimate rows", "nothing was estimated")  # so does a folder that cannot take rows
    stamp = provenance()
    models = models or FakeModels()
    with tracing_from_both_ends(grid.cells, target):  # the later cells' traces from a second process, side by side
        for index, cell in enumerate(grid.cells):
            started = utc_now()
            began = time.monotonic()
            try:
                outcome = estimated_row(cell, target, models)
            except Exception as exc:  # noqa: BLE001 - a cell that cannot be estimated is a row, not a stop
                outcome = failure_from(exc)
            row = cell_row("estimated", cell, device, stamp, outcome, device_tag=ESTIMATE_FOLDER,
                           started_utc=started, duration_s=round(time.monotonic() - began, 3))
            runs.write(row)
            if on_row:
                on_row(row, index, len(grid.cells))
    return runs.path


def describe_estimate(row: dict) -> str:
    """One console line: the cell, its predicted peak, and the GPUs it fits."""
    if row["status"] != "estimated":
        return f"{row['status']:<9} {row['cell_id']}  {row['error_type']}: {row['error_message']}"
    if row["peak_reserved_bytes"] is None:
        return f"estimated {row['cell_id']}  tracked peak {gib(row['peak_memory_bytes'], 3)}"
    return (f"estimated {row['cell_id']}  allocated {gib(row['peak_allocated_bytes'])}, reserved "
            f"{gib(row['peak_reserved_bytes'])}; fits: {row['fits_gpus'] or 'none'}")
