"""Readings shared by the articles' checks: a split's label, how much slower, percentages."""

from __future__ import annotations

import pandas as pd

from bench.claims.verdict import Check, outcome_in_range


def pair(row: pd.Series) -> str:
    return f"{int(row.micro_batch)}×{int(row.accum_steps)}"


def slower_by(fast: pd.Series, slow: pd.Series) -> float:
    """How much more time per sample `slow` takes than `fast` (0.33: 33 % slower)."""
    return float(fast.samples_per_s) / float(slow.samples_per_s) - 1


def pct(value: float) -> str:
    return f"{100 * value:.1f} %"


def time_change(slower: float) -> str:
    """One convention for every speed figure: the throughput ratio (samples/s over the reference's), and
    the time per sample it means.

    >>> time_change(0.25), time_change(-0.2)
    ('throughput ratio 0.80 (25.0 % more time per sample)', 'throughput ratio 1.25 (20.0 % less time per sample)')
    """
    return (f"throughput ratio {1 / (1 + slower):.2f} ({pct(abs(slower))} "
            f"{'more' if slower >= 0 else 'less'} time per sample)")



def slowdown_check(claimed: str, slower: float, low: float, high: float) -> Check:
    """A slowdown against a claimed range; a smaller one than claimed exceeds the claim (in its favour)."""
    return Check(claimed, time_change(slower), outcome_in_range(slower, low, high, favourable="lower"))
