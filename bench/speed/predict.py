"""Predicted speed of a cell on a catalog GPU, and a grid's predictions as rows.

Rows go to `results/<experiment>/predicted/runs.csv`, one per cell and GPU, status `predicted`: the
estimator's columns (memory, from the same fake trace) plus the throughput model's
(`bench.results.schema.PREDICTED_COLUMNS`). Reports never mistake them for measurements (they read status ok);
`bench cost` and `bench plan` price them with the basis `predicted`, and a measured row of the same
configuration wins.

`model_speeds` reads a configuration's ops off its traces at `TRACED_MICRO_BATCHES` (every op's FLOPs and bytes
are linear in the micro-batch) and predicts them on every catalog GPU: what a measured GPU row is scaled by on
another GPU. `bench plan`'s own predictions, and the largest micro-batch that fits, are `bench.planner.search`'s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from bench.grid.cell import Cell
from bench.grid.model_ref import ModelSpec
from bench.grid.spec import Grid
from bench.measure.flops import flops_per_sample
from bench.measure.hardware import PEAK_COLUMN, GpuSpec, gpu_keys, gpu_spec
from bench.measure.op_table import StepOps
from bench.measure.utilization import utilization_pct
from bench.memory.fake_models import FakeModels
from bench.memory.traces import traced
from bench.results.keys import SPLIT, configuration_key, sort_key, varying
from bench.results.provenance import provenance, utc_now
from bench.results.schema import PREDICTED_COLUMNS
from bench.results.store import PREDICTED_FOLDER, RunsFile, preflight, results_folder
from bench.speed.model import NoDatasheetPeak, OpMix, StepTime, gpu_rates, op_mix, step_time
from bench.speed.params import ModelFile, load_model_file

if TYPE_CHECKING:
    from bench.memory.estimate import Estimate


@dataclass(frozen=True)
class Prediction:
    """One cell on one GPU."""

    gpu: str
    step: StepTime
    samples_per_s: float
    peak_flops_per_s: float
    peak_source: str
    mfu_pct: float
    hfu_pct: float
    model_flops_per_sample: float
    hardware_flops_per_sample: float
    interval: tuple[float, float] | None
    """(low, high) samples/s from the cross-GPU validation's residuals (`ModelFile.interval`)."""
    basis: str
    op_mix: OpMix
    """The step's op mix: with the kind of GPU, which validation slice's error applies."""


def predict_on(cell: Cell, ops: StepOps, spec: GpuSpec, model: ModelFile | None = None) -> Prediction:
    """`cell`'s predicted step on `spec` (raises `NoDatasheetPeak` when the catalog lacks a figure).

    Example:
        >>> from bench.memory.traces import trace_step_ops
        >>> cell = Cell(experiment="e", profile="cuda", model="test_resnet", image_size=32, micro_batch=8,
        ...             accum_steps=1, precision="bf16", checkpointing="off", optimizer="sgd",
        ...             channels_last=True, warmup_steps=1, measured_steps=1)
        >>> p = predict_on(cell, trace_step_ops(cell), gpu_spec("H100-80GB"))  # slow: traces a step
        >>> p.step.bound in ("compute", "memory", "non-tensor", "overhead"), p.samples_per_s > 0
        (True, True)
    """
    model = model or load_model_file()
    rates = gpu_rates(spec, cell.precision)
    table = ops.for_step(cell.accum_steps)
    step = step_time(table, rates, model.params)
    mix = op_mix(table)
    samples_per_s = cell.effective_batch / step.step_time_s
    flops = flops_per_sample(ModelSpec.of(cell), cell.image_size, cell.checkpointing)
    peak = rates.headline_peak_flops_per_s
    return Prediction(spec.gpu, step, samples_per_s, peak,
                      f"datasheet: {spec.gpu} {PEAK_COLUMN[cell.precision]} ({spec.source})",
                      utilization_pct(flops.model, samples_per_s, peak),
                      utilization_pct(flops.hardware, samples_per_s, peak), flops.model, flops.hardware,
                      model.interval(samples_per_s, spec, mix), model.basis(spec, mix), mix)


def prediction_columns(prediction: Prediction, model: ModelFile) -> dict:
    """The speed columns of a predicted row."""
    step = prediction.step
    low, high = prediction.interval or (None, None)
    return {
        "gpu": prediction.gpu, "samples_per_s": prediction.samples_per_s,
        "predicted_step_time_ms": round(step.step_time_s * 1e3, 4), "predicted_gpu_ms": round(step.gpu_s * 1e3, 4),
        "predicted_host_ms": round(step.host_s * 1e3, 4), "predicted_compute_ms": round(step.compute_s * 1e3, 4),
        "predicted_memory_ms": round(step.memory_s * 1e3, 4),
        "predicted_non_tensor_ms": round(step.non_tensor_s * 1e3, 4),
        "op_mix": prediction.op_mix, "samples_per_s_low": low, "samples_per_s_high": high,
        "predicted_kernel_overhead_ms": round(step.kernel_overhead_s * 1e3, 4), "predicted_bound": step.bound,
        "model_flops_per_sample": prediction.model_flops_per_sample,
        "hardware_flops_per_sample": prediction.hardware_flops_per_sample,
        "peak_flops_per_s": prediction.peak_flops_per_s, "peak_flops_source": prediction.peak_source,
        "mfu_pct": prediction.mfu_pct, "hfu_pct": prediction.hfu_pct,
        "speed_model_version": model.version, "speed_basis": prediction.basis,
    }


