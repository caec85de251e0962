"""`bench report`: charts and REPORT.md regenerated from results folders."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(commands: argparse._SubParsersAction) -> None:
    report = commands.add_parser("report", help="regenerate charts and REPORT.md from results folders")
    report.set_defaults(handler=build_reports)
    report.add_argument("folders", nargs="+", type=Path, metavar="FOLDER",
                        help="results/<experiment>/<device-tag> (holding runs.csv), or an equivalence study's folder")


def build_reports(args: argparse.Namespace) -> int:
    from bench.equivalence.study import CSV_NAME  # late: matplotlib only here
    from bench.equivalence.table import write_study_tables
    from bench.report import build_report

    for folder in args.folders:
        # An equivalence study's folder holds its CSV instead of a runs file.
        written = write_study_tables(folder) if (folder / CSV_NAME).is_file() else build_report(folder)
        print(f"{folder}: wrote {', '.join(path.name for path in written)}")
    return 0
