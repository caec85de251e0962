"""Step timing: the clock that times optimizer steps (the statistics over its samples: `bench.measure.step_stats`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from bench.measure.step_stats import MIN_STEPS_FOR_SPREAD, summarize_step_times


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
