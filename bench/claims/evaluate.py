"""A claim against the rows: the first accepted source that answers it gives its verdict."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.claims.evidence import SOURCE_WORDS, Missing, Rows, Source, load_sources
from bench.claims.registry import CLAIMS, Claim
from bench.claims.verdict import Check, Verdict, verdict_of


@dataclass(frozen=True)
class Finding:
    """A claim's verdict, the checks behind it, and where the rows came from."""

    claim: Claim
    verdict: Verdict
    checks: tuple[Check, ...] = ()
    source: Source | None = None
    rows_folder: Path | None = None
    device_name: str = ""
    cell_ids: tuple[str, ...] = ()
    note: str = ""
    """Why a preferred source could not answer (or, when not testable, why none could)."""

    @property
    def where(self) -> str:
        if self.source is None:
            return "nowhere"
        if self.source == "estimate":  # its device name only repeats that no device ran it
            return SOURCE_WORDS[self.source]
        return f"{SOURCE_WORDS[self.source]}: {self.device_name}"


def evaluate(claim: Claim, results_root: Path) -> Finding:
    """Try the claim's sources in order of precedence; the first that answers gives the verdict."""
    sources = load_sources(results_root, claim.experiment)
    absent = [source for source in claim.sources if source not in sources]
    reasons = [f"no {' or '.join(absent)} rows"] if absent else []
    for source in claim.sources:
        rows = sources.get(source)
        if rows is None:
            continue
        read = Rows(rows.source, rows.folder, rows.frame)  # records the cells this claim reads
        try:
            checks = claim.measure(read)
        except Missing as exc:
            reasons.append(f"{source}: {exc}")
            continue
        return Finding(claim, verdict_of(checks), tuple(checks), source, rows.folder, rows.device_name,
                       tuple(read.used), "; ".join(reasons))
    if claim.elsewhere:
        reasons.append(f"other sources: {claim.elsewhere}")
    return Finding(claim, "not testable", note="; ".join(reasons))


def evaluate_all(results_root: Path) -> list[Finding]:
    return [evaluate(claim, results_root) for claim in CLAIMS]
