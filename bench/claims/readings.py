"""Readings shared by the articles' checks: a split's label, how much slower, percentages."""

from __future__ import annotations

import pandas as pd


def pair(row: pd.Series) -> str:
    return f"{int(row.micro_batch)}×{int(row.accum_steps)}"


def slower_by(fast: pd.Series, slow: pd.Series) -> float:
    """How much more time per sample `slow` takes than `fast` (0.33: 33 % slower)."""
    return float(fast.samples_per_s) / float(slow.samples_per_s) - 1


def pct(value: float) -> str:
    return f"{100 * value:.1f} %"


def time_change(slower: float) -> str:
    """0.33 -> "33.0 % slower"; -0.1 -> "10.0 % faster"."""
    return f"{pct(abs(slower))} {'slower' if slower >= 0 else 'faster'}"

