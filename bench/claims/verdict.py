"""Verdict rules: pure functions from measured numbers to holds / partly / does not hold.

A claim is split into checks, each one number (or direction) against what the article says,
with a tolerance stated in the check itself. The verdict follows one rule:

- holds: every check passes;
- partly: some checks pass, some do not;
- does not hold: no check passes;
- not testable: no rows from a device (or estimate) the claim accepts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

Verdict = Literal["holds", "partly", "does not hold", "not testable"]
VERDICTS: tuple[Verdict, ...] = ("holds", "partly", "does not hold", "not testable")

RULE = ("holds: every check passes; partly: some pass; does not hold: none passes; "
        "not testable: no rows from a device or estimate the claim accepts")


@dataclass(frozen=True)
class Check:
    """One measurable part of a claim."""

    claimed: str
    """What the article says, e.g. "AdamW state 2.4 GB (within 10 %)"."""
    measured: str
    """What the rows say, formatted."""
    passed: bool

    def __post_init__(self) -> None:
        object.__setattr__(self, "passed", bool(self.passed))  # numpy comparisons give numpy booleans


def verdict_of(checks: Sequence[Check]) -> Verdict:
    """The claim's verdict from its checks.

    >>> verdict_of([Check("a", "1", True), Check("b", "2", False)])
    'partly'
    >>> verdict_of([])
    'not testable'
    """
    if not checks:
        return "not testable"
    passed = sum(check.passed for check in checks)
    if passed == len(checks):
        return "holds"
    return "partly" if passed else "does not hold"


def within(measured: float, claimed: float, rel_tol: float) -> bool:
    """|measured - claimed| <= rel_tol x |claimed| (the edge counts as within).

    >>> within(1.1, 1.0, 0.10), within(1.11, 1.0, 0.10)
    (True, False)
    """
    return abs(measured - claimed) <= rel_tol * abs(claimed) + 1e-12


def in_range(measured: float, low: float, high: float, slack: float = 0.0) -> bool:
    """low x (1 - slack) <= measured <= high x (1 + slack).

    >>> in_range(5.5, 6, 8, slack=0.1), in_range(5.3, 6, 8, slack=0.1)
    (True, False)
    """
    return low * (1 - slack) - 1e-12 <= measured <= high * (1 + slack) + 1e-12


def value_check(claimed_text: str, measured: float, claimed: float, rel_tol: float, unit: str,
                scale: float = 1.0, digits: int = 2, label: str = "") -> Check:
    """`measured` against `claimed` (both in base units; shown divided by `scale` with `unit`, after `label`)."""
    shown = _shown(measured / scale, digits, unit, label)
    return Check(f"{claimed_text} (within {rel_tol:.0%})", shown, within(measured, claimed, rel_tol))


def range_check(claimed_text: str, measured: float, low: float, high: float, slack: float, unit: str,
                scale: float = 1.0, digits: int = 2, label: str = "") -> Check:
    """`measured` inside [low, high], widened by `slack` on both sides."""
    shown = _shown(measured / scale, digits, unit, label)
    widened = f" (±{slack:.0%})" if slack else ""
    return Check(f"{claimed_text}{widened}", shown, in_range(measured, low, high, slack))


def _shown(value: float, digits: int, unit: str, label: str) -> str:
    text = f"{value:.{digits}f} {unit}".strip()
    return f"{label} {text}" if label else text
