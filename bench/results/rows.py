"""The one row builder: every row a runs file takes, measured, estimated, predicted or an auto-tuner answer.

A cell's row is its configuration and device (`config_columns`), the provenance stamp, and its
outcome, assembled by `cell_row` and checked against its kind's schema
(`bench.results.schema.SCHEMAS`): no column the kind does not declare, and a status the kind
allows, so a computed row is never `ok` and never read as a measurement. The outcome's parts are
built here too, each in one place: what the memory trace and the allocator showed
(`memory_columns`, shared by the runner and the estimator), the timed steps
(`throughput_columns`), a data-parallel cell's ranks combined (`rank_columns`) and the same columns for
one process (`one_process_columns`), a loader's input (`input_columns`), and a failure (`failure`,
`failure_from`).

Example: an estimate cannot pose as a measurement:
    >>> from bench.measure.device import DeviceInfo
    >>> cell = Cell(experiment="e", profile="cpu", model="m", image_size=32, micro_batch=2, accum_steps=1,
    ...             precision="fp32", checkpointing="off", optimizer="sgd", channels_last=False, warmup_steps=1,
    ...             measured_steps=1)
    >>> cell_row("estimated", cell, DeviceInfo("cpu", "cpu", ("fp32",), 2), {}, {"status": "ok"})
    Traceback (most recent call last):
    ...
    ValueError: an estimated row cannot have status 'ok' (it may have estimated, oom, error, skipped)
"""

from __future__ import annotations

import json

from bench.grid.cell import Cell
from bench.measure.device import DeviceInfo
from bench.measure.failure import first_line, is_out_of_memory
from bench.measure.flops import FlopsPerSample
from bench.measure.input_pipeline import (
    LoaderAlone,
    ProcessMemory,
    input_wait,
    is_input_bound,
)
from bench.measure.memory import TracedStep
from bench.measure.peak import PeakFlops
from bench.measure.step_stats import summarize_step_times
from bench.measure.utilization import samples_per_s, utilization_pct
from bench.results.schema import SCHEMAS, RowKind, Status


def cell_row(kind: RowKind, cell: Cell, device: DeviceInfo, stamp: dict, outcome: dict, **columns: object) -> dict:
    """The row of `cell` on `device`: configuration and device, the provenance `stamp`, the `outcome` (measured,
    estimated or predicted columns, or a failure), then `columns` (what a kind sets itself: its device tag, the GPU
    predicted for, when it started), checked against `kind`'s schema (`checked`)."""
    return checked(kind, {**config_columns(cell, device), **stamp, **outcome, **columns})


def checked(kind: RowKind, row: dict) -> dict:
    """`row`, once it has only columns of `kind`'s schema and a status the kind allows (`ValueError` otherwise)."""
    schema, article = SCHEMAS[kind], "an" if kind[0] in "aeiou" else "a"
    unknown = sorted(set(row) - set(schema.columns))
    if unknown:
        raise ValueError(f"{article} {kind} row has undeclared columns: {unknown}")
    if row.get("status") not in schema.statuses:
        raise ValueError(f"{article} {kind} row cannot have status {row.get('status')!r} (it may have "
                         f"{', '.join(schema.statuses)})")
    return row


AUTOTUNE_DEVICE_NAME = "estimate for cuda (FakeTensorMode + MemTracker, no device)"


def autotune_cell_id(cell: Cell, gpu: str) -> str:
    """The id of an auto-tuner answer: the probe's configuration and the GPU (not a `Cell` id: no batch is given,
    the answer is one).

    >>> c = Cell(experiment="e", profile="cuda", model="resnet50", image_size=224, micro_batch=1, accum_steps=1,
    ...          precision="fp16", checkpointing="full", optimizer="adamw", channels_last=False, warmup_steps=1,
    ...          measured_steps=1)
    >>> autotune_cell_id(c, "A100-40GB")
    'probe-resnet50-224px-fp16-ckpt_full-adamw-A100-40GB'
    """
    return f"probe-{cell.model}-{cell.image_size}px-{cell.precision}-ckpt_{cell.checkpointing}-{cell.optimizer}-{gpu}"


def autotune_row(cell: Cell, gpu: str, stamp: dict, *, budget_bytes: int, largest_micro_batch: int, fake_steps: int,
                 started_utc: str) -> dict:
    """The estimator's largest micro-batch for `cell`'s configuration within `gpu`'s memory, as a row."""
    return checked("autotune", {
        "cell_id": autotune_cell_id(cell, gpu), "gpu": gpu, "model": cell.model, "image_size": cell.image_size,
        "precision": cell.precision, "checkpointing": cell.checkpointing, "optimizer": cell.optimizer,
        "budget_bytes": budget_bytes, "largest_micro_batch": largest_micro_batch, "fake_steps": fake_steps,
        "status": "estimated", "error_message": "", "device_type": "estimate", "device_name": AUTOTUNE_DEVICE_NAME,
        **stamp, "started_utc": started_utc})


