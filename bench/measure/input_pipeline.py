"""The input pipeline's measurements: pure arithmetic over waits and rates, and thin /proc collectors.

The collectors read Linux's /proc (CPU time and resident memory of a process) and the CUDA
caching host allocator (pinned bytes); the calculators take numbers and return numbers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

INPUT_BOUND_WAIT_PCT = 5.0
"""A step that waits for its input this share of its time (median) or more is input-bound."""


@dataclass(frozen=True)
class LoaderAlone:
    """The loader measured alone (no training), same workers: samples/s over `repeats` runs of
    `batches` micro-batches (median, min, max), and CPU ms per sample of the training process and its
    workers together (user + system from /proc: unlike the wall clock, barely inflated by other
    processes sharing the cores)."""

    samples_per_s: float
    samples_per_s_min: float
    samples_per_s_max: float
    cpu_ms_per_sample: float
    repeats: int
    batches: int


@dataclass(frozen=True)
class InputWait:
    """What the timed steps spent waiting for their micro-batches."""

    median_ms: float
    p90_ms: float
    pct: float
    """Median wait over median step time, percent."""
    compute_samples_per_s: float
    """Samples/s the step would reach if it never waited: effective batch over (median step - median wait)."""


def input_wait(step_wait_ms: Sequence[float], step_times_ms: Sequence[float], effective_batch: int) -> InputWait:
    """Median and p90 of the per-step waits, and their share of the median step.

    >>> w = input_wait([1.0, 2.0, 3.0], [10.0, 10.0, 10.0], 16)
    >>> w.median_ms, w.pct, w.compute_samples_per_s
    (2.0, 20.0, 2000.0)
    """
    median, p90 = (float(v) for v in np.percentile(np.asarray(step_wait_ms, dtype=float), [50, 90]))
    step = float(np.median(np.asarray(step_times_ms, dtype=float)))
    compute_ms = max(step - median, 1e-6)
    return InputWait(median, p90, 100 * median / step, effective_batch / compute_ms * 1e3)


def is_input_bound(wait: InputWait, loader: LoaderAlone) -> bool:
    """The median step waits >= `INPUT_BOUND_WAIT_PCT` of its time, or the loader alone delivers
    fewer samples/s than the step would consume without waiting.

    >>> alone = LoaderAlone(900.0, 850.0, 950.0, 2.0, 3, 10)
    >>> is_input_bound(InputWait(0.1, 0.2, 1.0, 1000.0), alone), is_input_bound(InputWait(0.1, 0.2, 1.0, 500.0), alone)
    (True, False)
    """
    return wait.pct >= INPUT_BOUND_WAIT_PCT or loader.samples_per_s < wait.compute_samples_per_s


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux /proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcessMemory:
    rss_bytes: int | None
    """Resident pages, shared ones included (counted again in every process that maps them)."""
    pss_bytes: int | None
    """Proportional: shared pages split between the processes sharing them (sums without double counting)."""


def process_memory(pid: int) -> ProcessMemory:
    """Resident (RSS) and proportional (PSS) bytes of a process now, from /proc; None where unreadable."""
    return ProcessMemory(_proc_kib(f"/proc/{pid}/status", "VmRSS:"), _proc_kib(f"/proc/{pid}/smaps_rollup", "Pss:"))


def _proc_kib(path: str, key: str) -> int | None:
    try:
        with open(path) as handle:
            for line in handle:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def pinned_peak_bytes(device: torch.device) -> int:
    """Peak page-locked host bytes of CUDA's caching host allocator (pinned batches); 0 off CUDA."""
    if device.type != "cuda" or not torch.cuda.is_initialized():
        return 0
    return int(torch.cuda.host_memory_stats().get("allocated_bytes.peak", 0))
