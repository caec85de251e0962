"""`bench list` and `bench run`: expand grid files, measure their cells."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.api import load_for_device
from bench.commands.common import add_device_option, non_negative, positive, positive_int
from bench.commands.formats import add_format_option, emit, grid_document
from bench.grid.spec import MAX_CELLS, Grid, load_grid
from bench.measure.device import detect_device
from bench.run import start_cell_server
from bench.units import mb


def register(commands: argparse._SubParsersAction) -> None:
    listing = commands.add_parser("list", help="print the expanded cells of grid files")
    listing.set_defaults(handler=list_cells)
    listing.add_argument("--profile", choices=("cuda", "cpu"),
                         help="list this profile's cells on any machine: cuda (the grid as written) or cpu "
                              "(default: the profile of --device)")
    add_format_option(listing)

    run = commands.add_parser("run", help="measure every cell of grid files, one process per cell")
    run.set_defaults(handler=run_grids)
    add_format_option(run, text_only=True)
    run.add_argument("--results", type=Path, default=Path("results"), help="results root (default: results)")
    run.add_argument("--force", action="store_true", help="re-measure cells that already have rows")
    run.add_argument("--retry-failed", action="store_true", help="re-measure cells whose row is error/timeout")
    run.add_argument("--timeout-s", type=positive, help="per-cell time limit, overriding run.timeout_s")
    run.add_argument("--memory-limit-gib", type=positive,
                     help="cap each cell's memory (GPU memory on CUDA, address-space growth on CPU)")
    run.add_argument("--nproc", type=positive_int,
                     help="run every cell on N processes (DDP through torchrun), overriding grid.world_size")
    run.add_argument("--executor", choices=("local", "slurm"), default="local",
                     help="local: cells one after another here (default); slurm: one SLURM job per cell (submitit)")
    run.add_argument("--slurm-partition", help="SLURM partition of the jobs (default: the cluster's)")
    run.add_argument("--slurm-gpus-per-node", type=positive_int,
                     help="GPUs per job (default: the cell's world size on CUDA)")
    run.add_argument("--slurm-cpus-per-task", type=positive_int, help="CPU cores per job (default: the cluster's)")
    run.add_argument("--slurm-time-min", type=positive_int,
                     help="job time limit in minutes (default: the cell's time limit + 10)")
    run.add_argument("--slurm-folder", type=Path,
                     help="submitit's job folder, shared with the nodes (default: RESULTS/slurm_jobs)")
    run.add_argument("--wait", action="store_true",
                     help="when another runner holds the results folder, wait for it instead of exiting")
    run.add_argument("--threads", type=positive_int,
                     help="intra-op threads per cell on a CPU, overriding run.threads (default: the cores this "
                          "process may use: affinity mask, cgroup quota)")
    run.add_argument("--require-quiet", action="store_true",
                     help="a cell timed while other processes kept its cores busy is measured again (twice), then "
                          "recorded as a failure (MachineBusy) instead of a row timed under load")
    run.add_argument("--quiet-wait-s", type=non_negative,
                     help="seconds to wait at most before each cell for the machine to quieten, overriding "
                          "run.quiet_wait_s (default 120)")
    run.add_argument("--data-dir", type=Path,
                     help="ImageFolder tree (DIR/<class>/<image>.JPEG) the loader inputs read (default: the generated "
                          "ImageNet-like set, made once into the cache folder: bench data make)")

    for sub in (listing, run):
        sub.add_argument("files", nargs="+", type=Path, metavar="FILE", help="grid file (TOML)")
        sub.add_argument("--max-cells", type=positive_int, default=MAX_CELLS,
                         help=f"refuse a grid of more cells than this (default: {MAX_CELLS:,})")
        add_device_option(sub)


def list_cells(args: argparse.Namespace) -> int:
    if args.profile is None:
        device = detect_device(args.device)
        grids, where = load_for_device(args.files, device, args.max_cells), f"on {device.type} ({device.name})"
    else:  # a listing runs nothing: any profile on any machine
        from bench.train.model_bounds import load_checked_grid  # builds each model once, unless the cache knows it

        grids, where = ([load_checked_grid(path, args.profile, args.max_cells) for path in args.files],
                        "(asked for with --profile)")
    if args.format == "json":
        emit("list", {"grids": [grid_document(grid) for grid in grids]})
        return 0
    for grid in grids:
        print(f"# {grid.name}: {len(grid.cells)} cells, profile {grid.profile} {where}")
        for cell in grid.cells:
            print(cell.cell_id)
    return 0


def run_grids(args: argparse.Namespace) -> int:
    for path in args.files:  # the files checked before the runner and the device load torch
        load_grid(path, "cuda", max_cells=sys.maxsize)
    if args.executor == "local" and not (args.nproc and args.nproc > 1):  # cells fork from it (DDP ranks do not)
        start_cell_server()  # imports torch and timm while this process does
    from bench.report.console import (  # rich only for `run`
        console,
        grid_progress,
        summary_table,
    )
    from bench.results.lock import runner_lock
    from bench.run.executors import SlurmOptions, target_device
    from bench.run.grid_runner import (
        RunOptions,
        cell_device,
        existing_rows,
        measure_plan,
        results_dir,
        run_grid,
    )

    slurm = SlurmOptions(folder=args.slurm_folder or args.results / "slurm_jobs", partition=args.slurm_partition,
                         gpus_per_node=args.slurm_gpus_per_node, cpus_per_task=args.slurm_cpus_per_task,
                         time_min=args.slurm_time_min)
    device = target_device(args.device, args.executor, slurm)  # a compute node's under SLURM
    grids = load_for_device(args.files, device, args.max_cells)  # every file and its models' bounds checked
    data = data_for(grids, args.data_dir)  # so is the data dir
    options = RunOptions(results_root=args.results, force=args.force, retry_failed=args.retry_failed,
                         timeout_s=args.timeout_s, memory_limit_gib=args.memory_limit_gib, nproc=args.nproc,
                         executor=args.executor, slurm=slurm, data=data, threads=args.threads,
                         require_quiet=args.require_quiet, quiet_wait_s=args.quiet_wait_s)
    for grid in grids:
        results_dir(grid, device, args.results)  # every grid's folder name checked before anything runs
    with runner_lock(args.results, wait=args.wait):  # one runner per results folder
        for grid in grids:
            folder = results_dir(grid, device, args.results)
            threads = cell_device(grid, device, options).threads
            console.print(f"[bold]{grid.name}[/]: {len(grid.cells)} cells, profile [bold]{grid.profile}[/] "
                          f"on {device.type} ({device.name}, {threads} threads) -> {folder}/runs.csv")
            if grid.profile_description:
                console.print(f"  profile {grid.profile}: {grid.profile_description}")
            plan = measure_plan(grid, existing_rows(grid, device, options), options)
            console.print(f"  {plan.describe(folder / 'runs.csv')}")
            with grid_progress(grid.name) as (on_start, on_row):
                rows = run_grid(grid, device, options, on_row=on_row, on_start=on_start)
            measured_now = (f"{len(plan.todo)} measured now" if plan.todo
                            else "nothing measured now: rows of earlier runs")
            console.print(summary_table(f"{grid.name} on {device.name} (profile {grid.profile}; {measured_now})",
                                        rows))
            if grid.profile == "cpu":
                _cpu_profile_scope(grid, folder)
    return 0


def _cpu_profile_scope(grid: Grid, folder: Path) -> None:
    """After a CPU-profile grid: what its rows can and cannot show, and the grid as written, predicted."""
    from bench.report.build import sibling_estimates
    from bench.report.console import console, predicted_table
    from bench.report.tables import cpu_profile_banner, predicted_accumulation_cost
    from bench.results.read import read_runs

    console.print(cpu_profile_banner(read_runs(folder / "runs.csv")).replace("**", ""))
    predicted = predicted_accumulation_cost(sibling_estimates(folder))
    if predicted.empty:
        console.print(f"  no estimate of the grid as written yet: `bench estimate {grid.path}` predicts its peak "
                      "memory without a device")
    else:
        console.print(predicted_table("the grid as written, predicted (memory estimator, no device)", predicted))


def data_for(grids: list[Grid], data_dir: Path | None):
    """The data set of the grids' loader cells (None when they have none and no --data-dir is given):
    the --data-dir tree, checked, or the generated ImageNet-like set, made here on first use."""
    if data_dir is None and not any(cell.input != "synthetic" for grid in grids for cell in grid.cells):
        return None
    from bench.commands.data import announce_generation  # late: torchvision only here
    from bench.measure.host import usable_cpus
    from bench.train.data import open_data

    if data_dir is None:
        announce_generation()
    data = open_data(data_dir, processes=usable_cpus())
    print(f"data: {data.columns['data_set']} ({data.columns['data_source']}): {len(data):,} images, "
          f"{mb(data.columns['data_bytes'])}, {data.classes} classes")
    return data