def predicted_rows(cell: Cell, gpus: tuple[str, ...], models: FakeModels | None = None,
                   stamp: dict | None = None) -> list[dict]:
    """`cell`'s rows, one per GPU: predicted, or skipped (no datasheet figure), or one error for all; `stamp` is
    the provenance they carry."""
    from bench.memory.estimate_grid import estimate_device  # the row builders load torch: bench plan needs neither
    from bench.results.rows import cell_row, failure, failure_from

    model = load_model_file()
    device = estimate_device("cuda")
    started, began = utc_now(), time.monotonic()

    def row(gpu: str, outcome: dict, **columns: object) -> dict:
        return cell_row("predicted", cell, device, stamp or {}, outcome, device_tag=PREDICTED_FOLDER, gpu=gpu,
                        started_utc=started, **columns)

    try:
        trace, _ = traced(cell, "cuda", models)
    except Exception as exc:  # noqa: BLE001 - a cell that cannot be traced is a row, not a stop
        return [row(gpu, failure_from(exc)) for gpu in gpus]
    memory = _memory_columns(cell, trace.estimate)
    rows = []
    for gpu in gpus:
        try:
            outcome = {**memory, **prediction_columns(predict_on(cell, trace.ops, gpu_spec(gpu), model), model)}
        except NoDatasheetPeak as exc:
            outcome = {**memory, **failure("skipped", "NoDatasheetPeak", str(exc))}
        rows.append(row(gpu, outcome, device_name=f"predicted for {gpu} (throughput model, no device)",
                        duration_s=round(time.monotonic() - began, 3)))
    return rows


def _memory_columns(cell: Cell, estimate: Estimate) -> dict:
    from bench.memory.estimate_grid import estimate_row

    row = estimate_row(cell, estimate)
    if cell.accum_steps > 2:
        row["estimate_method"] += "; traced with K = 2 (later micro-steps repeat the second's memory)"
    return {**row, "status": "predicted"}


def predict_grid(grid: Grid, results_root: Path, gpus: tuple[str, ...] | None = None,
                 on_row: Callable[[dict], None] | None = None) -> Path:
    """Predict every cell of `grid` on `gpus` (default: every catalog GPU) and write the rows."""
    gpus = gpus or gpu_keys()
    runs = RunsFile(results_folder(results_root, grid.name, PREDICTED_FOLDER) / "runs.csv", PREDICTED_COLUMNS,
                    key=("cell_id", "gpu"))
    preflight(runs.path.parent, "predicted rows", "nothing was predicted")
    stamp = provenance()
    models = FakeModels()
    for cell in grid.cells:
        for row in predicted_rows(cell, gpus, models, stamp):
            runs.write(row)
            if on_row:
                on_row(row)
    return runs.path


ACCUMULATION_COLUMNS = ("gpu", "model", "image_size", "precision", "checkpointing", "optimizer", "variant",
                        "effective_batch", "large_split", "accumulated_split", "large_samples_per_s",
                        "accumulated_samples_per_s", "throughput_lost_pct", "accumulated_bound")
"""accumulation.csv, the table of `accumulation_loss`; `variant` only where its lines differ in an axis beyond the
named ones."""


@dataclass(frozen=True)
class GridPrediction:
    """A grid predicted: where its rows went and the throughput its accumulated splits lose (accumulation.csv;
    None and an empty table when no configuration has two splits to compare)."""

    grid: Grid
    runs_file: Path
    accumulation_file: Path | None
    accumulation: tuple[dict, ...]


def predict_grid_files(grid: Grid, results_root: Path, gpus: tuple[str, ...] | None = None,
                       on_row: Callable[[dict], None] | None = None) -> GridPrediction:
    """`predict_grid`, then the accumulation table of its rows beside them (an earlier grid's table is removed
    where this one has none: it would mislead)."""
    from bench.frames import write_csv
    from bench.results.read import read_runs, records

    path = predict_grid(grid, results_root, gpus, on_row)
    table = accumulation_loss(records(read_runs(path, PREDICTED_COLUMNS)))
    written = path.parent / "accumulation.csv"
    if not table:
        written.unlink(missing_ok=True)
        return GridPrediction(grid, path, None, ())
    write_csv(table, written, [c for c in ACCUMULATION_COLUMNS if c != "variant" or any(c in r for r in table)])
    return GridPrediction(grid, path, written, tuple(table))


