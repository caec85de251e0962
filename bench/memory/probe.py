"""The largest micro-batch that fits: predicted by the estimator, then found by real runs.

Each real trial is one cell in its own process (`bench.run.cell_process.run_isolated`, with its
memory cap); out-of-memory means "too big". The search starts from the estimate and
steps away from it by a stride that doubles until the limit is bracketed, then bisects;
Lightning's BatchSizeFinder doubles from the start instead (`doubling_search`), which the
probe reports beside its own count.
"""

from __future__ import annotations

import os
import textwrap
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Iterable

from bench.errors import BadInput, refused_step
from bench.frames import Tabular
from bench.grid.cell import Cell, Profile, axes, probe_options
from bench.grid.model_ref import ModelSpec
from bench.isolation import fork_server
from bench.measure.device import DeviceInfo
from bench.memory.budget import Budget
from bench.memory.fake_models import FakeModels
from bench.memory.traces import traced
from bench.train.model_bounds import bounds_of
from bench.units import MIB, gib, percent

if TYPE_CHECKING:
    from bench.memory.estimate import Target
    from bench.memory.validate import Agreement

MAX_MICRO_BATCH = 65536
"""The search stops here even if everything fits."""
# On a CPU the cap is on address-space growth (RLIMIT_AS, `bench.run.cell_measurement`), which holds more
# than the tracked tensors: allocator and oneDNN buffers, thread stacks and malloc arenas.
# Measured here (2 cores, test_resnet 64 px fp32 sgd; real limits 193 at 0.5 GiB and 639 at
# 1 GiB, tensor estimates 542 and 1090): growth = 1.23 x tensors + 283 MiB. A calibration of
# this machine, not a law: the trials find the real limit whatever it says.
CPU_ADDRESS_SPACE_PER_TENSOR_BYTE = 1.23
CPU_ADDRESS_SPACE_OVERHEAD_BYTES = 283 * MIB

Fits = Callable[[int], bool]
OnTrial = Callable[["Trial"], None]


@dataclass(frozen=True)
class Trial:
    """One trial as it ends: what was tried, whether it fitted, how long it took, and the bracket so far."""

    kind: str
    """"estimate" (a fake step of the estimator) or "device" (a real cell in its own process)."""
    number: int
    micro_batch: int
    fits: bool
    elapsed_s: float
    largest_fitting: int
    """The largest micro-batch that fitted so far (0: none yet)."""
    smallest_failing: int | None
    """The smallest that did not fit so far (None: none yet)."""

    def describe(self) -> str:
        """`device trial 3: micro-batch 143 fits (4.1 s); limit in [143, 150)`."""
        high = "?" if self.smallest_failing is None else str(self.smallest_failing)
        outcome = "fits" if self.fits else "does not fit"
        return (f"{self.kind} trial {self.number}: micro-batch {self.micro_batch} {outcome} ({self.elapsed_s:.1f} s); "
                f"limit in [{self.largest_fitting}, {high})")


def reporting(fits: Fits, kind: str, on_trial: OnTrial | None) -> Fits:
    """`fits`, timed, calling `on_trial` after every call with the bracket narrowed so far.

    >>> seen = []
    >>> check = reporting(lambda n: n <= 10, "estimate", seen.append)
    >>> check(8), check(12)
    (True, False)
    >>> seen[-1].largest_fitting, seen[-1].smallest_failing
    (8, 12)
    """
    if on_trial is None:
        return fits
    history: list[tuple[int, bool]] = []

    def timed(micro_batch: int) -> bool:
        began = time.monotonic()
        fitted = fits(micro_batch)
        history.append((micro_batch, fitted))
        on_trial(Trial(kind, len(history), micro_batch, fitted, time.monotonic() - began, *_bracket(history)))
        return fitted

    return timed


def _bracket(answers: Iterable[tuple[int, bool]]) -> tuple[int, int | None]:
    """The largest size that fitted (0: none) and the smallest that did not (None: none), of `answers`.

    >>> _bracket([(8, True), (16, False), (12, False)])
    (8, 12)
    """
    answers = list(answers)
    return (max((n for n, ok in answers if ok), default=0),
            min((n for n, ok in answers if not ok), default=None))


class ProbeError(BadInput):
    """A trial failed for a reason other than memory (the configuration cannot run); one line."""


