"""A claim of a seed article: its words, the rows that answer it, and the check that tests it.

Each article's module (`hidden_memory_spike` for article 000 ...) declares its claims with `ClaimList.add`, right
above the function that reads the rows and returns the checks (`bench.claims.verdict`); the verdict is
computed from the checks, never typed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from bench.claims.evidence import Rows, Source
from bench.claims.verdict import Check

ANY: tuple[Source, ...] = ("cuda", "cpu", "estimate")
MEASURED: tuple[Source, ...] = ("cuda", "cpu")
GPU_SPEED: tuple[Source, ...] = ("cuda",)
"""A claim about GPU speed: only rows measured on a GPU give it a verdict. A CPU's timing (it varies
with the CPU model and its load) or a FLOP ratio is shown as supporting evidence."""
AT_GPU_SIZE: tuple[Source, ...] = ("cuda", "estimate")
# Activation ratios: at the articles' 224 px the estimate beats a CPU row at 32-64 px, where
# fixed costs (autocast's weight copies, the stem) weigh far more than in the article's setting.
RATIO: tuple[Source, ...] = ("cuda", "estimate", "cpu")

ESTIMATED = ("At 224 px the activation numbers come from GPU rows or, without them, from the "
             "memory estimator (`bench estimate`, labelled estimated).")

Measure = Callable[[Rows], list[Check]]
Support = Callable[[Path], list[str]]
"""A reader of labelled evidence, one line each, from the results root: a FLOP ratio, a CPU row, a
counter. It gives no verdict; one that cannot read raises `Missing` (the finding says so)."""


@dataclass(frozen=True, kw_only=True)
class Claim:
    """One claim, quoted as the article words it, and how the rows test it."""

    id: str
    article: str
    """Key of `bench.claims.registry.ARTICLES`."""
    summary: str
    """A few words for the table."""
    quote: str
    """The article's words, verbatim."""
    experiment: str
    """results/<experiment>: whose rows answer it."""
    sources: tuple[Source, ...]
    """Sources it accepts, first present wins."""
    measure: Measure
    """Reads one source's rows, returns the checks."""
    method: str
    """How the rows are read, in words."""
    elsewhere: str = ""
    """Why the sources it leaves out cannot answer it."""
    supporting: tuple[Support, ...] = ()
    """Evidence shown beside the verdict, labelled, that gives none itself (a FLOP ratio, a CPU row)."""


@dataclass
class ClaimList:
    """One article's claims, in the order its module declares them."""

    article: str
    claims: list[Claim] = field(default_factory=list)

    def add(self, **described: object) -> Callable[[Measure], Claim]:
        """Decorator: the function below reads the rows for the claim `described` here."""
        def register(measure: Measure) -> Claim:
            claim = Claim(article=self.article, measure=measure, **described)
            self.claims.append(claim)
            return claim
        return register
