"""Predicted speed of a cell on a catalog GPU, and a grid's predictions as rows.

Rows go to `results/<experiment>/predicted/runs.csv`, one per cell and GPU, status `predicted`:
the estimator's columns (memory, from the same fake trace) plus the throughput model's
(`bench.results.schema.PREDICTED_COLUMNS`). Reports
never mistake them for measurements (they read status ok); `bench cost` and `bench plan` price
them with the basis `predicted`, and a measured row of the same configuration wins.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from bench.grid.cell import Cell
from bench.grid.model_ref import ModelSpec
from bench.grid.spec import Grid
from bench.measure.flops import flops_per_sample
from bench.measure.hardware import PEAK_COLUMN, GpuSpec, gpu_keys, gpu_spec
from bench.measure.utilization import utilization_pct
from bench.memory.estimate import Estimate, FakeModels
from bench.memory.estimate_grid import estimate_device, estimate_row
from bench.results.keys import SPLIT, configuration_key, sort_key, varying
from bench.results.provenance import provenance, utc_now
from bench.results.rows import cell_row, failure, failure_from
from bench.results.schema import PREDICTED_COLUMNS
from bench.results.store import RunsFile
from bench.speed.model import NoDatasheetPeak, StepTime, gpu_rates, step_time
from bench.speed.params import ModelFile, load_model_file
from bench.speed.trace import StepOps, trace_cell

PREDICTED_FOLDER = "predicted"


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


def predict_on(cell: Cell, ops: StepOps, spec: GpuSpec, model: ModelFile | None = None) -> Prediction:
    """`cell`'s predicted step on `spec` (raises `NoDatasheetPeak` when the catalog lacks a figure).

    Example:
        >>> from bench.speed.trace import trace_step_ops
        >>> cell = Cell(experiment="e", profile="cuda", model="test_resnet", image_size=32, micro_batch=8,
        ...             accum_steps=1, precision="bf16", checkpointing="off", optimizer="sgd",
        ...             channels_last=True, warmup_steps=1, measured_steps=1)
        >>> p = predict_on(cell, trace_step_ops(cell), gpu_spec("H100-80GB"))
        >>> p.step.bound in ("compute", "memory", "non-tensor", "overhead"), p.samples_per_s > 0
        (True, True)
    """
    model = model or load_model_file()
    rates = gpu_rates(spec, cell.precision)
    step = step_time(ops.for_step(cell.accum_steps), rates, model.params)
    samples_per_s = cell.effective_batch / step.step_time_s
    flops = flops_per_sample(ModelSpec.of(cell), cell.image_size, cell.checkpointing)
    peak = rates.headline_peak_flops_per_s
    return Prediction(spec.gpu, step, samples_per_s, peak,
                      f"datasheet: {spec.gpu} {PEAK_COLUMN[cell.precision]} ({spec.source})",
                      utilization_pct(flops.model, samples_per_s, peak),
                      utilization_pct(flops.hardware, samples_per_s, peak), flops.model, flops.hardware,
                      model.interval(samples_per_s, spec), model.basis(spec))


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
        "samples_per_s_low": low, "samples_per_s_high": high,
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
    model = load_model_file()
    device = estimate_device("cuda")
    started, began = utc_now(), time.monotonic()

    def row(gpu: str, outcome: dict, **columns: object) -> dict:
        return cell_row("predicted", cell, device, stamp or {}, outcome, device_tag=PREDICTED_FOLDER, gpu=gpu,
                        started_utc=started, **columns)

    try:
        estimate, ops = trace_cell(cell, models)
    except Exception as exc:  # noqa: BLE001 - a cell that cannot be traced is a row, not a stop
        return [row(gpu, failure_from(exc)) for gpu in gpus]
    memory = _memory_columns(cell, estimate)
    rows = []
    for gpu in gpus:
        try:
            outcome = {**memory, **prediction_columns(predict_on(cell, ops, gpu_spec(gpu), model), model)}
        except NoDatasheetPeak as exc:
            outcome = {**memory, **failure("skipped", "NoDatasheetPeak", str(exc))}
        rows.append(row(gpu, outcome, device_name=f"predicted for {gpu} (throughput model, no device)",
                        duration_s=round(time.monotonic() - began, 3)))
    return rows


def _memory_columns(cell: Cell, estimate: Estimate) -> dict:
    row = estimate_row(cell, estimate)
    if cell.accum_steps > 2:
        row["estimate_method"] += "; traced with K = 2 (later micro-steps repeat the second's memory)"
    return {**row, "status": "predicted"}


def predict_grid(grid: Grid, results_root: Path, gpus: tuple[str, ...] | None = None,
                 on_row: Callable[[dict], None] | None = None) -> Path:
    """Predict every cell of `grid` on `gpus` (default: every catalog GPU) and write the rows."""
    gpus = gpus or gpu_keys()
    runs = RunsFile(Path(results_root) / grid.name / PREDICTED_FOLDER / "runs.csv", PREDICTED_COLUMNS,
                    key=("cell_id", "gpu"))
    stamp = provenance()
    models = FakeModels()
    for cell in grid.cells:
        for row in predicted_rows(cell, gpus, models, stamp):
            runs.write(row)
            if on_row:
                on_row(row)
    return runs.path


def describe_prediction(row: dict) -> str:
    """One console line per predicted row."""
    if row["status"] != "predicted":
        return f"{row['status']:<9} {row['gpu']:<15} {row['cell_id']}  {row['error_type']}: {row['error_message']}"
    band = "" if row.get("samples_per_s_low") is None else \
        f" ({row['samples_per_s_low']:.0f}-{row['samples_per_s_high']:.0f})"
    return (f"predicted {row['gpu']:<15} {row['cell_id']}  {row['samples_per_s']:9.1f}{band} samples/s, step "
            f"{row['predicted_step_time_ms']:.1f} ms, MFU {row['mfu_pct']:.1f} %, {row['predicted_bound']}-bound")


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