@dataclass(frozen=True)
class ProbeConfig:
    """One configuration of the grid's axes, with the micro-batch left open.

    >>> config = ProbeConfig.of("resnet50", precision="bf16")
    >>> config.cell(32, "cuda").micro_batch, config.base.image_size
    (32, 224)
    """

    base: Cell
    """The configuration; each trial replaces its micro-batch (and profile)."""

    @classmethod
    def of(cls, model: str, accum_steps: int = 1, **settings: Any) -> ProbeConfig:
        """`model` with `settings` for the probe's axes (`probe_options`) and their defaults for the rest."""
        values = {**probe_options(), **settings}
        return cls(Cell(experiment="probe", profile="cuda", model=model, micro_batch=1, accum_steps=accum_steps,
                        warmup_steps=1, measured_steps=1, **values))

    def cell(self, micro_batch: int, profile: Profile) -> Cell:
        """The cell a trial runs: one warm-up and one measured step, enough to reach the peak."""
        return replace(self.base, micro_batch=micro_batch, profile=profile)

    @property
    def smallest_micro_batch(self) -> int:
        """2 for a BatchNorm model (one sample has no batch statistics to train on), else 1."""
        bounds = bounds_of(self.base)  # a model that cannot be built says so at its first trace
        return 2 if bounds and bounds.batch_norm else 1

    def describe(self) -> str:
        """`resnet50 224px fp32 ckpt off adamw, K=1`, plus the axes away from their default."""
        cell = self.base
        extras = "".join(f", {name} {getattr(cell, name)}" for name, default in probe_options().items()
                         if axes()[name].extra and getattr(cell, name) != default)
        return (f"{ModelSpec.of(cell).describe()} {cell.precision} ckpt {cell.checkpointing} "
                f"{cell.optimizer}{' channels-last' if cell.channels_last else ''}, K={cell.accum_steps}{extras}")


@dataclass(frozen=True)
class Search:
    """The largest micro-batch that fitted (0: not even 1) and every (micro-batch, fitted) trial."""

    largest: int
    trials: tuple[tuple[int, bool], ...]


