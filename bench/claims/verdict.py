"""Verdict rules: pure functions from measured numbers to a verdict.

A claim is split into checks, each one number (or direction) against what the article says,
with a tolerance stated in the check itself. A check passes, fails, or *exceeds*: the number
lies beyond the claimed range on the side the article would welcome (a larger saving, a
smaller cost), whichever claim it is: every check of an effect says which side that is. The
verdict follows one rule:

- holds: every check passes;
- exceeds the claim: every check passes or exceeds, at least one exceeds;
- partly: some checks pass (or exceed), some do not;
- does not hold: no check passes;
- not testable here: no rows from a source that can answer it (a GPU-speed claim on a
  machine without GPU rows, say); labelled supporting evidence may still be shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

from bench.units import percent

Verdict = Literal["holds", "exceeds the claim", "partly", "does not hold", "not testable here"]
VERDICTS: tuple[Verdict, ...] = ("holds", "exceeds the claim", "partly", "does not hold", "not testable here")
Outcome = Literal["passes", "exceeds", "fails"]
Favourable = Literal["higher", "lower"]
"""Which side of a claimed range the article would welcome (a saving larger, a slowdown smaller). Every check
names it (`favourable=`, no default): an effect has one; a figure (a tensor's bytes, a step count, a price) has
none (None), and a figure off its claimed value fails on either side."""

RULE = ("holds: every check passes; exceeds the claim: every check passes or goes beyond the claimed range "
        "on the side the article would welcome; partly: some checks pass, some do not; does not hold: none "
        "passes; not testable here: no rows from a source that can answer it (supporting evidence, when "
        "shown, is labelled and gives no verdict)")


@dataclass(frozen=True)
class Check:
    """One measurable part of a claim."""

    claimed: str
    """What the article says, e.g. "AdamW state 2.4 GB (within 10 %)"."""
    measured: str
    """What the rows say, formatted."""
    outcome: Outcome | bool
    """passes, exceeds or fails; True / False stand for passes / fails."""
    at: str = ""
    """The configuration this check is about, for a claim checked over a range ("8×1", "ViT-L/16")."""

    def __post_init__(self) -> None:
        outcome = self.outcome
        if not isinstance(outcome, str):  # numpy comparisons give numpy booleans
            outcome = "passes" if bool(outcome) else "fails"
        object.__setattr__(self, "outcome", outcome)

    @property
    def passed(self) -> bool:
        """Passes or exceeds: the article's point stands."""
        return self.outcome != "fails"


def verdict_of(checks: Sequence[Check]) -> Verdict:
    """The claim's verdict from its checks.

    >>> verdict_of([Check("a", "1", True), Check("b", "2", False)])
    'partly'
    >>> verdict_of([Check("a", "1", True), Check("b", "2", "exceeds")])
    'exceeds the claim'
    >>> verdict_of([])
    'not testable here'
    """
    if not checks:
        return "not testable here"
    passed = sum(check.passed for check in checks)
    if passed == len(checks):
        return "exceeds the claim" if any(check.outcome == "exceeds" for check in checks) else "holds"
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


def outcome_in_range(measured: float, low: float, high: float, slack: float = 0.0, *,
                     favourable: Favourable | None) -> Outcome:
    """passes inside [low, high] (widened by `slack`); exceeds beyond it on the `favourable` side.

    >>> outcome_in_range(0.89, 0.60, 0.70, favourable="higher"), outcome_in_range(0.3, 0.6, 0.7, favourable="higher")
    ('exceeds', 'fails')
    """
    if in_range(measured, low, high, slack):
        return "passes"
    above = measured > high * (1 + slack)
    if (favourable == "higher" and above) or (favourable == "lower" and not above):
        return "exceeds"
    return "fails"


def value_check(claimed_text: str, measured: float, claimed: float, rel_tol: float, unit: str,
                scale: float = 1.0, digits: int = 2, label: str = "", *, favourable: Favourable | None,
                at: str = "") -> Check:
    """`measured` against `claimed` (both in base units; shown divided by `scale` with `unit`, after `label`)."""
    shown = _shown(measured / scale, digits, unit, label)
    outcome = outcome_in_range(measured, claimed * (1 - rel_tol), claimed * (1 + rel_tol), favourable=favourable)
    return Check(f"{claimed_text} (within {percent(rel_tol)})", shown, outcome, at)


def range_check(claimed_text: str, measured: float, low: float, high: float, slack: float, unit: str,
                scale: float = 1.0, digits: int = 2, label: str = "", *, favourable: Favourable | None,
                at: str = "") -> Check:
    """`measured` inside [low, high], widened by `slack` on both sides; beyond it on the `favourable` side exceeds."""
    shown = _shown(measured / scale, digits, unit, label)
    widened = f" (±{percent(slack)})" if slack else ""
    return Check(f"{claimed_text}{widened}", shown, outcome_in_range(measured, low, high, slack,
                                                                     favourable=favourable), at)


def _shown(value: float, digits: int, unit: str, label: str) -> str:
    text = f"{value:.{digits}f} {unit}".strip()
    return f"{label} {text}" if label else text
