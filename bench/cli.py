"""Command line: `bench list`, `bench run`, `bench equivalence`. Parse, build, run; nothing else here."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import get_args

from bench.cell import OptimizerName
from bench.device import DeviceInfo, DeviceUnavailable, detect_device
from bench.equivalence import VARIANTS, DType
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


def _equivalence(args: argparse.Namespace) -> int:
    from bench.display import comparison_table, console
    from bench.equivalence import EquivalenceError, Settings, compare, prepare

    device = detect_device(args.device)
    try:
        settings = Settings(model=args.model, effective_batch=args.effective_batch, image_size=args.image_size,
                            dtype=args.dtype, device=device.type, seed=args.seed, optimizer=args.optimizer)
        comparison = compare(prepare(settings, args.variant), args.accum_steps)
    except EquivalenceError as exc:
        flag = {"model": "MODEL", "accum_steps": "--accum"}.get(exc.setting, "--" + exc.setting.replace("_", "-"))
        print(f"bench equivalence: {flag}: {exc.message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    console.print(comparison_table(comparison))
    verdict = "equivalent" if comparison.equivalent else "NOT equivalent"
    console.print(f"[bold]{verdict}[/] (rule: relative L2 of the gradients and of the BatchNorm statistics "
                  f"<= {comparison.tolerance:g} in {settings.dtype}): {comparison.reason}")
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

    for sub in (listing, run):
        sub.add_argument("files", nargs="+", type=Path, metavar="FILE", help="grid file (TOML)")
        sub.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                         help="auto: CUDA if present, else the CPU profile")

    equivalence = commands.add_parser("equivalence", help="one step: K accumulated micro-batches against one large batch")
    equivalence.set_defaults(handler=_equivalence)
    equivalence.add_argument("model", metavar="MODEL", help="timm model name, random init")
    equivalence.add_argument("--effective-batch", type=int, required=True, help="samples in the step (N)")
    equivalence.add_argument("--accum", dest="accum_steps", type=int, required=True,
                             help="micro-batches accumulated (K); must divide N")
    equivalence.add_argument("--variant", choices=tuple(VARIANTS), default="correct",
                             help="; ".join(f"{name}: {setup.summary}" for name, setup in VARIANTS.items()))
    equivalence.add_argument("--image-size", type=int, default=32, help="square image side in pixels (default: 32)")
    equivalence.add_argument("--dtype", choices=get_args(DType), default="fp32", help="weights and inputs (default: fp32)")
    equivalence.add_argument("--optimizer", choices=get_args(OptimizerName), default="sgd",
                             help="the step that turns gradients into weights (default: sgd)")
    equivalence.add_argument("--seed", type=int, default=0, help="seeds the weights and the batch (default: 0)")
    equivalence.add_argument("--device", choices=("auto", "cuda", "cpu"), default="cpu",
                             help="cpu (default), cuda, or auto: CUDA if present")
    return parser


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


if __name__ == "__main__":
    sys.exit(main())
