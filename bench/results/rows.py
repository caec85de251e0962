"""The one row builder: every row a runs file takes, measured, estimated, predicted or an auto-tuner answer.

A cell's row is its configuration and device (`config_columns`), the provenance stamp, and its
outcome, assembled by `cell_row` and checked against its kind's schema
(`bench.results.schema.SCHEMAS`): no column the kind does not declare, and a status the kind
allows, so a computed row is never `ok` and never read as a measurement. The outcome's parts are
built here too, each in one place. A measured cell's process returns what it measured as it measured
it (`ProcessMeasurement`: step times, the trace, the allocator's peaks, a loader's waits, the
all-reduces), and its columns are computed here: one process's (`one_process_columns`), a
data-parallel cell's ranks combined (`rank_columns`), from the memory trace and the allocator
(`memory_columns`, shared with the estimator), the timed steps (`throughput_columns`) and a loader's
input (`input_columns`); and a failure (`failure`, `failure_from`).

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
from dataclasses import dataclass

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
from bench.measure.host import loaded
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


@dataclass(frozen=True)
class InputMeasurement:
    """What a loader cell measured of its input beside the timed steps (`bench.run.cell_input.LoaderInput`)."""

    step_wait_ms: list[float]
    """Per timed step: the host time its micro-batches took to arrive."""
    loader: LoaderAlone
    main: ProcessMemory
    """The training process's memory, while the workers still held a training-time prefetch."""
    workers: list[ProcessMemory]
    pinned_peak_bytes: int
    host_cpu_model: str
    host_cpus: int
    data: dict
    """The data set's columns (`bench.train.data.ImageData.columns`)."""


@dataclass(frozen=True)
class AllreduceMeasurement:
    """A data-parallel rank's all-reduces over its timed steps (`bench.run.ddp_rank.AllreduceMeter`)."""

    bucket_calls: int
    synced_backwards: int
    """Backwards that all-reduced, however bucketed."""
    total_ms: float
    """Launch-to-completion time summed over the all-reduces."""


@dataclass(frozen=True)
class ProcessMeasurement:
    """What one process of a measured cell measured, as it measured it; its row's columns come from here only.

    A cell's process (`bench.run.cell_measurement`) sends this back, or a `failure`; a data-parallel cell has one
    per rank, rank 0 first.
    """

    step_times_ms: list[float]
    """Each timed optimizer step's wall time (synchronised on a GPU)."""
    traced: TracedStep
    memory_source: str
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    """The caching allocator's peaks over the timed steps; None without one (CPU)."""
    params_bytes: int
    optimizer_state_bytes: int
    param_count: int
    host_threads: int
    """The cores the process needed to itself: judged against the foreign load it was timed under."""
    cpu_threads: int | None = None
    """The intra-op threads it ran with, recorded where they may differ from the device's (a DDP rank's share, a
    loader cell's training process beside its workers); None: the device's."""
    expandable_segments: bool | None = None
    warmup_steps_run: int = 0
    ci95_target_rel: float | None = None
    ci95_target_met: bool | None = None
    foreign_load_cores: float | None = None
    reference_flops_per_s_before: float | None = None
    reference_flops_per_s_after: float | None = None
    input: InputMeasurement | None = None
    """A loader cell's input; None for synthetic micro-batches."""
    allreduce: AllreduceMeasurement | None = None
    """A data-parallel rank's all-reduces; None in one process."""


def one_process_columns(measured: ProcessMeasurement, cell: Cell, flops: FlopsPerSample | None,
                        peak: PeakFlops) -> dict:
    """A 1-process cell's measured columns, with the columns that data-parallel rows also carry."""
    columns = _process_columns(measured, cell, flops, peak)
    return {**columns, "peak_memory_max_rank_bytes": columns["peak_memory_bytes"],
            "peak_memory_min_rank_bytes": columns["peak_memory_bytes"],
            "global_samples_per_s": columns["samples_per_s"]}


