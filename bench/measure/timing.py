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


@dataclass(frozen=True)
class StepTimeStats:
    median_ms: float
    p10_ms: float
    p90_ms: float


def summarize_step_times(samples_ms: Sequence[float]) -> StepTimeStats:
    """Median and spread of raw step times.

    Example:
        >>> summarize_step_times([10.0, 12.0, 11.0]).median_ms
        11.0
    """
    if not samples_ms:
        raise ValueError("no step times to summarize")
    p10, median, p90 = np.percentile(np.asarray(samples_ms, dtype=float), [10, 50, 90])
    return StepTimeStats(median_ms=float(median), p10_ms=float(p10), p90_ms=float(p90))
