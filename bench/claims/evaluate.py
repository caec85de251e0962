"""A claim against the rows: the first accepted source that answers it gives its verdict."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.claims.evidence import (
    MEASURED_SOURCES,
    ROWLESS,
    SOURCE_WORDS,
    Missing,
    Rows,
    Source,
    load_sources,
    predicted_rows,
)
from bench.claims.registry import ARTICLE_GPUS, CLAIMS, Claim
from bench.claims.verdict import Check, Verdict, verdict_of
from bench.results.store import EQUIVALENCE_CSV


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
    supporting: tuple[str, ...] = ()
    """Labelled evidence from sources that give no verdict (when none could)."""
    predicted: Finding | None = None
    """For a claim about GPU speed that no GPU row answered: the same checks on the throughput model's predicted
    rows for the article's GPU, a verdict labelled predicted (its `note` gives the predictions' bands)."""

    @property
    def where_it_holds(self) -> str:
        """For a claim checked over a range of configurations: where it holds and where not ("" otherwise).

        Checks that carry a configuration label (`Check.at`) are grouped by outcome.
        """
        labelled = [check for check in self.checks if check.at]
        if self.verdict != "partly" or len({check.at for check in labelled}) < 2:
            return ""  # it holds (or not) everywhere: the verdict says it all
        held = list(dict.fromkeys(check.at for check in labelled if check.passed))
        failed = list(dict.fromkeys(check.at for check in labelled if not check.passed and check.at not in held))
        parts = ([f"holds at {', '.join(held)}"] if held else []) + ([f"not at {', '.join(failed)}"] if failed else [])
        return "; ".join(parts)

    @property
    def rows_file(self) -> Path | None:
        """The file the rows came from."""
        if self.rows_folder is None:
            return None
        return self.rows_folder / (EQUIVALENCE_CSV if self.source == "equivalence" else "runs.csv")

    @property
    def measured_tag(self) -> str | None:
        """The device folder of the rows behind the verdict, when a device measured them."""
        return self.rows_folder.name if self.source in MEASURED_SOURCES and self.rows_folder else None

    @property
    def found_as(self) -> str:
        """How a check's figure was found, in one word: only a device's rows are "measured"."""
        return {"estimate": "estimated", "arithmetic": "computed", "torch": "found",
                "predicted": "predicted"}.get(self.source or "", "measured")

    @property
    def where(self) -> str:
        if self.source is None:
            return "nowhere"
        if self.source in ("estimate", *ROWLESS):  # no device's rows behind it
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
        folder = None if source in ROWLESS else rows.folder
        return Finding(claim, verdict_of(checks), tuple(checks), source, folder, rows.device_name,
                       tuple(read.used), "; ".join(reasons), _supporting(claim, results_root))
    if claim.elsewhere:
        reasons.append(f"other sources: {claim.elsewhere}")
    return Finding(claim, "not testable here", note="; ".join(reasons), supporting=_supporting(claim, results_root),
                   predicted=_predicted(claim, results_root))


def _predicted(claim: Claim, results_root: Path) -> Finding | None:
    """The claim's checks on the predicted rows for its article's GPU, when it is one GPU rows would answer."""
    gpu = ARTICLE_GPUS.get(claim.article)
    rows = predicted_rows(results_root, claim.experiment, gpu) if "cuda" in claim.sources and gpu else None
    if rows is None:
        return None
    try:
        checks = claim.measure(rows)
    except Missing:
        return None
    used = rows.frame[rows.frame.cell_id.isin(rows.used)].sort_values("cell_id")
    bands = "; ".join(f"{cell}: {speed:,.0f} ({low:,.0f}-{high:,.0f}) samples/s" for cell, speed, low, high in
                      zip(used.cell_id, used.samples_per_s, used.samples_per_s_low, used.samples_per_s_high))
    note = (f"the predictions read, each with its 80 % band ({used.speed_basis.iloc[0]}): {bands}. The bands are "
            "each prediction's own error; the validation states none for a ratio of two configurations on one GPU, "
            "so this verdict is the model's, to be settled by GPU rows")
    return Finding(claim, verdict_of(checks), tuple(checks), "predicted", rows.folder, gpu, tuple(rows.used), note)


def _supporting(claim: Claim, results_root: Path) -> tuple[str, ...]:
    lines: list[str] = []
    for read in claim.supporting:
        try:
            lines += read(results_root)
        except Missing as exc:
            lines.append(f"not readable: {exc}")
    return tuple(lines)


def evaluate_all(results_root: Path) -> list[Finding]:
    return [evaluate(claim, results_root) for claim in CLAIMS]


def table_folder(findings: list[Finding]) -> str:
    """The claims table's folder: the device tags of the measured rows behind its verdicts, joined with
    `+` (`nvidia-h200+cpu-intel-xeon-processor`); `estimate` when no device measured any of them.

    >>> table_folder([])
    'estimate'
    """
    tags = sorted({finding.measured_tag for finding in findings} - {None})
    return "+".join(tags) or "estimate"