def _process_columns(measured: ProcessMeasurement, cell: Cell, flops: FlopsPerSample | None, peak: PeakFlops) -> dict:
    """One process's measured columns (status ok): its memory, its timed steps, its input and all-reduces, and how
    it was timed."""
    foreign = measured.foreign_load_cores
    allreduce, steps = measured.allreduce, len(measured.step_times_ms)
    return {
        "status": "ok",
        **memory_columns(memory_source=measured.memory_source, traced=measured.traced,
                         peak_allocated_bytes=measured.peak_allocated_bytes,
                         peak_reserved_bytes=measured.peak_reserved_bytes, params_bytes=measured.params_bytes,
                         optimizer_state_bytes=measured.optimizer_state_bytes, param_count=measured.param_count),
        **throughput_columns(cell.effective_batch, measured.step_times_ms, flops, peak),
        **({"allreduce_calls_per_step": allreduce.bucket_calls / steps,
            "synced_backwards_per_step": allreduce.synced_backwards / steps,
            "allreduce_ms_per_step": allreduce.total_ms / steps} if allreduce else {}),
        **(input_columns(measured.input, measured.step_times_ms, cell.effective_batch) if measured.input else {}),
        **({"cpu_threads": measured.cpu_threads} if measured.cpu_threads is not None else {}),
        "expandable_segments": measured.expandable_segments,
        "warmup_steps_run": measured.warmup_steps_run,
        "ci95_target_rel": measured.ci95_target_rel,
        "ci95_target_met": measured.ci95_target_met,
        "foreign_load_cores": None if foreign is None else round(foreign, 3),
        "loaded": loaded(foreign, measured.host_threads),
        "reference_flops_per_s_before": measured.reference_flops_per_s_before,
        "reference_flops_per_s_after": measured.reference_flops_per_s_after,
    }


def rank_columns(ranks: list[ProcessMeasurement], cell: Cell, flops: FlopsPerSample | None, peak: PeakFlops) -> dict:
    """A data-parallel cell's measured columns from its ranks' measurements (rank 0 first): per step, the slowest
    rank's time (the all-reduce makes the others wait for it); the peak the largest rank's, both extremes kept;
    the all-reduce time the slowest rank's; the rest rank 0's.

    >>> def rank(times, peak_bytes, allreduce_ms):
    ...     traced = TracedStep(grads_bytes=10, tracked_peak_bytes={"total": peak_bytes,
    ...                                                             **dict.fromkeys(TRACKED_CATEGORIES, 0)})
    ...     return ProcessMeasurement(times, traced, "tracked_tensors",
    ...                               None, None, params_bytes=10, optimizer_state_bytes=0, param_count=3,
    ...                               host_threads=1, allreduce=AllreduceMeasurement(2, 2, allreduce_ms))
    >>> cell = Cell(experiment="e", profile="cpu", model="m", image_size=32, micro_batch=2, accum_steps=2,
    ...             precision="fp32", checkpointing="off", optimizer="sgd", channels_last=False, warmup_steps=1,
    ...             measured_steps=2, world_size=2)
    >>> row = rank_columns([rank([10, 30], 100, 2.0), rank([20, 20], 80, 4.0)], cell, None, PeakFlops(None, "none"))
    >>> row["step_times_ms"], row["peak_memory_max_rank_bytes"], row["peak_memory_min_rank_bytes"]
    ('[20, 30]', 100, 80)
    >>> row["samples_per_s"], row["global_samples_per_s"], row["allreduce_ms_per_step"]
    (160.0, 320.0, 2.0)
    """
    slowest_ms = [max(times) for times in zip(*(r.step_times_ms for r in ranks))]
    each = [_process_columns(r, cell, flops, peak) for r in ranks]
    peaks = [columns["peak_memory_bytes"] for columns in each]
    row = {**each[0], **throughput_columns(cell.effective_batch, slowest_ms, flops, peak)}
    static = row["params_bytes"] + row["grads_bytes"] + row["optimizer_state_bytes"]
    row.update(
        peak_memory_bytes=max(peaks), activations_peak_bytes=max(peaks) - static,
        peak_allocated_bytes=_max_or_none(columns["peak_allocated_bytes"] for columns in each),
        peak_reserved_bytes=_max_or_none(columns["peak_reserved_bytes"] for columns in each),
        peak_tracked_bytes=max(columns["peak_tracked_bytes"] for columns in each),
        peak_memory_max_rank_bytes=max(peaks), peak_memory_min_rank_bytes=min(peaks),
        global_samples_per_s=samples_per_s(cell.global_batch, row["step_time_median_ms"]),
        allreduce_ms_per_step=max(columns["allreduce_ms_per_step"] for columns in each),
    )
    return row


