"""Step timing: a collector that times optimizer steps, and pure statistics over the samples."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch


def time_steps(run_step: Callable[[], object], steps: int, device: torch.device) -> list[float]:
    """Milliseconds per call of `run_step`, one sample per optimizer step.

    On CUDA, events are recorded around each step and read after the last one, so no host
    sync happens inside the timed region; on CPU every op is synchronous and `perf_counter` is exact.
    """
    if device.type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
        for start, end in zip(starts, ends):
            start.record()
            run_step()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) for start, end in zip(starts, ends)]
    samples = []
    for _ in range(steps):
        began = time.perf_counter()
        run_step()
        samples.append((time.perf_counter() - began) * 1e3)
    return samples


@dataclass(frozen=True)
class TimingPolicy:
    """How long a cell keeps timing: until the interval of its median is narrow enough, the way pyperf
    and criterion calibrate, within a time budget."""

    min_steps: int
    """Timed optimizer steps at least (the grid's run.measured_steps)."""
    target_ci95_rel: float | None = 0.05
    """Stop once the 95 % interval of the median step time is this narrow (relative); None: time exactly
    `min_steps` (DDP ranks must all stop at the same step)."""
    budget_s: float = 60.0
    """Wall time the timed steps may take in all; past it the row says the target was not met."""
    max_steps: int = 10_000
    min_warmup_steps: int = 1
    """Warm-up steps at least (the grid's run.warmup_steps, the first one included)."""
    settle_rel: float = 0.10
    """Warm-up goes on until a step's time is within this of the step before (caches, allocator, thread
    pools settled), at most `max_extra_warmup_steps` beyond the minimum."""
    max_extra_warmup_steps: int = 8


@dataclass(frozen=True)
class TimedSteps:
    samples_ms: list[float]
    target_met: bool | None
    """The interval reached the policy's target; None when the policy sets none."""


def time_until_stable(run_step: Callable[[], object], device: torch.device, policy: TimingPolicy) -> TimedSteps:
    """Time optimizer steps until the 95 % interval of their median is within the policy's target.

    At least `min_steps` (and `MIN_STEPS_FOR_SPREAD`, below which no interval is stated) are taken; then
    more, in chunks (one step on a CPU, as many again as taken so far on CUDA, where reading the events
    syncs), until the target is met, the budget is spent or `max_steps` are taken.

    >>> timed = time_until_stable(lambda: None, torch.device("cpu"), TimingPolicy(min_steps=3, budget_s=0.5))
    >>> len(timed.samples_ms) >= MIN_STEPS_FOR_SPREAD, timed.target_met in (True, False)
    (True, True)
    """
    began = time.perf_counter()
    if policy.target_ci95_rel is None:
        return TimedSteps(time_steps(run_step, policy.min_steps, device), None)
    samples = time_steps(run_step, max(policy.min_steps, MIN_STEPS_FOR_SPREAD), device)
    while True:
        met = summarize_step_times(samples).ci95_rel <= policy.target_ci95_rel
        if met or time.perf_counter() - began >= policy.budget_s or len(samples) >= policy.max_steps:
            return TimedSteps(samples, met)
        chunk = 1 if device.type == "cpu" else len(samples)
        samples += time_steps(run_step, min(chunk, policy.max_steps - len(samples)), device)


def warm_up(run_step: Callable[[], object], device: torch.device, policy: TimingPolicy) -> int:
    """Warm-up steps after the first: `min_warmup_steps - 1`, then more until a step's time is within
    `settle_rel` of the one before, at most `max_extra_warmup_steps` more. Returns how many were run."""
    times = time_steps(run_step, policy.min_warmup_steps - 1, device)
    for _ in range(policy.max_extra_warmup_steps):
        if len(times) >= 2 and abs(times[-1] / times[-2] - 1) <= policy.settle_rel:
            break
        times += time_steps(run_step, 1, device)
    return len(times)


def best_time_s(run: Callable[[], object], device: torch.device, *, repeats: int = 1,
                min_time_s: float = 0.0) -> float:
    """The shortest of at least `repeats` timed calls of `run`, called until `min_time_s` of samples.

    Each call is synchronised on both sides on CUDA: a ceiling measurement times one kernel alone.
    """
    best_s, spent, calls = float("inf"), 0.0, 0
    while calls < repeats or spent < min_time_s:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        began = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - began
        best_s, spent, calls = min(best_s, elapsed), spent + elapsed, calls + 1
    return best_s


NOISY_CI95_REL = 0.10
"""A measurement is *noisy* when the 95 % bootstrap interval of its median step time is wider than
10 % of the median: too wide to tell a 5 % effect (seed 002's accumulation cost) from noise."""
MIN_STEPS_FOR_SPREAD = 5
"""Below this many timed steps the interval of the median is not stated (it would read as a spread
the sample cannot show: one step gives p10 = p90 = median)."""
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
"""Fixed, so the same step times always give the same interval (reports regenerate byte for byte)."""


@dataclass(frozen=True)
class StepTimeStats:
    median_ms: float
    p10_ms: float
    p90_ms: float
    ci95_low_ms: float | None
    """2.5th percentile of the bootstrapped median (resampling the steps with replacement); None
    with fewer than `MIN_STEPS_FOR_SPREAD` steps."""
    ci95_high_ms: float | None
    """97.5th percentile of the bootstrapped median."""

    @property
    def ci95_rel(self) -> float | None:
        """The interval's width over the median: the dispersion figure a row carries (None: too few steps)."""
        if self.ci95_low_ms is None or self.ci95_high_ms is None:
            return None
        return (self.ci95_high_ms - self.ci95_low_ms) / self.median_ms

    @property
    def noisy(self) -> bool | None:
        """Wider than `NOISY_CI95_REL`; None when too few steps were timed to tell."""
        return None if self.ci95_rel is None else self.ci95_rel > NOISY_CI95_REL


def summarize_step_times(samples_ms: Sequence[float]) -> StepTimeStats:
    """Median, p10/p90 and the 95 % bootstrap interval of the median, from raw step times.

    With fewer than `MIN_STEPS_FOR_SPREAD` steps the interval is not stated (None), rather than
    read off a sample too small to show one.

    Example:
        >>> stats = summarize_step_times([10.0, 12.0, 11.0, 10.5, 11.5])
        >>> stats.median_ms, round(stats.ci95_rel, 3), stats.noisy
        (11.0, 0.182, True)
        >>> summarize_step_times([10.0, 12.0, 11.0]).noisy is None
        True
    """
    if not samples_ms:
        raise ValueError("no step times to summarize")
    values = np.asarray(samples_ms, dtype=float)
    p10, median, p90 = np.percentile(values, [10, 50, 90])
    low, high = bootstrap_interval(values, np.median) if len(values) >= MIN_STEPS_FOR_SPREAD else (None, None)
    return StepTimeStats(median_ms=float(median), p10_ms=float(p10), p90_ms=float(p90), ci95_low_ms=low,
                         ci95_high_ms=high)


def bootstrap_interval(values: np.ndarray, statistic, *, resamples: int = BOOTSTRAP_RESAMPLES) -> tuple[float, float]:
    """The 95 % percentile-bootstrap interval of `statistic` over `values` (deterministic seed).

    >>> bootstrap_interval(np.array([5.0, 5.0, 5.0]), np.median)
    (5.0, 5.0)
    """
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    draws = rng.choice(values, size=(resamples, len(values)), replace=True)
    estimates = statistic(draws, axis=1)
    low, high = np.percentile(estimates, [2.5, 97.5])
    return float(low), float(high)


def rate_change_interval(base_ms: Sequence[float], other_ms: Sequence[float], base_batch: int,
                         other_batch: int) -> tuple[float, float, float]:
    """How much lower `other`'s samples/s is than `base`'s (0.3: 30 % lost), and its 95 % interval.

    Each side's median step time is bootstrapped on its own (the two were measured in separate
    processes), with the same seed; the ratio of the paired draws gives the interval.

    >>> lost, low, high = rate_change_interval([100.0] * 5, [400.0] * 5, 16, 16)
    >>> round(lost, 3), round(low, 3), round(high, 3)
    (0.75, 0.75, 0.75)
    """
    base, other = np.asarray(base_ms, dtype=float), np.asarray(other_ms, dtype=float)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    base_medians = np.median(rng.choice(base, size=(BOOTSTRAP_RESAMPLES, len(base))), axis=1)
    other_medians = np.median(rng.choice(other, size=(BOOTSTRAP_RESAMPLES, len(other))), axis=1)
    lost = 1 - (other_batch / other_medians) / (base_batch / base_medians)
    point = 1 - (other_batch / np.median(other)) / (base_batch / np.median(base))
    low, high = np.percentile(lost, [2.5, 97.5])
    return float(point), float(low), float(high)
