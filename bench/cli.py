"""Command line: `bench list`, `run`, `report`, `cost`, `plan`, `equivalence`, `estimate`, `probe`, `claims`. Parse, build, run; nothing else here."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import get_args

from bench.catalog import CatalogError, Instance, load_catalog
from bench.claims.command import add_parser as add_claims_parser
from bench.cell import Checkpointing, OptimizerName, Precision
from bench.cost import Assumptions, Workload, price_rows
from bench.device import DeviceInfo, DeviceUnavailable, detect_device
from bench.equivalence import VARIANTS, DType
from bench.plan import PlanError, PlanRequest, make_plan
from bench.results import ResultsFileError
from bench.spec import Grid, SpecError, load_grid, require_precisions, timm_model_problem

EXIT_BAD_INPUT = 2


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.handler(args)
    except (SpecError, ResultsFileError, DeviceUnavailable, CatalogError, PlanError) as exc:
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


def _estimate(args: argparse.Namespace) -> int:
    from bench.estimate_grid import describe_estimate, estimate_grid  # late: fake tensors only here
    from bench.report.estimate_chart import write_estimate_chart

    grids = [load_grid(path, args.profile) for path in args.files]  # every file validated first
    for grid in grids:
        print(f"{grid.name}: {len(grid.cells)} cells, profile {grid.profile}, estimated without a device")
        path = estimate_grid(grid, args.results,
                             on_row=lambda row, index, total: print(f"  [{index + 1}/{total}] {describe_estimate(row)}"))
        print(f"  wrote {path} and {write_estimate_chart(path.parent)}")
    return 0


def _probe(args: argparse.Namespace) -> int:
    from bench.probe import (
        ProbeConfig, ProbeError, describe_probe, probe_budget, probe_from_estimate, probe_on_device,
    )

    problem = timm_model_problem(args.model)
    if problem:
        raise SpecError(f"MODEL: {problem}")
    config = ProbeConfig(model=args.model, image_size=args.image_size, precision=args.precision,
                         checkpointing=args.checkpointing, optimizer=args.optimizer,
                         channels_last=args.channels_last, accum_steps=args.accum_steps)
    budget = probe_budget(gpu=args.gpu, memory_gib=args.memory_gib, memory_limit_gib=args.memory_limit_gib,
                          device=args.device)
    try:
        result = (probe_from_estimate(config, budget) if budget.device is None
                  else probe_on_device(config, budget, args.memory_limit_gib, args.timeout_s))
    except ProbeError as exc:
        print(f"bench probe: {exc}", file=sys.stderr)
        return 1
    print(describe_probe(config, budget, result))
    return 0 if (result.found or result.predicted).largest > 0 else 1


def _load_all(files: list[Path], device: DeviceInfo) -> list[Grid]:
    profile = "cuda" if device.type == "cuda" else "cpu"
    grids = [load_grid(path, profile) for path in files]
    for grid in grids:
        require_precisions(grid, device.precisions, device.name)
    return grids


def _cost(args: argparse.Namespace) -> int:
    from bench.cost_report import load_ok_rows, summary, write_outputs  # late: matplotlib only here

    described, instances = _catalog(args)
    for folder in args.folders:
        rows = load_ok_rows(folder)
        if not rows:
            print(f"{folder}: no ok rows, skipped")
            continue
        table = price_rows(rows, instances, _workload(args), _assumptions(args))
        print(f"{folder}: {len(rows)} ok rows x {len(instances)} instances")
        print(summary(table, described))
        if table.lines:
            written = write_outputs(table, folder / "cost", f"{folder.parent.name} on {folder.name}", described)
            print(f"  wrote {', '.join(str(path) for path in written)}")
    return 0


def _plan(args: argparse.Namespace) -> int:
    from bench.cost_report import load_ok_rows, plan_text

    described, instances = _catalog(args)
    rows = [row for folder in args.folders for row in load_ok_rows(folder)]
    request = PlanRequest(model=args.model, effective_batch=args.effective_batch, workload=_workload(args),
                          image_size=args.image_size, budget_usd=args.budget_usd,
                          deadline_hours=args.deadline_hours, spot=args.spot)
    plan = make_plan(rows, instances, request, _assumptions(args))
    print(plan_text(plan, described, args.top))
    return 0 if plan.options else 1


def _catalog(args: argparse.Namespace) -> tuple[str, tuple[Instance, ...]]:
    """(what was loaded, in words; the instances selected)."""
    catalog = load_catalog(args.catalog)
    providers = tuple(args.provider)
    unknown = [name for name in providers if name not in catalog.providers]
    if unknown:
        raise CatalogError(f"--provider {unknown[0]}: not in {catalog.path}; known: {', '.join(catalog.providers)}")
    which = "current and superseded prices" if args.include_superseded else "current prices"
    only = f", {', '.join(providers)} only" if providers else ""
    return f"{catalog.path} ({which}{only})", catalog.select(include_superseded=args.include_superseded,
                                                            providers=providers)


def _workload(args: argparse.Namespace) -> Workload:
    return Workload(dataset_size=args.dataset_size, epochs=args.epochs)


def _assumptions(args: argparse.Namespace) -> Assumptions:
    return Assumptions(scaling_efficiency=args.scaling_efficiency, headroom=args.headroom,
                       allow_cpu_projection=args.allow_cpu_projection)


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

    cost = commands.add_parser("cost", help="dollars per run of every measured row on every catalog instance")
    cost.set_defaults(handler=_cost)
    plan = commands.add_parser("plan", help="rank instance x configuration by dollars per run for a target batch")
    plan.set_defaults(handler=_plan)
    plan.add_argument("--model", required=True, help="timm model name, as in the rows")
    plan.add_argument("--effective-batch", type=_positive_int, required=True, help="samples per optimizer step, all GPUs")
    plan.add_argument("--image-size", type=_positive_int, help="only rows at this image size")
    plan.add_argument("--budget-usd", type=_positive, help="leave out options costing more per run")
    plan.add_argument("--deadline-hours", type=_positive, help="leave out options taking longer per run")
    plan.add_argument("--spot", action="store_true", help="rank by spot prices (options without one are left out)")
    plan.add_argument("--top", type=_positive_int, default=10, help="options to print (default 10)")
    for sub in (cost, plan):
        sub.add_argument("folders", nargs="+", type=Path, metavar="RESULTS_DIR",
                         help="results/<experiment>/<device-tag> folder with a runs.csv")
        sub.add_argument("--dataset-size", type=_positive_int, default=1_281_167,
                         help="samples per epoch (default: ImageNet-1k train, 1,281,167)")
        sub.add_argument("--epochs", type=_positive, default=90.0, help="epochs per run (default 90)")
        sub.add_argument("--scaling-efficiency", type=_fraction, default=0.9,
                         help="multi-GPU speed-up as a fraction of the GPU count (default 0.9)")
        sub.add_argument("--headroom", type=_non_negative, default=0.10,
                         help="memory kept free above the measured peak, fraction of it (default 0.10)")
        sub.add_argument("--provider", action="append", default=[], help="only this provider's instances (repeatable)")
        sub.add_argument("--catalog", type=Path, help="instance catalog CSV (default: bench/data/instances.csv)")
        sub.add_argument("--include-superseded", action="store_true", help="also price superseded catalog rows")
        sub.add_argument("--allow-cpu-projection", action="store_true",
                         help="project CPU-profile rows to GPUs (labelled; never GPU measurements)")

    estimate = commands.add_parser("estimate", help="predicted peak memory of every cell, without running it")
    estimate.set_defaults(handler=_estimate)
    estimate.add_argument("files", nargs="+", type=Path, metavar="FILE", help="grid file (TOML)")
    estimate.add_argument("--profile", choices=("cuda", "cpu"), default="cuda",
                          help="cuda: the grid as written, predicted for a GPU (default); cpu: its CPU profile")
    estimate.add_argument("--results", type=Path, default=Path("results"),
                          help="results root; rows go to <root>/<experiment>/estimate/ (default: results)")

    add_claims_parser(commands)

    probe = commands.add_parser("probe", help="the largest micro-batch that fits: estimated, then found by real runs")
    probe.set_defaults(handler=_probe)
    probe.add_argument("model", metavar="MODEL", help="timm model name, random init")
    probe.add_argument("--image-size", type=_positive_int, default=224, help="square image side in pixels (default 224)")
    probe.add_argument("--precision", choices=get_args(Precision), default="fp32", help="(default fp32)")
    probe.add_argument("--checkpointing", choices=get_args(Checkpointing), default="off", help="(default off)")
    probe.add_argument("--optimizer", choices=get_args(OptimizerName), default="adamw", help="(default adamw)")
    probe.add_argument("--channels-last", action="store_true", help="model and inputs in channels-last format")
    probe.add_argument("--accum-steps", type=_positive_int, default=1, help="micro-batches per optimizer step (default 1)")
    answer = probe.add_mutually_exclusive_group()
    answer.add_argument("--memory-gib", type=_positive, help="answer from the estimator alone for a GPU with this much memory")
    answer.add_argument("--gpu", help="answer from the estimator alone for this catalog GPU (e.g. A100-40GB)")
    answer.add_argument("--memory-limit-gib", type=_positive,
                        help="cap each trial's memory (GPU memory on CUDA; address-space growth on CPU, required there)")
    probe.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="device for real trials")
    probe.add_argument("--timeout-s", type=_positive, default=600.0, help="per-trial time limit (default 600)")

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


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {text}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value
