"""Plan rows without measurements: memory from the estimator, speed from the throughput model.

For a model, image size and effective batch E, each (precision, checkpointing) is traced at two
micro-batches (`TRACED_MICRO_BATCHES`, K = 2, one fake trace each for memory and ops). Every op's
FLOPs and bytes are linear in the micro-batch, so the two traces give the ops at any size. Peak memory
is the largest of several phases' (each linear), so the line through two sizes is exact where the same
phase sets the peak and too low elsewhere (by up to 53 % for ViT-B/16 with checkpointing, where the
optimizer step sets the peak at small sizes): per GPU, the largest power-of-two micro-batch m that
divides E and fits (peak + headroom) on the line is checked with a full trace of m, and halved until
the trace fits; K = E / m is predicted on that GPU. Traces are kept in the disk cache (`bench.cache`). fp16 is read off bf16's trace (the same shapes; its GradScaler's
few ops are left out) and offered only on GPUs without a bf16 peak (T4, V100): where both run, the
model predicts them alike. The rows are `MeasuredRow`s with basis `predicted`, so `make_plan` ranks them
beside measured rows, and a measured row of the same option wins. They carry the fp32 gradient bytes, so a
multi-GPU instance scales as its interconnect predicts (`bench.speed.ddp`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from bench.cache import ESTIMATOR_SOURCES, DiskCache
from bench.cost.price import MeasuredRow
from bench.grid.cell import Cell
from bench.grid.model_ref import ModelSpec
from bench.measure.flops import flops_per_sample
from bench.measure.hardware import gpu_spec
from bench.measure.utilization import utilization_pct
from bench.memory.estimate import FakeModels
from bench.memory.fit import memory_fit
from bench.memory.probe import estimated_peak_bytes
from bench.results.keys import configuration_key
from bench.speed.ddp import BYTES_PER_GRADIENT
from bench.speed.model import NoDatasheetPeak, gpu_rates, step_time
from bench.speed.params import load_model_file
from bench.speed.trace import StepOps, trace_cell

TRACED_MICRO_BATCHES = (8, 16)
MEMORY_METHOD = ("memory: the estimator's peak (fake-tensor trace, reserved, K = 2) at the chosen micro-batch, found on "
                 f"the line through micro-batches {TRACED_MICRO_BATCHES} and checked by a trace of its own; + headroom "
                 "against the GPU's nominal memory")
DEFAULT_PRECISIONS = ("bf16", "fp16", "tf32")
_SEGMENT_BYTES = 2 * 2**20


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
    headroom: float = 0.10
    model_options: dict[str, Any] = field(default_factory=dict)
    """The cells' model fields beyond model and image_size (model_kwargs, in_chans, image_width, num_classes)."""

    def cell(self, micro_batch: int, precision: str, checkpointing: str) -> Cell:
        """A traced cell: K = 2, one warm-up and one measured step."""
        return Cell(experiment="plan", profile="cuda", model=self.model, image_size=self.image_size,
                    micro_batch=micro_batch, accum_steps=2, precision=precision, checkpointing=checkpointing,
                    optimizer=self.optimizer, channels_last=self.channels_last, warmup_steps=1, measured_steps=1,
                    **self.model_options)


@dataclass
class Traced:
    """The line through two traces (peak bytes and ops at any micro-batch), and full traces of the sizes chosen."""

    low: tuple[int, float, StepOps]
    high: tuple[int, float, StepOps]
    traced_peak: Callable[[int], float]
    """The estimator's peak at a micro-batch, from a full trace (or the disk cache)."""
    grads_bytes: int = 0
    """fp32 gradients of every parameter: what DDP all-reduces on a multi-GPU instance."""
    checked: dict[int, float] = field(default_factory=dict)

    def line_peak_bytes(self, micro_batch: int) -> float:
        (m1, p1, _), (m2, p2, _) = self.low, self.high
        return p1 + (p2 - p1) * (micro_batch - m1) / (m2 - m1)

    def peak_bytes(self, micro_batch: int) -> float:
        """The traced peak at `micro_batch` (each size traced once)."""
        if micro_batch not in self.checked:
            known = {self.low[0]: self.low[1], self.high[0]: self.high[1]}
            self.checked[micro_batch] = known.get(micro_batch) or self.traced_peak(micro_batch)
        return self.checked[micro_batch]

    def largest_fitting(self, capacity_gib: float, headroom: float, limit: int) -> int:
        """The largest power-of-two micro-batch <= limit that divides `limit` and fits (0: none): the line's
        answer (never too small: the line is at or below the peak at every power of two), checked by a trace and
        halved until it fits."""
        m = 1
        while m * 2 <= limit and limit % (m * 2) == 0 and \
                memory_fit(self.line_peak_bytes(m * 2), headroom, capacity_gib).fits:
            m *= 2
        while m >= 1 and not memory_fit(self.peak_bytes(m), headroom, capacity_gib).fits:
            m //= 2
        return m

    def ops(self, micro_batch: int) -> StepOps:
        return self.low[2].at_micro_batch(self.high[2], micro_batch)


@dataclass
class Progress:
    traces: int = 0
    seconds: float = 0.0
    refused: dict[str, int] = field(default_factory=dict)