TRACKED_CATEGORIES = ("params", "buffers", "grads", "optimizer_state", "activations", "temporaries")
"""MemTracker's categories as the `tracked_<name>_bytes` columns hold them."""


def config_columns(cell: Cell, device: DeviceInfo) -> dict:
    """The configuration and device columns every row carries, whatever its outcome."""
    return {"cell_id": cell.cell_id, **cell.to_dict(), "effective_batch": cell.effective_batch,
            "global_batch": cell.global_batch,
            "device_type": device.type, "device_name": device.name, "device_tag": device.tag,
            "cpu_threads": device.threads, "cpu_isa": " ".join(device.cpu.isa_flags) if device.cpu else None,
            "cpu_cores": device.cpu.cores if device.cpu else None}


def memory_columns(*, memory_source: str, traced: TracedStep, peak_allocated_bytes: int | None,
                   peak_reserved_bytes: int | None, params_bytes: int, optimizer_state_bytes: int,
                   param_count: int, peak_bytes: int | None = None) -> dict:
    """What one cell's memory was: the peak, its parts, and the traced steps phase by phase.

    `peak_bytes` is the row's headline peak; by default the allocator's peak where there is one
    (CUDA), else the traced tensors' peak. Gradients come from the trace (the bytes after backward).
    """
    tracked_peak = traced.tracked_peak_bytes["total"]
    if peak_bytes is None:
        peak_bytes = peak_allocated_bytes if peak_allocated_bytes is not None else tracked_peak
    static = {"params_bytes": params_bytes, "grads_bytes": traced.grads_bytes,
              "optimizer_state_bytes": optimizer_state_bytes}
    return {
        "memory_source": memory_source,
        "param_count": param_count,
        "peak_memory_bytes": peak_bytes,
        "peak_allocated_bytes": peak_allocated_bytes,
        "peak_reserved_bytes": peak_reserved_bytes,
        "peak_tracked_bytes": tracked_peak,
        **static,
        "activations_peak_bytes": peak_bytes - sum(static.values()),
        "activations_saved_bytes": traced.activations_saved_bytes,
        "untracked_bytes": None if peak_allocated_bytes is None else peak_allocated_bytes - tracked_peak,
        **{f"tracked_{name}_bytes": traced.tracked_peak_bytes[name] for name in TRACKED_CATEGORIES},
        "phase_memory": json.dumps([[p["phase"], p["micro_step"], p["allocated_bytes"]]
                                    for p in traced.phases if p["step"] == 0]),
        "step_memory": json.dumps([[p["step"], p["phase"], p["micro_step"], p["allocated_bytes"],
                                    p["weights_version"]] for p in traced.phases]),
        "kept_graph_nodes": json.dumps(traced.kept_graph_nodes),
        "host_rss_bytes": json.dumps(traced.host_rss_bytes),
        "grad_norm": traced.grad_norm,
    }


def throughput_columns(effective_batch: int, step_times_ms: list[float], flops: FlopsPerSample | None,
                       peak: PeakFlops) -> dict:
    """Step-time statistics, samples/s (one process's: effective_batch per step), FLOPs, MFU and HFU."""
    stats = summarize_step_times(step_times_ms)
    rate = samples_per_s(effective_batch, stats.median_ms)
    return {
        "step_times_ms": json.dumps([round(t, 4) for t in step_times_ms]),
        "step_time_median_ms": stats.median_ms,
        "step_time_p10_ms": stats.p10_ms,
        "step_time_p90_ms": stats.p90_ms,
        "step_time_ci95_low_ms": stats.ci95_low_ms,
        "step_time_ci95_high_ms": stats.ci95_high_ms,
        "step_time_ci95_rel": stats.ci95_rel,
        "noisy": stats.noisy,
        "samples_per_s": rate,
        "model_flops_per_sample": flops.model if flops else None,
        "hardware_flops_per_sample": flops.hardware if flops else None,
        "peak_flops_per_s": peak.flops_per_s,
        "peak_flops_source": peak.source,
        "mfu_pct": utilization_pct(flops.model, rate, peak.flops_per_s) if flops else None,
        "hfu_pct": utilization_pct(flops.hardware, rate, peak.flops_per_s) if flops else None,
    }