def keep_narrower(first: dict, second: dict) -> dict:
    """The better-behaved of two measurements of one cell (the narrower interval of the median step
    time), with the other's step times and dispersion kept beside it.

    >>> a = {"status": "ok", "step_times_ms": "[1]", "step_time_ci95_rel": 0.3}
    >>> b = {"status": "ok", "step_times_ms": "[2]", "step_time_ci95_rel": 0.05}
    >>> kept = keep_narrower(a, b)
    >>> kept["step_times_ms"], kept["discarded_ci95_rel"], kept["remeasured"]
    ('[2]', 0.3, True)
    """
    if second["status"] != "ok":  # the second run failed: the first stands, and says it was retried
        return {**first, "remeasured": True, "discarded_step_times_ms": None, "discarded_ci95_rel": None}
    kept, other = (second, first) if second["step_time_ci95_rel"] < first["step_time_ci95_rel"] else (first, second)
    return {**kept, "remeasured": True, "discarded_step_times_ms": other["step_times_ms"],
            "discarded_ci95_rel": other["step_time_ci95_rel"]}


def measured_once(outcome: dict) -> dict:
    """A measurement that was not taken again (`keep_narrower` says when one was)."""
    return {**outcome, "remeasured": False}


def attempt_columns(*, started_utc: str, duration_s: float, load_avg_1m: float | None,
                    load_avg_1m_after: float | None, quiet_wait_s: float, cpu_steal_pct: float | None) -> dict:
    """When a cell ran, for how long (its wait for a quiet machine included), and how loaded the host was: every
    outcome's, a failure's too."""
    return {"started_utc": started_utc, "duration_s": round(duration_s, 3), "load_avg_1m": load_avg_1m,
            "load_avg_1m_after": load_avg_1m_after, "quiet_wait_s": quiet_wait_s, "cpu_steal_pct": cpu_steal_pct}


def _max_or_none(values) -> int | None:
    present = [value for value in values if value is not None]
    return max(present) if present else None


def input_columns(measured: InputMeasurement, step_times_ms: list[float], effective_batch: int) -> dict:
    """What a loader cell records beside the step: its input wait, the loader alone, host memory, the data set."""
    wait = input_wait(measured.step_wait_ms, step_times_ms, effective_batch)
    loader, processes = measured.loader, (measured.main, *measured.workers)
    pss = [m.pss_bytes for m in processes]
    return {
        "input_wait_ms": json.dumps([round(w, 4) for w in measured.step_wait_ms]),
        "input_wait_median_ms": wait.median_ms,
        "input_wait_p90_ms": wait.p90_ms,
        "input_wait_pct": wait.pct,
        "input_bound": is_input_bound(wait, loader),
        "loader_samples_per_s": loader.samples_per_s,
        "loader_samples_per_s_min": loader.samples_per_s_min,
        "loader_samples_per_s_max": loader.samples_per_s_max,
        "loader_cpu_ms_per_sample": loader.cpu_ms_per_sample,
        "host_rss_main_bytes": measured.main.rss_bytes,
        "host_rss_workers_bytes": sum(m.rss_bytes or 0 for m in measured.workers),
        "host_pss_total_bytes": None if None in pss else sum(pss),
        "pinned_peak_bytes": measured.pinned_peak_bytes,
        "host_cpu_model": measured.host_cpu_model,
        "host_cpus": measured.host_cpus,
        **measured.data,
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
