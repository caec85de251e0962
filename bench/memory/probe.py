"""The largest micro-batch that fits: predicted by the estimator, then found by real runs.

Each real trial is one cell in its own process (`bench.run.cell_process.run_isolated`, with its
memory cap); out-of-memory means "too big". The search starts from the estimate and
steps away from it by a stride that doubles until the limit is bracketed, then bisects;
Lightning's BatchSizeFinder doubles from the start instead (`doubling_search`), which the
probe reports beside its own count.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch

from bench.errors import BadInput, OptionError
from bench.grid.cell import Cell, Profile, axes, probe_options
from bench.isolation import call_in_child, fork_server
from bench.measure.device import DeviceChoice, DeviceInfo, detect_device
from bench.measure.hardware import gpu_key_hint, gpu_spec
from bench.measure.peak import PeakFlops
from bench.memory.estimate import FakeModels, Target, estimate_cell
from bench.memory.fit import DEFAULT_HEADROOM
from bench.run.cell_measurement import CellTask
from bench.run.cell_process import run_isolated
from bench.train.models import has_batch_norm
from bench.units import GIB, MIB

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
        failing = [n for n, ok in history if not ok]
        on_trial(Trial(kind, len(history), micro_batch, fitted, time.monotonic() - began,
                       max([n for n, ok in history if ok], default=0), min(failing) if failing else None))
        return fitted

    return timed


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
        return 2 if has_batch_norm(self.base.model, self.base.image_size) else 1

    def describe(self) -> str:
        """`resnet50 224px fp32 ckpt off adamw, K=1`, plus the axes away from their default."""
        cell = self.base
        extras = "".join(f", {name} {getattr(cell, name)}" for name, default in probe_options().items()
                         if axes()[name].extra and getattr(cell, name) != default)
        return (f"{cell.model} {cell.image_size}px {cell.precision} ckpt {cell.checkpointing} "
                f"{cell.optimizer}{' channels-last' if cell.channels_last else ''}, K={cell.accum_steps}{extras}")


@dataclass(frozen=True)
class Search:
    """The largest micro-batch that fitted (0: not even 1) and every (micro-batch, fitted) trial."""

    largest: int
    trials: tuple[tuple[int, bool], ...]


def search_largest(fits: Fits, guess: int, max_batch: int = MAX_MICRO_BATCH, smallest: int = 1) -> Search:
    """The largest n in [smallest, max_batch] with fits(n) (0: none), for a `fits` true up to some n and
    false above.

    From `guess`, step away by a stride (a sixteenth of the guess, doubling each step) until
    the limit is bracketed, then bisect. A guess within a few percent costs about
    2 + log2(guess / 16) trials.

    >>> search_largest(lambda n: n <= 100, guess=96).trials
    ((96, True), (102, False), (99, True), (100, True), (101, False))
    >>> search_largest(lambda n: n <= 100, guess=200).largest
    100
    >>> search_largest(lambda n: n <= 1, guess=4, smallest=2)
    Search(largest=0, trials=((4, False), (3, False), (2, False)))
    """
    trials: list[tuple[int, bool]] = []

    def check(n: int) -> bool:
        trials.append((n, fits(n)))
        return trials[-1][1]

    guess = min(max(guess, smallest), max_batch)
    stride = max(1, guess // 16)
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


def predict_largest(config: ProbeConfig, budget_bytes: float, target: Target, *, headroom: float = 0.0,
                    scale: float = 1.0, extra_bytes: int = 0, models: FakeModels | None = None,
                    on_trial: OnTrial | None = None) -> Search:
    """The largest micro-batch whose estimated peak x scale + extra_bytes, times (1 + headroom), fits.

    The estimates at micro-batch 1 and 2 give a straight line (peak memory grows linearly
    with the micro-batch), whose crossing with the budget is the first guess; the search
    then checks it on the estimator. Its trials are fake steps, not device runs.
    """
    models = models or FakeModels()
    profile: Profile = "cuda" if target == "cuda" else "cpu"

    def need_bytes(micro_batch: int) -> float:
        estimate = estimate_cell(config.cell(micro_batch, profile), target, models)
        peak = estimate.peak_reserved_bytes if target == "cuda" else estimate.peak_bytes + estimate.inputs_bytes
        return (peak * scale + extra_bytes) * (1 + headroom)

    smallest = config.smallest_micro_batch
    one, two = need_bytes(smallest), need_bytes(smallest + 1)
    per_sample = max(two - one, 1.0)
    guess = int((budget_bytes - one) // per_sample) + smallest
    fits = reporting(lambda n: need_bytes(n) <= budget_bytes, "estimate", on_trial)
    return search_largest(fits, max(guess, smallest), smallest=smallest)


def trial_on_device(config: ProbeConfig, device: DeviceInfo, memory_limit_gib: float | None,
                    timeout_s: float) -> Fits:
    """A `fits` that runs one cell in a fresh child process: ok fits, oom does not, anything else raises."""
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
class ProbeResult:
    """The estimator's answer and, when trials ran, the device's."""

    budget_bytes: float
    predicted: Search
    found: Search | None = None

    @property
    def doubling_trials(self) -> int | None:
        """Trials Lightning-style doubling from 1 takes to reach the found limit (None before trials)."""
        if self.found is None:
            return None
        limit = self.found.largest
        return len(doubling_search(lambda n: n <= limit).trials)


@dataclass(frozen=True)
class Budget:
    """The memory a micro-batch must fit in, and where it comes from."""

    nbytes: float
    source: str
    headroom: float = 0.0
    """Kept free above the estimate (the cost planner's rule) when answering for a catalog GPU."""
    device: DeviceInfo | None = None
    """The device real trials run on; None: answer from the estimator alone."""


def probe_budget(*, gpu: str | None, memory_gib: float | None, memory_limit_gib: float | None,
                 device: DeviceChoice) -> Budget:
    """Resolve the command-line choices; a bad one is an `OptionError` naming its option."""
    headroom = DEFAULT_HEADROOM
    if gpu is not None:
        spec = gpu_spec(gpu)
        if spec is None:
            raise OptionError(f"--gpu: {gpu!r} is not in the GPU catalog; {gpu_key_hint(gpu)}")
        return Budget(spec.memory_gib * GIB, f"{gpu} ({spec.memory_gib:g} GiB)", headroom)
    if memory_gib is not None:
        return Budget(memory_gib * GIB, f"--memory-gib {memory_gib:g}", headroom)
    info = detect_device(device)
    if memory_limit_gib is not None:
        return Budget(memory_limit_gib * GIB, f"--memory-limit-gib {memory_limit_gib:g} on {info.name}", device=info)
    if info.type == "cpu":
        raise OptionError("--memory-limit-gib: required for trials on a CPU (without a cap a trial could "
                        "exhaust the host); or answer from the estimator with --memory-gib or --gpu")
    total = call_in_child(_cuda_total_memory)
    return Budget(total, f"all of {info.name}", device=info)


def _cuda_total_memory() -> int:
    return torch.cuda.get_device_properties(0).total_memory


def probe_from_estimate(config: ProbeConfig, budget: Budget, on_trial: OnTrial | None = None) -> ProbeResult:
    """The estimator's answer for a GPU (`--gpu`, `--memory-gib`): no device runs anything."""
    return ProbeResult(budget.nbytes, predict_largest(config, budget.nbytes, "cuda", headroom=budget.headroom,
                                                      on_trial=on_trial))


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


def describe_probe(config: ProbeConfig, budget: Budget, result: ProbeResult) -> str:
    """What the probe found, in a few lines."""
    what = config.describe()
    room = f" with {budget.headroom:.0%} headroom" if budget.headroom else ""
    lines = [f"{what}; budget {budget.nbytes / GIB:.2f} GiB: {budget.source}{room}",
             f"predicted largest micro-batch: {result.predicted.largest} "
             f"(estimator, {len(result.predicted.trials)} fake steps)"]
    if config.smallest_micro_batch > 1:
        lines.insert(1, f"starts at micro-batch {config.smallest_micro_batch}: {config.base.model} has BatchNorm, "
                        "which cannot train on one sample (its batch statistics need two)")
    if result.found is not None:
        lines.append(f"found largest micro-batch:     {result.found.largest} "
                     f"({len(result.found.trials)} trials on {budget.device.name}; doubling from 1 "
                     f"would take {result.doubling_trials})")
        lines.append("trials: " + ", ".join(f"{n} {'ok' if ok else 'oom'}" for n, ok in result.found.trials))
    return "\n".join(lines)