def rank_columns(ranks: list[dict], effective_batch: int, global_batch: int, flops: FlopsPerSample | None,
                 peak: PeakFlops) -> dict:
    """A data-parallel cell's outcome from its ranks' (each ok, rank 0 first): per step, the slowest rank's time
    (the all-reduce makes the others wait for it); `peak_memory_bytes` the largest rank's, both extremes kept.

    >>> rank = {"step_times_ms": "[10, 30]", "peak_memory_bytes": 100, "peak_allocated_bytes": None,
    ...         "peak_reserved_bytes": None, "peak_tracked_bytes": 100, "params_bytes": 10, "grads_bytes": 10,
    ...         "optimizer_state_bytes": 0, "allreduce_ms_per_step": 1.0, "rank": 0}
    >>> row = rank_columns([rank, {**rank, "step_times_ms": "[20, 20]", "peak_memory_bytes": 80, "rank": 1}], 4, 8,
    ...                    None, PeakFlops(None, "none"))
    >>> row["step_times_ms"], row["peak_memory_max_rank_bytes"], row["peak_memory_min_rank_bytes"]
    ('[20, 30]', 100, 80)
    >>> row["samples_per_s"], row["global_samples_per_s"]
    (160.0, 320.0)
    """
    slowest_ms = [max(times) for times in zip(*(json.loads(r["step_times_ms"]) for r in ranks))]
    peaks = [r["peak_memory_bytes"] for r in ranks]
    row = {**ranks[0], **throughput_columns(effective_batch, slowest_ms, flops, peak)}
    static = row["params_bytes"] + row["grads_bytes"] + row["optimizer_state_bytes"]
    row.update(
        peak_memory_bytes=max(peaks), activations_peak_bytes=max(peaks) - static,
        peak_allocated_bytes=_max_or_none(r["peak_allocated_bytes"] for r in ranks),
        peak_reserved_bytes=_max_or_none(r["peak_reserved_bytes"] for r in ranks),
        peak_tracked_bytes=max(r["peak_tracked_bytes"] for r in ranks),
        peak_memory_max_rank_bytes=max(peaks), peak_memory_min_rank_bytes=min(peaks),
        global_samples_per_s=samples_per_s(global_batch, row["step_time_median_ms"]),
        allreduce_ms_per_step=max(r["allreduce_ms_per_step"] for r in ranks),
    )
    row.pop("rank")
    return row


def one_process_columns(outcome: dict) -> dict:
    """A 1-process cell's outcome with the columns that data-parallel rows also carry."""
    if outcome["status"] != "ok":
        return outcome
    peak = outcome["peak_memory_bytes"]
    return {**outcome, "peak_memory_max_rank_bytes": peak, "peak_memory_min_rank_bytes": peak,
            "global_samples_per_s": outcome["samples_per_s"]}


def _max_or_none(values) -> int | None:
    present = [value for value in values if value is not None]
    return max(present) if present else None


def input_columns(*, step_wait_ms: list[float], step_times_ms: list[float], effective_batch: int,
                  loader: LoaderAlone, main: ProcessMemory, workers: list[ProcessMemory], pinned_peak_bytes: int,
                  host_cpu_model: str, host_cpus: int, data: dict) -> dict:
    """What a loader cell records beside the step: its input wait, the loader alone, host memory, the data set."""
    wait = input_wait(step_wait_ms, step_times_ms, effective_batch)
    pss = [m.pss_bytes for m in (main, *workers)]
    return {
        "input_wait_ms": json.dumps([round(w, 4) for w in step_wait_ms]),
        "input_wait_median_ms": wait.median_ms,
        "input_wait_p90_ms": wait.p90_ms,
        "input_wait_pct": wait.pct,
        "input_bound": is_input_bound(wait, loader),
        "loader_samples_per_s": loader.samples_per_s,
        "loader_samples_per_s_min": loader.samples_per_s_min,
        "loader_samples_per_s_max": loader.samples_per_s_max,
        "loader_cpu_ms_per_sample": loader.cpu_ms_per_sample,
        "host_rss_main_bytes": main.rss_bytes,
        "host_rss_workers_bytes": sum(m.rss_bytes or 0 for m in workers),
        "host_pss_total_bytes": None if None in pss else sum(pss),
        "pinned_peak_bytes": pinned_peak_bytes,
        "host_cpu_model": host_cpu_model,
        "host_cpus": host_cpus,
        **data,
    }


def failure(status: Status, error_type: str, message: str) -> dict:
    """The columns of a cell that produced no measurement, and why.

    >>> failure("timeout", "Timeout", "no result within 5 s")["status"]
    'timeout'
    """
    return {"status": status, "error_type": error_type, "error_message": message}


def failure_from(exc: BaseException) -> dict:
    """An exception as a row's outcome: `oom` when it is out-of-memory, else `error`."""
    return failure("oom" if is_out_of_memory(exc) else "error", type(exc).__name__, first_line(exc))