def search_largest(fits: Fits, guess: int, max_batch: int = MAX_MICRO_BATCH, smallest: int = 1,
                   first_stride: int | None = None) -> Search:
    """The largest n in [smallest, max_batch] with fits(n) (0: none), for a `fits` true up to some n and
    false above.

    From `guess`, step away by a stride (`first_stride`, by default a sixteenth of the guess, doubling
    each step) until the limit is bracketed, then bisect. A guess within a few percent costs about
    2 + log2(guess / 16) trials; an exact guess with `first_stride=1` costs 2.

    >>> search_largest(lambda n: n <= 100, guess=96).trials
    ((96, True), (102, False), (99, True), (100, True), (101, False))
    >>> search_largest(lambda n: n <= 100, guess=200).largest
    100
    >>> search_largest(lambda n: n <= 1, guess=4, smallest=2)
    Search(largest=0, trials=((4, False), (3, False), (2, False)))
    >>> search_largest(lambda n: n <= 100, guess=100, first_stride=1).trials
    ((100, True), (101, False))
    """
    trials: list[tuple[int, bool]] = []

    def check(n: int) -> bool:
        trials.append((n, fits(n)))
        return trials[-1][1]

    guess = min(max(guess, smallest), max_batch)
    stride = first_stride or max(1, guess // 16)
    if check(guess):
        low, high = guess, None
        while high is None:
            if low == max_batch:
                return Search(low, tuple(trials))
            candidate = min(low + stride, max_batch)
            if check(candidate):
                low, stride = candidate, stride * 2
            else:
                high = candidate
    else:
        low, high = smallest - 1, guess
        while low == smallest - 1 and high > smallest:
            candidate = max(high - stride, smallest)
            if check(candidate):
                low = candidate
            else:
                high, stride = candidate, stride * 2
        if low == smallest - 1:
            return Search(0, tuple(trials))
    return _bisect(check, low, high, trials)


def doubling_search(fits: Fits, max_batch: int = MAX_MICRO_BATCH) -> Search:
    """Lightning's BatchSizeFinder (binsearch mode) from 1: double until it fails, then bisect.

    >>> len(doubling_search(lambda n: n <= 100).trials)
    14
    """
    trials: list[tuple[int, bool]] = []

    def check(n: int) -> bool:
        trials.append((n, fits(n)))
        return trials[-1][1]

    low, candidate = 0, 1
    while check(candidate):
        low = candidate
        if candidate == max_batch:
            return Search(low, tuple(trials))
        candidate = min(candidate * 2, max_batch)
    return _bisect(check, low, candidate, trials)


def _bisect(check: Fits, low: int, high: int, trials: list[tuple[int, bool]]) -> Search:
    # low fits (or is 0), high does not: halve the gap until they are neighbours.
    while high - low > 1:
        middle = (low + high) // 2
        if check(middle):
            low = middle
        else:
            high = middle
    return Search(low, tuple(trials))


LINE_MICRO_BATCHES = (16, 64)
"""Multiples of the smallest micro-batch traced for the first line (a fake step costs the same at any size). Sizes
where activations already set the peak, so the first line lands on the answer: on 7 configurations (ResNet-50
on A100-40GB and bf16 on L4, ViT-B/16 on A100-80GB and fp16 on T4, EfficientNet-B0 on A10G, ConvNeXt-T bf16 on
H100, ResNet-18 bf16 checkpointed on RTX-3090) every search took 4 fake steps (the line, the answer, the next size
up) where 1 and 8 times took 4-5 (34 steps against 28), with the same 7 answers; ViT-L/16 on a T4 (37), ResNet-50
at 512 px in 6 GiB (12) and in 1 GiB (6): the same answers, 4 steps each. Where not even the smallest fits, one
more step (3, not 2)."""
SECANT_STEPS = 2
"""Refinements of the line through the two sizes nearest the budget before the answer is checked: the peak
is affine in the micro-batch only once activations set it (at small sizes the optimizer step may)."""


def estimated_peak_bytes(cell: Cell, target: Target, models: FakeModels | None = None) -> tuple[float, bool]:
    """The estimator's peak of `cell` (`Trace.peak_bytes`), and whether it was traced now (False: this process or
    the disk cache had its trace, `bench.memory.traces`)."""
    trace, fresh = traced(cell, target, models)
    return trace.peak_bytes, fresh


class EstimatedPeaks:
    """The estimator's peak of one configuration, by micro-batch: each size traced once per process and kept in
    the disk cache (`estimated_peak_bytes`), so a second GPU, a second `--headroom` or a second command reuses it.
    """

    def __init__(self, config: ProbeConfig, target: Target, models: FakeModels | None = None):
        self.config, self.target = config, target
        self.models = models
        self.peaks: dict[int, float] = {}
        self.traced = 0

    def peak_bytes(self, micro_batch: int) -> float:
        if micro_batch not in self.peaks:
            profile: Profile = "cuda" if self.target == "cuda" else "cpu"
            self.models = self.models or FakeModels()
            peak, traced = estimated_peak_bytes(self.config.cell(micro_batch, profile), self.target, self.models)
            self.peaks[micro_batch] = peak
            self.traced += traced
        return self.peaks[micro_batch]


def predict_largest(config: ProbeConfig, budget_bytes: float, target: Target, *, headroom: float = 0.0,
                    scale: float = 1.0, extra_bytes: int = 0, peaks: EstimatedPeaks | None = None,
                    on_trial: OnTrial | None = None) -> Search:
    """The largest micro-batch whose estimated peak x scale + extra_bytes, times (1 + headroom), fits.

    Peak memory is affine in the micro-batch once activations set it: a line through two traced sizes
    (`LINE_MICRO_BATCHES`), redrawn through the sizes nearest the budget (`SECANT_STEPS`), gives the answer,
    which is then checked with the next size up on the estimator (fake steps, not device runs); the search
    steps further only where the line was off. `Search.trials` holds every size consulted, once.
    """
    peaks = peaks or EstimatedPeaks(config, target)
    consulted: dict[int, bool] = {}

    def need_bytes(micro_batch: int) -> float:
        return (peaks.peak_bytes(micro_batch) * scale + extra_bytes) * (1 + headroom)

    def check(micro_batch: int) -> bool:
        if micro_batch not in consulted:
            consulted[micro_batch] = need_bytes(micro_batch) <= budget_bytes
        return consulted[micro_batch]

    reported = reporting(check, "estimate", on_trial)
    smallest = config.smallest_micro_batch
    guess = smallest
    for micro_batch in (smallest * multiple for multiple in LINE_MICRO_BATCHES):
        reported(micro_batch)
    for _ in range(SECANT_STEPS + 1):
        guess = _line_guess({n: need_bytes(n) for n in consulted}, budget_bytes, smallest)
        if _settled(consulted, guess) is not None:
            break
        reported(guess)

    def known_or_traced(micro_batch: int) -> bool:
        answer = _settled(consulted, micro_batch)
        return reported(micro_batch) if answer is None else answer

    found = search_largest(known_or_traced, guess, smallest=smallest, first_stride=1)
    return Search(found.largest, tuple(consulted.items()))


def _settled(consulted: dict[int, bool], micro_batch: int) -> bool | None:
    """`micro_batch`'s answer where the sizes consulted already give it (at or below one that fits, at or above
    one that does not: peaks rise with the micro-batch, as the search assumes), else None: it needs a trace.
    Without it a line's guess, or the search stepping down from a failing one, traced a size below one known to fit
    (ConvNeXt-T bf16 on an RTX 4090: 361 after 362 fitted).

    >>> [_settled({8: True, 12: False}, n) for n in (5, 8, 10, 13)]
    [True, True, None, False]
    """
    if micro_batch in consulted:
        return consulted[micro_batch]
    fitting, failing = _bracket(consulted.items())
    if failing is not None and fitting > failing:  # sizes that disagree with a single limit settle nothing
        return None
    if micro_batch <= fitting:
        return True
    return False if failing is not None and micro_batch >= failing else None


def _line_guess(needs: dict[int, float], budget_bytes: float, smallest: int) -> int:
    """Where the line through the two sizes nearest the budget (one each side where there are both) meets it.

    >>> _line_guess({2: 10.0, 16: 24.0}, 100.0, 2)
    92
    """
    below = sorted(n for n, need in needs.items() if need <= budget_bytes)
    above = sorted(n for n, need in needs.items() if need > budget_bytes)
    a, b = (below[-1], above[0]) if below and above else tuple(sorted(needs, key=lambda n: abs(needs[n] - budget_bytes))[:2])
    a, b = sorted((a, b))
    per_sample = max((needs[b] - needs[a]) / (b - a), 1.0)
    return min(max(int((budget_bytes - needs[a]) // per_sample) + a, smallest), MAX_MICRO_BATCH)


def trial_on_device(config: ProbeConfig, device: DeviceInfo, memory_limit_gib: float | None,
                    timeout_s: float) -> Fits:
    """A `fits` that runs one cell in a fresh child process: ok fits, oom does not, anything else raises."""
    from bench.measure.peak import PeakFlops  # a trial runs the measurement stack; an estimate needs none of it
    from bench.run.cell_measurement import CellTask
    from bench.run.cell_process import run_isolated

    context = fork_server()
    peak = PeakFlops(None, "probe: throughput not measured")

    def fits(micro_batch: int) -> bool:
        task = CellTask(config.cell(micro_batch, device.type), device, peak, None, memory_limit_gib,
                        runner_pid=os.getpid())
        outcome = run_isolated(task, timeout_s, context)
        if outcome["status"] in ("ok", "oom"):
            return outcome["status"] == "ok"
        raise ProbeError(f"micro-batch {micro_batch}: {outcome['status']}: {outcome.get('error_type')}: "
                         f"{outcome.get('error_message')}")

    return fits


@dataclass(frozen=True)
class ProbeResult(Tabular):
    """The estimator's answer and, when trials ran, the device's."""

    budget_bytes: float
    predicted: Search
    found: Search | None = None
    predicted_peaks: dict[int, float] = field(default_factory=dict)
    """The estimator's peak (bytes, before headroom) at each micro-batch it traced or read from the cache."""
    traced_steps: int = 0
    """Fake steps this answer traced; the rest of `predicted_peaks` came from this process or the disk cache."""

    def peak_at(self, micro_batch: int) -> float | None:
        return self.predicted_peaks.get(micro_batch)

    def frame_rows(self) -> list[dict]:
        """Every trial, the estimator's then the device's, with the estimator's peak where it traced that size."""
        searches = [("estimate", self.predicted)] + ([("device", self.found)] if self.found else [])
        return [{"trial": kind, "micro_batch": micro_batch, "fits": fits,
                 "predicted_peak_bytes": self.peak_at(micro_batch)}
                for kind, search in searches for micro_batch, fits in search.trials]

    @property
    def doubling_trials(self) -> int | None:
        """Trials Lightning-style doubling from 1 takes to reach the found limit (None before trials)."""
        if self.found is None:
            return None
        limit = self.found.largest
        return len(doubling_search(lambda n: n <= limit).trials)


def probe_from_estimate(config: ProbeConfig, budget: Budget, on_trial: OnTrial | None = None,
                        peaks: EstimatedPeaks | None = None) -> ProbeResult:
    """The estimator's answer for a GPU (`--gpu`, `--memory-gib`): no device runs anything. Pass one
    `peaks` to several calls (several GPUs) and each micro-batch is traced once."""
    peaks = peaks or EstimatedPeaks(config, "cuda")
    traced_before = peaks.traced
    search = predict_largest(config, budget.nbytes, "cuda", headroom=budget.headroom, peaks=peaks, on_trial=on_trial)
    return ProbeResult(budget.nbytes, search, predicted_peaks=dict(peaks.peaks),
                       traced_steps=peaks.traced - traced_before)


def probe_on_device(config: ProbeConfig, budget: Budget, memory_limit_gib: float | None,
                    timeout_s: float, on_trial: OnTrial | None = None) -> ProbeResult:
    """Predict from the estimate, then find the limit by real trials starting from the prediction.

    On a CPU the cap is on address-space growth, which holds more than tensors: the
    prediction applies this machine's calibration (`CPU_ADDRESS_SPACE_*`).
    """
    device = budget.device
    if device.type == "cuda":
        predicted = predict_largest(config, budget.nbytes, "cuda", on_trial=on_trial)
    else:
        predicted = predict_largest(config, budget.nbytes, "cpu", scale=CPU_ADDRESS_SPACE_PER_TENSOR_BYTE,
                                    extra_bytes=CPU_ADDRESS_SPACE_OVERHEAD_BYTES, on_trial=on_trial)
    fits = reporting(trial_on_device(config, device, memory_limit_gib, timeout_s), "device", on_trial)
    smallest = config.smallest_micro_batch
    return ProbeResult(budget.nbytes, predicted, search_largest(fits, max(predicted.largest, smallest),
                                                                smallest=smallest))


@dataclass(frozen=True)
class BudgetAnswer:
    """A probe's answer for one budget, and how far such an answer has been right."""

    budget: Budget
    result: ProbeResult
    agreement: Agreement | None
    """The estimator's measured agreement with public fit/OOM rows at the budget's headroom, with the model's
    family's share (`bench.memory.validate.agreement`); None without the repository's validation rows."""


@dataclass(frozen=True)
class ProbeReport:
    """What `bench probe` answers: the configuration, then one answer per budget asked for."""

    config: ProbeConfig
    answers: tuple[BudgetAnswer, ...]

    @property
    def every_budget_fits_one(self) -> bool:
        """Some micro-batch fits every budget (the command's exit status)."""
        return all((answer.result.found or answer.result.predicted).largest > 0 for answer in self.answers)


def probe_budgets(config: ProbeConfig, budgets: list[Budget], *, memory_limit_gib: float | None = None,
                  timeout_s: float = 600.0, on_trial: OnTrial | None = None,
                  on_text: Callable[[str], None] | None = None) -> ProbeReport:
    """The largest micro-batch of `config` for each budget: from the estimator alone for a GPU or a size (each
    micro-batch traced once for all of them), by real trials where the budget has a device. `on_text` gets a line as
    each budget's probe begins, `on_trial` each trial as it ends. A model that refuses the step is one
    `ModelRefused` line."""
    from bench.memory.validate import agreement  # reads the committed validation rows

    if any(budget.device is not None for budget in budgets):  # trials on a device: cells, forked from the server
        from bench.run import start_cell_server

        start_cell_server()  # its imports run beside the estimator's traces that come first
    peaks = EstimatedPeaks(config, "cuda")
    answers = []
    for budget in budgets:
        if on_text:
            on_text(f"probe: {config.describe()}; budget {budget.source}")
        with refused_step(config.base.model, config.describe()):
            result = (probe_from_estimate(config, budget, on_trial=on_trial, peaks=peaks) if budget.device is None else
                      probe_on_device(config, budget, memory_limit_gib, timeout_s, on_trial=on_trial))
        answers.append((budget, result))
    agreements = {headroom: agreement(headroom, model=config.base.model)
                  for headroom in {budget.headroom for budget, _ in answers}}
    return ProbeReport(config, tuple(BudgetAnswer(budget, result, agreements[budget.headroom])
                                     for budget, result in answers))


def describe_probe(config: ProbeConfig, budget: Budget, result: ProbeResult, agreement: str = "") -> str:
    """What the probe found, in a few lines of at most ~110 characters; `agreement`: the estimator's measured
    agreement with public fit/OOM rows (`bench.memory.validate.agreement`), said under the answer."""
    room = f", {percent(budget.headroom)} headroom kept free" if budget.headroom else ""
    lines = [f"{config.describe()}; budget {gib(budget.nbytes)}: {budget.source}{room}"]
    if config.smallest_micro_batch > 1:
        lines.append(f"starts at micro-batch {config.smallest_micro_batch}: {config.base.model} has BatchNorm, "
                     "which cannot train on one sample")
    largest = result.predicted.largest
    answer = f"predicted largest micro-batch: {largest}"
    at, above = result.peak_at(largest), result.peak_at(largest + 1)
    # Enough digits that the size that fits and the one that does not never print the same figure as the budget.
    decimals = distinct_decimals([budget.nbytes] + [peak * (1 + budget.headroom) for peak in (at, above)
                                                   if peak is not None])
    if at is not None:
        answer += f" (peak {_gib(at, budget.headroom, decimals)})"
    if above is not None:
        answer += f"; {largest + 1} needs {_gib(above, budget.headroom, decimals)}"
    if at is not None or above is not None:
        answer += f"; budget {_gib(budget.nbytes, 0.0, decimals)}"
    lines.append(answer)
    steps = len(result.predicted.trials)
    reused = f"; {steps - result.traced_steps} reused" if steps > result.traced_steps else ""
    lines.append(f"  estimator: {steps} sizes ({', '.join(str(n) for n, _ in result.predicted.trials)}{reused}): "
                 "a line, redrawn near the budget, answer checked")
    if result.found is not None:
        lines.append(f"found largest micro-batch:     {result.found.largest} "
                     f"({len(result.found.trials)} trials on {budget.device.name}; doubling from 1 "
                     f"would take {result.doubling_trials})")
        lines.append("trials: " + ", ".join(f"{n} {'ok' if ok else 'oom'}" for n, ok in result.found.trials))
    if agreement:
        lines += textwrap.wrap(agreement, 110, initial_indent="  ", subsequent_indent="      ")
    return "\n".join(lines)


def probe_text(report: ProbeReport) -> str:
    """`bench probe`'s answer in text: each budget's `describe_probe`, with the estimator's measured agreement."""
    from bench.memory.validate import agreement_text

    return "\n\n".join(describe_probe(report.config, answer.budget, answer.result, agreement_text(answer.agreement))
                       for answer in report.answers)


def distinct_decimals(nbytes: list[float], fewest: int = 2, most: int = 9) -> int:
    """The fewest decimals (from `fewest`) at which byte counts that differ print different GiB figures.

    >>> distinct_decimals([24 * 2**30, 24 * 2**30 - 2**20, 24 * 2**30 + 2**21])  # 24.000, 23.999, 24.002
    3
    >>> distinct_decimals([2**30, 2**31])
    2
    """
    values = sorted(set(nbytes))
    for decimals in range(fewest, most + 1):
        if len({gib(value, decimals) for value in values}) == len(values):
            return decimals
    return most


def _gib(peak_bytes: float, headroom: float, decimals: int = 2) -> str:
    """`36.36 GiB` or, with headroom, `36.36 GiB + 10% = 40.00 GiB` (the total at `decimals`)."""
    if not headroom:
        return gib(peak_bytes, decimals)
    return f"{gib(peak_bytes)} + {percent(headroom)} = {gib(peak_bytes * (1 + headroom), decimals)}"