def predicted_plan_rows(request: PlanCandidates, on_trace: Callable[[str], None] | None = None,
                        progress: Progress | None = None) -> list[MeasuredRow]:
    """One predicted row per (GPU, precision, checkpointing) that fits, at the largest fitting micro-batch."""
    model_file = load_model_file()
    progress = progress or Progress()
    models = FakeModels()
    rows = []
    traced_precisions = sorted({"bf16" if p == "fp16" else p for p in request.precisions},
                               key=("bf16", "tf32", "fp32").index)
    for checkpointing in request.checkpointing:
        for traced_precision in traced_precisions:
            began, traces_before = time.monotonic(), progress.traces
            traced = _trace_line(request, traced_precision, checkpointing, models, progress)
            for precision in request.precisions:
                if ("bf16" if precision == "fp16" else precision) != traced_precision:
                    continue
                for gpu in request.gpus:
                    if precision == "fp16" and "bf16" in request.precisions and \
                            gpu_spec(gpu).peak_tflops["bf16_tflops"] is not None:
                        _count(progress, "fp16 where bf16 runs (predicted alike)")
                        continue
                    row = _row(request, traced, precision, checkpointing, gpu, model_file, progress)
                    if row is not None:
                        rows.append(row)
            progress.seconds += time.monotonic() - began
            if on_trace:
                sizes = ", ".join(str(m) for m in sorted({*TRACED_MICRO_BATCHES, *traced.checked}))
                on_trace(f"{request.model} {traced_precision} ckpt-{checkpointing}: peaks at micro-batches {sizes} "
                         f"({progress.traces - traces_before} traced, the rest from the cache; "
                         f"{time.monotonic() - began:.1f} s)")
    return rows


def _trace_line(request: PlanCandidates, precision: str, checkpointing: str, models: FakeModels,
                progress: Progress) -> Traced:
    points = []
    for micro_batch in TRACED_MICRO_BATCHES:
        cell = request.cell(micro_batch, precision, checkpointing)
        key = {"cell": {k: v for k, v in cell.to_dict().items() if k != "experiment"}}
        stored = _TRACES.get(key)
        try:
            peak, ops = float(stored["peak_reserved_bytes"]), StepOps.from_json(stored["ops"])
            params = int(stored["param_count"])
        except (TypeError, KeyError, ValueError):  # absent (None), or written by another layout
            estimate, ops = trace_cell(cell, models)
            peak, params = float(estimate.peak_reserved_bytes), int(estimate.param_count)
            _TRACES.put(key, {"peak_reserved_bytes": peak, "ops": ops.to_json(), "param_count": params})
            progress.traces += 1
        points.append((micro_batch, peak, ops))

    def traced_peak(micro_batch: int) -> float:
        peak, traced = estimated_peak_bytes(request.cell(micro_batch, precision, checkpointing), "cuda", models)
        progress.traces += traced
        return peak

    return Traced(*points, traced_peak=traced_peak, grads_bytes=params * BYTES_PER_GRADIENT)


_TRACES = DiskCache("plan-traces", sources=(*ESTIMATOR_SOURCES, "speed/trace.py", "speed/ops.py"))


def _row(request: PlanCandidates, traced: Traced, precision: str, checkpointing: str, gpu: str, model_file,
         progress: Progress) -> MeasuredRow | None:
    spec = gpu_spec(gpu)
    try:
        rates = gpu_rates(spec, precision)
    except NoDatasheetPeak:
        _count(progress, f"{precision} on GPUs without a datasheet peak for it")
        return None
    micro_batch = traced.largest_fitting(spec.memory_gib, request.headroom, request.effective_batch)
    if micro_batch == 0:
        _count(progress, f"{precision} ckpt-{checkpointing}: not even micro-batch 1 fits")
        return None
    accum_steps = request.effective_batch // micro_batch
    ops = traced.ops(micro_batch)
    if precision == "fp16":
        ops = ops.with_dtype("bfloat16", "float16")
    step = step_time(ops.for_step(accum_steps), rates, model_file.params)
    samples_per_s = request.effective_batch / step.step_time_s
    flops = flops_per_sample(ModelSpec.of(request.cell(1, precision, checkpointing)), request.image_size,
                             checkpointing)
    peak = _whole_segments(traced.peak_bytes(micro_batch))
    basis = f"{model_file.basis(spec)}, {step.bound}-bound" + ("; fp16 from the bf16 trace" if precision == "fp16" else "")
    return MeasuredRow(cell_id=f"predicted-{request.model}-{request.image_size}px-{micro_batch}x{accum_steps}-"
                               f"{precision}-ckpt_{checkpointing}-{request.optimizer}-{gpu}",
                       experiment="plan", profile="cuda", model=request.model, image_size=request.image_size,
                       micro_batch=micro_batch, accum_steps=accum_steps, precision=precision,
                       checkpointing=checkpointing, optimizer=request.optimizer, device_type="cuda",
                       device_name=f"predicted for {gpu}", samples_per_s=samples_per_s,
                       mfu_pct=utilization_pct(flops.model, samples_per_s, rates.headline_peak_flops_per_s),
                       model_flops_per_sample=flops.model, peak_memory_bytes=peak, peak_reserved_bytes=peak,
                       memory_source="estimate_cuda_allocator", predicted_gpu=gpu, speed_basis=basis,
                       grads_bytes=traced.grads_bytes or None,
                       axes=configuration_key(replace(request.cell(micro_batch, precision, checkpointing),
                                                      accum_steps=accum_steps).to_dict()))


def _count(progress: Progress, why: str) -> None:
    progress.refused[why] = progress.refused.get(why, 0) + 1


def _whole_segments(nbytes: float) -> int:
    return int(-(-nbytes // _SEGMENT_BYTES) * _SEGMENT_BYTES)
