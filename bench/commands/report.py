"""`bench report`: charts and REPORT.md regenerated from results folders."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.commands.common import require_folders
from bench.commands.formats import add_format_option
from bench.errors import ResultsFileError


def register(commands: argparse._SubParsersAction) -> None:
    report = commands.add_parser("report", help="regenerate charts and REPORT.md from results folders")
    report.set_defaults(handler=build_reports)
    add_format_option(report, text_only=True)
    report.add_argument("folders", nargs="+", type=Path, metavar="FOLDER",
                        help="results/<experiment>/<device-tag> (holding runs.csv), an estimate folder "
                             "(results/<experiment>/estimate: its chart) or an equivalence study's folder")


def build_reports(args: argparse.Namespace) -> int:
    require_folders(args.folders)
    from bench.results.store import EQUIVALENCE_CSV, preflight

    for folder in args.folders:  # every folder takes files before any report is drawn
        preflight(folder, "the report and its charts", "nothing was written")
    from bench.report import build_report  # late: matplotlib only here
    from bench.report.estimate_chart import write_estimate_chart
    from bench.results.read import file_schema

    for folder in args.folders:
        kind = file_schema(folder / "runs.csv").kind  # what the rows are, from the file's header
        if kind == "predicted":
            raise ResultsFileError(f"{folder}: predicted rows (bench predict), not measurements: nothing to report; "
                                   "bench predict writes their accumulation.csv, bench cost prices them")
        if kind == "autotune":
            raise ResultsFileError(f"{folder}: the estimator's largest batches for the claims table, not "
                                   "measurements: nothing to report; bench claims reads them")
        if (folder / EQUIVALENCE_CSV).is_file():  # an equivalence study's folder holds its CSV, not a runs file
            from bench.equivalence.table import write_study_tables  # here: the study's tolerances import torch

            written = write_study_tables(folder)
        elif kind == "estimated":  # estimates: their chart (no report: nothing was measured)
            written = [write_estimate_chart(folder)]
        else:
            written = build_report(folder)
        print(f"{folder}: wrote {', '.join(path.name for path in written)}")
    return 0
