"""The throughput model's options for `bench plan`, without a grid: for a model, image size and effective batch E, each
(precision, checkpointing) is traced at two micro-batches (`bench.speed.predict.TRACED_MICRO_BATCHES`, K = 2, one
fake trace each for memory and ops). Every op's FLOPs and bytes are linear in the micro-batch, so the two traces
give the ops at any size. Peak memory is the largest of several phases' (each linear), so the line through two sizes
is exact where the same phase sets the peak and too low elsewhere (by up to 53 % for ViT-B/16 with checkpointing,
where the optimizer step sets the peak at small sizes): per GPU, the largest power-of-two micro-batch m that divides
E and fits (peak + headroom) on the line is checked (by the bounds between traced sizes where they settle it,
`Traced.bounds`, else by a full trace of m) and halved until it fits; K = E / m is predicted on that GPU
(`bench.speed.predict.predict_on`, as for a grid's cell). Every trace is the one of its configuration that estimate,
probe and plan share (`bench.memory.traces`); configurations not yet in the cache are traced side by side, one child
process each (`_trace_apart`). fp16 is read off bf16's trace (the same shapes; its GradScaler's few ops are left
out) and offered only on GPUs without a bf16 peak (T4, V100): where both run, the model predicts them alike. Each
prediction carries the fp32 gradient bytes, so a multi-GPU instance scales as its interconnect predicts
(`bench.speed.ddp`); `bench.planner.rows.predicted_row` makes it a row to price.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from bench.grid.cell import Cell
from bench.measure.hardware import GpuSpec, gpu_spec
from bench.measure.host import usable_cpus
from bench.measure.op_table import StepOps
from bench.memory.allocator import CUDA_SEGMENT_BYTES, whole_segments
from bench.memory.fake_models import FakeModels
from bench.memory.fit import DEFAULT_HEADROOM, memory_fit
from bench.memory.probe import search_largest
from bench.memory.traces import Trace, traced
from bench.speed.ddp import BYTES_PER_GRADIENT
from bench.speed.model import NoDatasheetPeak, gpu_rates
from bench.speed.params import ModelFile, load_model_file
from bench.speed.predict import TRACED_MICRO_BATCHES, Prediction, predict_on
from bench.units import MIB

MEMORY_METHOD = ("memory: the estimator's allocated peak in whole 2 MiB segments (fake-tensor trace, K = 2) at the chosen "
                 f"micro-batch, found on the line through micro-batches {TRACED_MICRO_BATCHES} and checked by a trace of "
                 "the largest size proposed; between traced sizes the chord bounds the peak (it is convex in the "
                 "micro-batch) and stands for it where the bounds lie within 0.25 %, sizes they cannot settle are "
                 "traced; + headroom against the GPU's nominal memory, which covers the allocator's fragmentation "
                 "(bench estimate's reserved replays it: not convex, so not bounded between sizes)")
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
SETTLED_WITHIN_SHARE = 0.0025
"""Bounds this close settle a size's peak without a trace of its own: within 16 MiB, or 0.25 % of the upper bound
(the peak reported, never below the trace's). ViT-L/16 at 224 px, traced at 8, 16 and 512: the bounds at 32 to 256 lie
0.11-0.21 % apart (16-103 MiB, 14-48 GiB peaks), and the upper one 0.02 % above the traced peak at 64; a trace of
its own costs 3 s there, and the estimator's own error against measured peaks is tens of times 0.25 %."""


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
        >>> traced.largest_fitting(4, 0.0, limit=64), traced.largest_fitting(4, 0.0, limit=24)  # 4 GiB: m <= 26
        (16, 8)
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
        """The peak at `micro_batch`: traced, or the upper bound where the bounds lie within `SETTLED_WITHIN_BYTES` or
        `SETTLED_WITHIN_SHARE` of it (never below the trace's peak, at most that above it); otherwise traced now.

        >>> flat, curved = StepOps({}, 1), lambda m: 30e9 + 0.125e9 * m + 2e3 * m * m  # convex: a quadratic term
        >>> traced = Traced((8, curved(8), flat), (16, curved(16), flat), traced_peak=curved)
        >>> traced.peak_bytes(512) > traced.settled_peak_bytes(64) > curved(64)  # bounds 68 MiB (0.19 %) apart
        True
        >>> sorted(traced.checked)  # so 64 was not traced
        [512]
        """
        low, high = self.bounds(micro_batch)
        settled = high - low <= max(SETTLED_WITHIN_BYTES, SETTLED_WITHIN_SHARE * high)
        return high if settled else self.peak_bytes(micro_batch)

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
        """The largest power-of-two micro-batch <= limit that divides `limit` and fits (0: none), found by the one
        largest-fitting search (`bench.memory.probe.search_largest`) over the powers of two, from `line_candidate`:
        a size the bounds rule out or settle costs no trace, the rest one trace each."""
        def fits(n: int) -> bool:  # n = exponent + 1, so that 0 says "none" as the search has it
            micro_batch = 2 ** (n - 1)
            low, high = self.bounds(micro_batch)
            if not memory_fit(low, headroom, capacity_gib).fits:
                return False
            return memory_fit(high, headroom, capacity_gib).fits or \
                memory_fit(self.peak_bytes(micro_batch), headroom, capacity_gib).fits

        top = (limit & -limit).bit_length()  # the largest power of two dividing `limit`, as its n
        guess = self.line_candidate(capacity_gib, headroom, limit).bit_length()
        found = search_largest(fits, guess, max_batch=top, first_stride=1).largest
        return 2 ** (found - 1) if found else 0

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
    configurations = _configurations(request)
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


TRACING_CHILD_PRELOAD = ("bench.memory.estimate", "bench.train.models", __name__)
"""Imported by the fork server the side-by-side traces fork from (torch, timm, this module and what it reads with:
pandas), once for all of them."""


def _configurations(request: PlanCandidates) -> list[tuple[str, str]]:
    """The (traced precision, checkpointing) pairs the plan traces: fp16 is traced as bf16 (predicted alike)."""
    traced_precisions = sorted({"bf16" if p == "fp16" else p for p in request.precisions},
                               key=("bf16", "tf32", "fp32").index)
    return [(precision, checkpointing) for checkpointing in request.checkpointing for precision in traced_precisions]


def _to_trace_apart(request: PlanCandidates, configurations: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The configurations `_trace_apart` traces in child processes: those whose line is not in the disk cache, where
    at least two are, this machine has two cores and the cache is on (else none)."""
    from bench.memory.traces import is_stored, traces_beside

    todo = [(precision, checkpointing) for precision, checkpointing in configurations
            if not all(is_stored(request.cell(m, precision, checkpointing), "cuda") for m in TRACED_MICRO_BATCHES)]
    return todo if len(todo) >= 2 and traces_beside() else []


def check_before_tracing(request: PlanCandidates, check: Callable[[Cell], None], cell: Cell) -> None:
    """`check(cell)`, the model's check before any trace. Where the plan will trace side by side, it runs first in a
    child of the fork server the traces fork from (started here, importing torch and timm once for all of them), and
    its answer lands in the disk cache: this process then checks from the cache and never imports torch (it reads the
    children's traces from the cache too). A refusal in the child is raised here as it was raised there."""
    from bench.cache import cache_dir
    from bench.isolation import call_in_child, preload_in_children

    if _to_trace_apart(request, _configurations(request)):
        for module in TRACING_CHILD_PRELOAD:
            preload_in_children(module)
        call_in_child(_check_in_child, check, cell, str(cache_dir()))
    check(cell)


def _check_in_child(check: Callable[[Cell], None], cell: Cell, cache_root: str) -> None:
    """In a child process: the check, storing what it learns in the parent's cache."""
    from bench.cache import use_cache_folder

    use_cache_folder(cache_root)
    check(cell)


def _trace_apart(request: PlanCandidates,
                 configurations: list[tuple[str, str]]) -> dict[tuple[str, str], tuple[int, float]]:
    """Trace the configurations whose line is not in the disk cache side by side, one child process each (as many at
    once as this machine has cores), so the loop that follows reads them: (traces made, seconds) by configuration.
    Nothing when fewer than two need it, with one core, or with the cache off; a child that fails leaves its
    configuration to this process, which reports the failure as it would have."""
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    from bench.cache import cache_dir
    from bench.isolation import SIGNAL_CHECK_S, fork_server

    cores = usable_cpus()
    todo = _to_trace_apart(request, configurations)
    if not todo:
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
    from bench.cache import use_cache_folder

    use_cache_folder(cache_root)
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
    return Traced(*((m, trace.allocated_peak_bytes, trace.ops) for m, trace in zip(TRACED_MICRO_BATCHES, (low, high))),
                  traced_peak=lambda micro_batch: counted(micro_batch).allocated_peak_bytes,
                  grads_bytes=low.param_count * BYTES_PER_GRADIENT)


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
