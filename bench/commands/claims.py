"""`bench claims`: the claims table from the rows under the results root, in a folder named for
the device(s) whose rows it reads. With `--format json` it answers and writes nothing, not even the estimator's
autotune rows a first text run computes: a JSON answer is a read (a claim without its rows says so)."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from bench.commands.formats import INTERACTIVE, add_format_option, answer_only, claims_document, emit
from bench.errors import ResultsFileError


def register(commands: argparse._SubParsersAction) -> None:
    claims = commands.add_parser("claims", help="the seed articles' claims against the measured rows -> CLAIMS.md "
                                                "(--format json: the answer only, nothing written)")
    claims.set_defaults(handler=run_claims)
    claims.add_argument("--results", type=Path, default=Path("results"), help="results root (default: results)")
    add_format_option(claims)


def run_claims(args: argparse.Namespace) -> int:
    from bench.claims.autotune import (
        ensure_autotune_rows,  # late: pandas and the estimator only here
    )
    from bench.claims.evaluate import evaluate, table_folder
    from bench.claims.evidence import check_runs_files
    from bench.claims.registry import CLAIMS
    from bench.claims.table import write_claims
    from bench.report.console import steps
    from bench.results.store import preflight

    measured = sorted(args.results.glob("claims_*/*/runs.csv"))
    if not any(path.parts[-3] != "claims_autotune" for path in measured):
        raise ResultsFileError(f"--results {args.results}: no claims rows (claims_*/<device-tag>/runs.csv) "
                               "under it; run `make claims` (or `bench run experiments/claims/*.toml`) first")
    check_runs_files(measured)
    reading = args.format == "json"  # a JSON answer is a read: the missing autotune rows stay missing
    if not reading:  # a folder that cannot take the table fails before minutes of estimating
        preflight(args.results / "claims", "the claims table", "nothing was estimated or written")
    with answer_only(reading), steps(len(CLAIMS) + 1, INTERACTIVE, "claims") as step:
        step.advance("autotune rows")
        if not reading:
            step.say(f"autotune rows: {ensure_autotune_rows(args.results)}")
        findings = []
        for claim in CLAIMS:
            step.advance(claim.id)
            findings.append(evaluate(claim, args.results))
        counts = Counter(finding.verdict for finding in findings)
        step.say(", ".join(f"{count} {verdict}" for verdict, count in sorted(counts.items())))
        out = args.results / "claims" / table_folder(findings)
        if not reading:
            preflight(out, "the claims table", "nothing was written")
        written = [] if reading else write_claims(findings, out)
        if written:
            step.say(f"wrote {', '.join(str(path) for path in written)}")
    if args.format == "json":
        emit("claims", claims_document(findings, written))
    return 0
