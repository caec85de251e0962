"""`bench report`: charts and REPORT.md regenerated from results folders."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.commands.common import EXIT_BAD_INPUT


def register(commands: argparse._SubParsersAction) -> None:
    report = commands.add_parser("report", help="regenerate charts and REPORT.md from results folders")
    report.set_defaults(handler=build_reports)
    report.add_argument("folders", nargs="+", type=Path, metavar="FOLDER",
                        help="results/<experiment>/<device-tag> (holding runs.csv)")


def build_reports(args: argparse.Namespace) -> int:
    from bench.report import build_report  # late: matplotlib only here
    from bench.report.rows import RowsError

    try:
        for folder in args.folders:
            written = build_report(folder)
            print(f"{folder}: wrote {', '.join(path.name for path in written)}")
    except RowsError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0
