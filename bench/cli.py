"""Command line: `bench list`, `bench run`, `bench report`. Parse, build, run; nothing else here."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from bench.device import DeviceInfo, DeviceUnavailable, detect_device
from bench.results import ResultsFileError
from bench.spec import Grid, SpecError, load_grid, require_precisions

EXIT_BAD_INPUT = 2


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.handler(args)
    except (SpecError, ResultsFileError, DeviceUnavailable) as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("bench: interrupted; rows of finished cells are kept, rerun to resume", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `bench list ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _list(args: argparse.Namespace) -> int:
    device = detect_device(args.device)
    for grid in _load_all(args.files, device):
        print(f"# {grid.name}: {len(grid.cells)} cells, profile {grid.profile} on {device.type} ({device.name})")
        for cell in grid.cells:
            print(cell.cell_id)
    return 0


def _run(args: argparse.Namespace) -> int:
    from bench.display import console, grid_progress, summary_table  # rich only for `run`
    from bench.runner import RunOptions, results_dir, run_grid

    # SIGTERM unwinds like Ctrl-C, so the runner's cleanup kills the cell it is waiting for.
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    device = detect_device(args.device)
    grids = _load_all(args.files, device)  # every file validated before anything is written
    options = RunOptions(results_root=args.results, force=args.force, retry_failed=args.retry_failed,
                         timeout_s=args.timeout_s, memory_limit_gib=args.memory_limit_gib)
    for grid in grids:
        folder = results_dir(grid, device, args.results)
        console.print(f"[bold]{grid.name}[/]: {len(grid.cells)} cells, profile [bold]{grid.profile}[/] "
                      f"on {device.type} ({device.name}, {device.threads} threads) -> {folder}/runs.csv")
        if grid.profile_description:
            console.print(f"  profile {grid.profile}: {grid.profile_description}")
        with grid_progress(grid.name) as (on_start, on_row):
            rows = run_grid(grid, device, options, on_row=on_row, on_start=on_start)
        console.print(summary_table(f"{grid.name} on {device.name} (profile {grid.profile})", rows))
    return 0


def _report(args: argparse.Namespace) -> int:
    from bench.report import build_report
    from bench.report.rows import RowsError

    try:
        for folder in args.folders:
            written = build_report(folder)
            print(f"{folder}: wrote {', '.join(path.name for path in written)}")
    except RowsError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


def _load_all(files: list[Path], device: DeviceInfo) -> list[Grid]:
    profile = "cuda" if device.type == "cuda" else "cpu"
    grids = [load_grid(path, profile) for path in files]
    for grid in grids:
        require_precisions(grid, device.precisions, device.name)
    return grids


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bench", description=__doc__)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    listing = commands.add_parser("list", help="print the expanded cells of grid files")
    listing.set_defaults(handler=_list)

    run = commands.add_parser("run", help="measure every cell of grid files, one process per cell")
    run.set_defaults(handler=_run)
    run.add_argument("--results", type=Path, default=Path("results"), help="results root (default: results)")
    run.add_argument("--force", action="store_true", help="re-measure cells that already have rows")
    run.add_argument("--retry-failed", action="store_true", help="re-measure cells whose row is error/timeout")
    run.add_argument("--timeout-s", type=_positive, help="per-cell time limit, overriding run.timeout_s")
    run.add_argument("--memory-limit-gib", type=_positive,
                     help="cap each cell's memory (GPU memory on CUDA, address-space growth on CPU)")

    report = commands.add_parser("report", help="regenerate charts and REPORT.md from results folders")
    report.set_defaults(handler=_report)
    report.add_argument("folders", nargs="+", type=Path, metavar="FOLDER",
                        help="results/<experiment>/<device-tag> (holding runs.csv)")

    for sub in (listing, run):
        sub.add_argument("files", nargs="+", type=Path, metavar="FILE", help="grid file (TOML)")
        sub.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                         help="auto: CUDA if present, else the CPU profile")
    return parser


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value
