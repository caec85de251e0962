"""`bench claims`: the claims table from the rows under the results root, in a folder named for
the device(s) whose rows it reads."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from bench.errors import ResultsFileError


def register(commands: argparse._SubParsersAction) -> None:
    claims = commands.add_parser("claims", help="the seed articles' claims against the measured rows -> CLAIMS.md")
    claims.set_defaults(handler=run_claims)
    claims.add_argument("--results", type=Path, default=Path("results"), help="results root (default: results)")


def run_claims(args: argparse.Namespace) -> int:
    from bench.claims.autotune import (
        ensure_autotune_rows,  # late: pandas and the estimator only here
    )
    from bench.claims.evaluate import evaluate_all, table_folder
    from bench.claims.evidence import check_runs_files
    from bench.claims.table import write_claims

    measured = sorted(args.results.glob("claims_*/*/runs.csv"))
    if not any(path.parts[-3] != "claims_autotune" for path in measured):
        raise ResultsFileError(f"--results {args.results}: no claims rows (claims_*/<device-tag>/runs.csv) "
                               "under it; run `make claims` (or `bench run experiments/claims/*.toml`) first")
    check_runs_files(measured)
    print(f"autotune rows: {ensure_autotune_rows(args.results)}")
    findings = evaluate_all(args.results)
    written = write_claims(findings, args.results / "claims" / table_folder(findings))
    counts = Counter(finding.verdict for finding in findings)
    print(", ".join(f"{count} {verdict}" for verdict, count in sorted(counts.items())))
    print(f"wrote {', '.join(str(path) for path in written)}")
    return 0
