"""Predicted speed of a cell on a catalog GPU, and a grid's predictions as rows.

Rows go to `results/<experiment>/predicted/runs.csv`, one per cell and GPU, status `predicted`: the
estimator's columns (memory, from the same fake trace) plus the throughput model's
(`bench.results.schema.PREDICTED_COLUMNS`). Reports never mistake them for measurements (they read status ok);
`bench cost` and `bench plan` price them with the basis `predicted`, and a measured row of the same
configuration wins.

`plan_predictions` answers `bench plan` without a grid: for a model, image size and effective batch E, each
(precision, checkpointing) is traced at two micro-batches (`TRACED_MICRO_BATCHES`, K = 2, one fake trace each
for memory and ops). Every op's FLOPs and bytes are linear in the micro-batch, so the two traces give the ops
at any size. Peak memory is the largest of several phases' (each linear), so the line through two sizes is
exact where the same phase sets the peak and too low elsewhere (by up to 53 % for ViT-B/16 with checkpointing,
where the optimizer step sets the peak at small sizes): per GPU, the largest power-of-two micro-batch m that
divides E and fits (peak + headroom) on the line is checked (by the bounds between traced sizes where they
settle it, `Traced.bounds`, else by a full trace of m) and halved until it fits; K = E / m is predicted on that
GPU (`predict_on`, as for a grid's cell). Every trace is the one of its configuration that estimate, probe and
plan share (`bench.memory.traces`); configurations not yet in the cache are traced side by side, one child
process each (`_trace_apart`). fp16 is read off bf16's trace (the same shapes; its GradScaler's few ops are left
out) and offered only on GPUs without a bf16 peak (T4, V100): where both run, the model predicts them alike.
Each prediction carries the fp32 gradient bytes, so a multi-GPU instance scales as its interconnect predicts
(`bench.speed.ddp`); `bench.cost.price.MeasuredRow.predicted` prices it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from bench.grid.cell import Cell
from bench.grid.model_ref import ModelSpec
from bench.grid.spec import Grid
from bench.measure.flops import flops_per_sample
from bench.measure.hardware import PEAK_COLUMN, GpuSpec, gpu_keys, gpu_spec
from bench.measure.op_table import StepOps
from bench.measure.utilization import utilization_pct
from bench.memory.allocator import CUDA_SEGMENT_BYTES, whole_segments
from bench.memory.fake_models import FakeModels
from bench.memory.fit import DEFAULT_HEADROOM, memory_fit
from bench.memory.traces import Trace, traced
from bench.results.keys import SPLIT, configuration_key, sort_key, varying
from bench.results.provenance import provenance, utc_now
from bench.results.schema import PREDICTED_COLUMNS
from bench.results.store import PREDICTED_FOLDER, RunsFile, preflight, results_folder
from bench.speed.ddp import BYTES_PER_GRADIENT
from bench.speed.model import NoDatasheetPeak, OpMix, StepTime, gpu_rates, op_mix, step_time
from bench.speed.params import ModelFile, load_model_file
from bench.units import MIB

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
MEMORY_METHOD = ("memory: the estimator's peak (fake-tensor trace, reserved, K = 2) at the chosen micro-batch, found on "
                 f"the line through micro-batches {TRACED_MICRO_BATCHES} and checked by a trace of the largest size "
                 "proposed; between traced sizes the chord bounds the peak (it is convex in the micro-batch), sizes it "
                 "cannot settle are traced; + headroom against the GPU's nominal memory")
DEFAULT_PRECISIONS = ("bf16", "fp16", "tf32")


@dataclass(frozen=True, kw_only=True)
class PlanCandidates:
    """What to predict for a plan."""

    model: str
    image_size: int
    effective_batch: int
    gpus: tuple[str, ...]
    precisions: tuple[str, ...] = DEFAULT_PRECISIONS
    checkpointing: tuple[str, ...] = ("off",)
    optimizer: str = "adamw"
    channels_last: bool = True
    headroom: float = DEFAULT_HEADROOM
    model_options: dict[str, Any] = field(default_factory=dict)
    """The cells' model fields beyond model and image_size (model_kwargs, in_chans, image_width, num_classes)."""
    gpu_counts: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """GPU key -> the GPU counts of the instances that carry it (default: 1): the effective batch is split over
    each count, so an 8-GPU instance gets a micro-batch that, times 8, divides the effective batch."""

    def per_gpu_batches(self, gpu: str) -> list[int]:
        """The samples each GPU runs per optimizer step, one per GPU count that divides the effective batch.

        >>> PlanCandidates(model="m", image_size=224, effective_batch=512, gpus=("H100-80GB",),
        ...                gpu_counts={"H100-80GB": (1, 8, 3)}).per_gpu_batches("H100-80GB")
        [512, 64]
        """
        counts = self.gpu_counts.get(gpu, (1,))
        return list(dict.fromkeys(self.effective_batch // n for n in counts if self.effective_batch % n == 0))

    def cell(self, micro_batch: int, precision: str, checkpointing: str) -> Cell:
        """A traced cell: K = 2, one warm-up and one measured step."""
        return Cell(experiment="plan", profile="cuda", model=self.model, image_size=self.image_size,
                    micro_batch=micro_batch, accum_steps=2, precision=precision, checkpointing=checkpointing,
                    optimizer=self.optimizer, channels_last=self.channels_last, warmup_steps=1, measured_steps=1,
                    **self.model_options)


CONVEXITY_SLACK_BYTES = 2 * CUDA_SEGMENT_BYTES
"""How far the tensors' rounding to 512-byte blocks may bend the peak off a convex function of the micro-batch
(a few thousand live tensors at most), with room to spare."""
SETTLED_WITHIN_BYTES = 16 * MIB
"""Bounds this close settle a size's peak without a trace of its own (0.1 % of a 16 GB GPU)."""


@dataclass
class Traced:
    """The line through two traces (peak bytes and ops at any micro-batch), and full traces of the sizes chosen.

    The peak is the largest of the step's moments, each a sum of tensors affine in the micro-batch, so it is convex
    in the micro-batch: between two traced sizes the chord lies on or above it, and a secant carried beyond its two
    sizes lies on or below it (`bounds`, give or take `CONVEXITY_SLACK_BYTES`). A size whose bounds settle the
    question needs no trace of its own."""

    low: tuple[int, float, StepOps]
    high: tuple[int, float, StepOps]
    traced_peak: Callable[[int], float]
    """The estimator's peak at a micro-batch, from a full trace (or the disk cache)."""
    grads_bytes: int = 0
    """fp32 gradients of every parameter: what DDP all-reduces on a multi-GPU instance."""
    checked: dict[int, float] = field(default_factory=dict)

    def peak_bytes(self, micro_batch: int) -> float:
        """The traced peak at `micro_batch` (each size traced once)."""
        if micro_batch not in self.checked:
            known = {self.low[0]: self.low[1], self.high[0]: self.high[1]}
            self.checked[micro_batch] = known.get(micro_batch) or self.traced_peak(micro_batch)
        return self.checked[micro_batch]

    def bounds(self, micro_batch: int) -> tuple[float, float]:
        """(lowest, highest) peak bytes at `micro_batch` that the traced sizes allow (equal where it was traced).

        >>> flat = StepOps({}, 1)
        >>> traced = Traced((8, 2e9, flat), (16, 3e9, flat), traced_peak=lambda m: 1e9 + m * 0.125e9)
        >>> traced.peak_bytes(64) / 1e9
        9.0
        >>> [round(bound / 1e9, 3) for bound in traced.bounds(32)]  # the secant below, the chord above
        [4.99, 5.004]
        """
        known = self._known()
        if micro_batch in known:
            return known[micro_batch], known[micro_batch]
        sizes = sorted(known)
        below, above = [a for a in sizes if a < micro_batch], [b for b in sizes if b > micro_batch]
        # A traced peak is rounded up to a whole segment, so a chord through two errs high: still an upper bound.
        high = _through(known, below[-1], above[0], micro_batch) + CONVEXITY_SLACK_BYTES if below and above \
            else float("inf")
        secants = [_secant_floor(known, a, b, micro_batch) for a, b in zip(sizes, sizes[1:]) if not a < micro_batch < b]
        return max(max(secants, default=0.0), 0.0), high

    def _known(self) -> dict[int, float]:
        return {self.low[0]: self.low[1], self.high[0]: self.high[1], **self.checked}

    def settled_peak_bytes(self, micro_batch: int) -> float:
        """The peak at `micro_batch`: traced, or the upper bound where the bounds lie within `SETTLED_WITHIN_BYTES`
        (never below the trace's peak, at most that above it); otherwise traced now."""
        low, high = self.bounds(micro_batch)
        return high if high - low <= SETTLED_WITHIN_BYTES else self.peak_bytes(micro_batch)

    def line_candidate(self, capacity_gib: float, headroom: float, limit: int) -> int:
        """The largest power-of-two micro-batch <= limit that divides `limit` and fits on the line: never too small
        (the line is at or below the peak at every power of two beyond the traced pair)."""
        known, (a, b) = self._known(), (self.low[0], self.high[0])
        m = 1
        while m * 2 <= limit and limit % (m * 2) == 0 and \
                memory_fit(_secant_floor(known, a, b, m * 2), headroom, capacity_gib).fits:
            m *= 2
        return m

    def largest_fitting(self, capacity_gib: float, headroom: float, limit: int) -> int:
        """`line_candidate`, halved until it fits (0: none): settled by `bounds` where they can, by a trace where
        they cannot."""
        m = self.line_candidate(capacity_gib, headroom, limit)
        while m >= 1:
            low, high = self.bounds(m)
            if memory_fit(high, headroom, capacity_gib).fits:
                return m
            if memory_fit(low, headroom, capacity_gib).fits and \
                    memory_fit(self.peak_bytes(m), headroom, capacity_gib).fits:
                return m
            m //= 2
        return m

    def ops(self, micro_batch: int) -> StepOps:
        return self.low[2].at_micro_batch(self.high[2], micro_batch)


def _through(known: dict[int, float], a: int, b: int, m: int) -> float:
    return known[a] + (known[b] - known[a]) * (m - a) / (b - a)


def _secant_floor(known: dict[int, float], a: int, b: int, m: int) -> float:
    """A floor on the peak at `m` outside [a, b]: the secant through the traced a and b, less what their rounding up to
    whole segments can tilt it there (a segment per width of the pair `m` lies away) and `CONVEXITY_SLACK_BYTES`."""
    reach = max(m - a, b - m) / (b - a)
    return _through(known, a, b, m) - CUDA_SEGMENT_BYTES * reach - CONVEXITY_SLACK_BYTES


@dataclass(frozen=True)
class PlanPrediction:
    """One plan option: `cell` (its split chosen for the GPU) predicted on one GPU."""

    cell: Cell
    prediction: Prediction
    peak_reserved_bytes: int
    """The estimator's peak at the cell's micro-batch, in whole allocator segments."""
    grads_bytes: int
    """fp32 gradients of every parameter: what DDP all-reduces on a multi-GPU instance (0: unknown)."""
    basis: str
    """The speed basis in words, with what bounds the step."""


@dataclass
class Progress:
    traces: int = 0
    seconds: float = 0.0
    refused: dict[str, int] = field(default_factory=dict)


def plan_predictions(request: PlanCandidates, on_trace: Callable[[str], None] | None = None,
                     progress: Progress | None = None) -> list[PlanPrediction]:
    """One prediction per (GPU, precision, checkpointing) that fits, at the largest fitting micro-batch; another
    where an instance's GPU count needs a smaller one to divide the effective batch (`per_gpu_batches`).

    Configurations not yet in the trace cache are traced side by side, one process each (`_trace_apart`); this
    process then reads their traces."""
    model_file = load_model_file()
    progress = progress or Progress()
    models = FakeModels()
    predictions = []
    traced_precisions = sorted({"bf16" if p == "fp16" else p for p in request.precisions},
                               key=("bf16", "tf32", "fp32").index)
    configurations = [(precision, checkpointing) for checkpointing in request.checkpointing
                      for precision in traced_precisions]
    began = time.monotonic()
    apart = _trace_apart(request, configurations)
    progress.seconds += time.monotonic() - began
    for traced_precision, checkpointing in configurations:
        began, traces_before = time.monotonic(), progress.traces
        found, traced = _configuration_predictions(request, traced_precision, checkpointing, models, model_file,
                                                   progress)
        predictions += found
        if on_trace:
            sizes = ", ".join(str(m) for m in sorted({*TRACED_MICRO_BATCHES, *traced.checked}))
            traces, seconds = apart.get((traced_precision, checkpointing), (0, 0.0))
            where = f"{traces} traced in a child process in {seconds:.1f} s" if traces else \
                f"{progress.traces - traces_before} traced"
            on_trace(f"{request.model} {traced_precision} ckpt-{checkpointing}: peaks at micro-batches {sizes} "
                     f"({where}, the rest from the cache; {time.monotonic() - began:.1f} s)")
        progress.seconds += time.monotonic() - began
    progress.traces += sum(traces for traces, _ in apart.values())
    return predictions


def _configuration_predictions(request: PlanCandidates, traced_precision: str, checkpointing: str,
                               models: FakeModels, model_file: ModelFile,
                               progress: Progress) -> tuple[list[PlanPrediction], Traced]:
    """The options of one traced configuration (fp16 reads bf16's trace) on every GPU."""
    traced = _trace_line(request, traced_precision, checkpointing, models, progress)
    _trace_largest_candidate(request, traced, traced_precision)
    predictions = []
    for precision in request.precisions:
        if ("bf16" if precision == "fp16" else precision) != traced_precision:
            continue
        for gpu in request.gpus:
            if precision == "fp16" and "bf16" in request.precisions and \
                    gpu_spec(gpu).peak_tflops["bf16_tflops"] is not None:
                _count(progress, "fp16 where bf16 runs (predicted alike)")
                continue
            predictions += _plan_predictions(request, traced, precision, checkpointing, gpu, model_file, progress)
    return predictions, traced


def _trace_apart(request: PlanCandidates,
                 configurations: list[tuple[str, str]]) -> dict[tuple[str, str], tuple[int, float]]:
    """Trace the configurations whose line is not in the disk cache side by side, one child process each (as many at
    once as this machine has cores), so the loop that follows reads them: (traces made, seconds) by configuration.
    Nothing when fewer than two need it, with one core, or with the cache off; a child that fails leaves its
    configuration to this process, which reports the failure as it would have."""
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    from bench.cache import cache_dir, enabled
    from bench.isolation import SIGNAL_CHECK_S, fork_server
    from bench.memory.traces import is_stored

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    todo = [(precision, checkpointing) for precision, checkpointing in configurations
            if not all(is_stored(request.cell(m, precision, checkpointing), "cuda") for m in TRACED_MICRO_BATCHES)]
    if len(todo) < 2 or cores < 2 or not enabled():
        return {}
    done: dict[tuple[str, str], tuple[int, float]] = {}
    pool = ProcessPoolExecutor(max_workers=min(len(todo), cores), mp_context=fork_server())
    try:
        pending = {pool.submit(_trace_configuration, request, *configuration, str(cache_dir())): configuration
                   for configuration in todo}
        while pending:
            finished, _ = wait(pending, timeout=SIGNAL_CHECK_S, return_when=FIRST_COMPLETED)  # Ctrl-C stays prompt
            for future in finished:
                configuration = pending.pop(future)
                if future.exception() is None:
                    done[configuration] = future.result()
    except BaseException:
        # An interrupt must not wait for a child's trace (Python 3.14's terminate_workers() does this).
        for process in list((pool._processes or {}).values()):
            process.terminate()
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return done


def _trace_configuration(request: PlanCandidates, precision: str, checkpointing: str,
                         cache_root: str) -> tuple[int, float]:
    """In a child process: trace what one configuration's options need into the disk cache at `cache_root` (the
    parent's: the fork server's environment is the one it started with); (traces, seconds)."""
    from bench.cache import CACHE_ENV, NO_CACHE_ENV

    os.environ[CACHE_ENV] = cache_root
    os.environ.pop(NO_CACHE_ENV, None)
    began, progress = time.monotonic(), Progress()
    _configuration_predictions(request, precision, checkpointing, FakeModels(), load_model_file(), progress)
    return progress.traces, time.monotonic() - began


def _trace_largest_candidate(request: PlanCandidates, traced: Traced, traced_precision: str) -> None:
    """Trace the largest micro-batch the line proposes to any GPU first: every other GPU's size then lies between two
    traced sizes, where the chord settles most of them without a trace (`Traced.bounds`)."""
    precisions = [p for p in request.precisions if ("bf16" if p == "fp16" else p) == traced_precision]
    candidates = [traced.line_candidate(gpu_spec(gpu).memory_gib, request.headroom, per_gpu)
                  for gpu in request.gpus if any(_has_peak(gpu, precision) for precision in precisions)
                  for per_gpu in request.per_gpu_batches(gpu)]
    largest = max(candidates, default=0)
    if largest > traced.high[0]:
        traced.peak_bytes(largest)


def _has_peak(gpu: str, precision: str) -> bool:
    try:
        gpu_rates(gpu_spec(gpu), precision)
    except NoDatasheetPeak:
        return False
    return True


def _trace_line(request: PlanCandidates, precision: str, checkpointing: str, models: FakeModels,
                progress: Progress) -> Traced:
    def counted(micro_batch: int) -> Trace:
        trace, fresh = traced(request.cell(micro_batch, precision, checkpointing), "cuda", models)
        progress.traces += fresh
        return trace

    low, high = (counted(m) for m in TRACED_MICRO_BATCHES)
    return Traced(*((m, trace.peak_bytes, trace.ops) for m, trace in zip(TRACED_MICRO_BATCHES, (low, high))),
                  traced_peak=lambda micro_batch: counted(micro_batch).peak_bytes,
                  grads_bytes=low.param_count * BYTES_PER_GRADIENT)


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


def _plan_predictions(request: PlanCandidates, traced: Traced, precision: str, checkpointing: str, gpu: str,
                      model_file: ModelFile, progress: Progress) -> list[PlanPrediction]:
    """The options of one GPU: the largest fitting micro-batch for each per-GPU share of the effective batch."""
    spec = gpu_spec(gpu)
    if not _has_peak(gpu, precision):  # before any trace of a larger micro-batch
        _count(progress, f"{precision} on GPUs without a datasheet peak for it")
        return []
    found = []
    for per_gpu in request.per_gpu_batches(gpu):
        micro_batch = traced.largest_fitting(spec.memory_gib, request.headroom, per_gpu)
        if micro_batch == 0:
            _count(progress, f"{precision} ckpt-{checkpointing}: not even micro-batch 1 fits")
            return found
        if micro_batch not in [prediction.cell.micro_batch for prediction in found]:
            found.append(_plan_prediction(request, traced, precision, checkpointing, spec, model_file, micro_batch))
    return found


def _plan_prediction(request: PlanCandidates, traced: Traced, precision: str, checkpointing: str, spec: GpuSpec,
                     model_file: ModelFile, micro_batch: int) -> PlanPrediction:
    cell = replace(request.cell(micro_batch, precision, checkpointing),
                   accum_steps=request.effective_batch // micro_batch)
    ops = traced.ops(micro_batch)
    if precision == "fp16":
        ops = ops.with_dtype("bfloat16", "float16")
    prediction = predict_on(cell, ops, spec, model_file)
    basis = f"{prediction.basis}, {prediction.step.bound}-bound" + \
        ("; fp16 from the bf16 trace" if precision == "fp16" else "")
    return PlanPrediction(cell, prediction, whole_segments(traced.settled_peak_bytes(micro_batch)),
                          traced.grads_bytes, basis)


def _count(progress: Progress, why: str) -> None:
    progress.refused[why] = progress.refused.get(why, 0) + 1
