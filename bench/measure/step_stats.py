"""Statistics over measured step times: the median, its bootstrap interval, the noisy flag, a rate change.

Pure numpy, no torch: reading and reporting rows uses them without loading the measurement stack.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


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