def describe_prediction(row: dict) -> str:
    """One console line per predicted row."""
    if row["status"] != "predicted":
        return f"{row['status']:<9} {row['gpu']:<15} {row['cell_id']}  {row['error_type']}: {row['error_message']}"
    band = "" if row.get("samples_per_s_low") is None else \
        f" ({row['samples_per_s_low']:.0f}-{row['samples_per_s_high']:.0f})"
    rests_on = (row.get("speed_basis") or "").partition("80 % band: ")[2].rstrip(")")
    return (f"predicted {row['gpu']:<15} {row['cell_id']}  {row['samples_per_s']:9.1f}{band} samples/s, step "
            f"{row['predicted_step_time_ms']:.1f} ms, MFU {row['mfu_pct']:.1f} %, {row['predicted_bound']}-bound"
            + (f"; 80 % band: {rests_on}" if rests_on else ""))


def accumulation_loss(rows: list[dict]) -> list[dict]:
    """Per GPU and configuration, predicted samples/s at the most-accumulated split vs the largest micro-batch.

    A configuration is every axis (`bench.results.keys`): rows apart in any axis but the split are never
    compared, and when the table holds such rows a `variant` column names the axes that tell its lines apart.

    >>> r = lambda m, k, s: {"status": "predicted", "gpu": "L4", "model": "m", "image_size": 224, "precision": "bf16",
    ...     "checkpointing": "off", "optimizer": "adamw", "micro_batch": m, "accum_steps": k, "samples_per_s": s}
    >>> accumulation_loss([r(64, 1, 100.0), r(8, 8, 80.0)])[0]["throughput_lost_pct"]
    20.0
    """
    named = ("model", "image_size", "precision", "checkpointing", "optimizer")
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        if row["status"] == "predicted":
            config = configuration_key(row, ignore=SPLIT)
            head = tuple(dict(config)[name] for name in named)
            key = (row["gpu"], *head, row["micro_batch"] * row["accum_steps"], *sort_key(config))
            groups.setdefault(key, []).append(row)
    table = []
    for key, members in sorted(groups.items(), key=lambda item: tuple(map(str, item[0]))):
        large = min(members, key=lambda r: r["accum_steps"])
        small = max(members, key=lambda r: r["accum_steps"])
        if large is small:
            continue
        table.append({"gpu": key[0], "model": key[1], "image_size": key[2], "precision": key[3],
                      "checkpointing": key[4], "optimizer": key[5], "variant": configuration_key(large, ignore=SPLIT),
                      "effective_batch": key[6],
                      "large_split": f"{large['micro_batch']}x{large['accum_steps']}",
                      "accumulated_split": f"{small['micro_batch']}x{small['accum_steps']}",
                      "large_samples_per_s": round(large["samples_per_s"], 1),
                      "accumulated_samples_per_s": round(small["samples_per_s"], 1),
                      "throughput_lost_pct": round(100 * (1 - small["samples_per_s"] / large["samples_per_s"]), 1),
                      "accumulated_bound": small.get("predicted_bound")})
    apart = [name for name in varying(line["variant"] for line in table) if name not in named]
    for line in table:  # the axes that tell lines apart beyond the named ones; no column when there are none
        config = dict(line["variant"])
        line["variant"] = " ".join(f"{name}={config[name]}" for name in apart)
        if not apart:
            del line["variant"]
    return table


TRACED_MICRO_BATCHES = (8, 16)
"""The micro-batches each configuration is traced at: every op is linear in the micro-batch, so two traces give its
ops at any size (`model_speeds`, and `bench.planner.search`, which also draws the peak's line through them)."""


def _ops_at(cell: Cell, models: FakeModels) -> StepOps:
    low, high = (traced(replace(cell, micro_batch=m, accum_steps=2), "cuda", models)[0].ops
                 for m in TRACED_MICRO_BATCHES)
    try:
        return low.at_micro_batch(high, cell.micro_batch)
    except ValueError:  # the two sizes run different op sequences: trace the cell's own
        return traced(cell, "cuda", models)[0].ops


def model_speeds(cell: Cell, models: FakeModels | None = None) -> tuple[tuple[str, float], ...]:
    """(GPU, predicted samples/s) of `cell` on every catalog GPU with the figures its precision needs: what
    `bench.cost.price` scales a measured row by (`projected_by_model`, the ratio of its target GPU's to its own).
    Its ops are read off the two traces `bench plan` makes of the configuration (`TRACED_MICRO_BATCHES`, kept in
    the disk cache): a grid's splits of one configuration share them. () where the fake trace cannot run the model.
    """
    model, models = load_model_file(), models or FakeModels()
    try:
        ops = _ops_at(cell, models)
    except Exception:  # noqa: BLE001 - a model the fake trace cannot run: its rows keep the MFU carry-over
        return ()
    speeds = []
    for gpu in gpu_keys():
        try:
            speeds.append((gpu, predict_on(cell, ops, gpu_spec(gpu), model).samples_per_s))
        except NoDatasheetPeak:
            continue
    return tuple(speeds)
