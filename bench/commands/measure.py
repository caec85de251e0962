"""`bench measure`: one cell from flags, run as `bench run` runs a grid's cell, its row appended to the results."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from bench.commands.common import add_device_option, positive, positive_int
from bench.commands.formats import add_format_option, answer_only, emit
from bench.commands.memory import add_axis_options
from bench.commands.model_options import MODEL_HELP, add_model_options, check_built, check_reference, model_fields
from bench.errors import OptionError
from bench.grid.cell import Cell, probe_options
from bench.grid.spec import NAME_PATTERN, Grid, RunSettings, require_precisions

_RUN = RunSettings()


def register(commands: argparse._SubParsersAction) -> None:
    measure = commands.add_parser("measure", help="measure one configuration given by flags, in its own process, "
                                                  "and append its row to the results folder")
    measure.set_defaults(handler=measure_cell)
    measure.add_argument("model", metavar="MODEL", help=MODEL_HELP + "; random init")
    measure.add_argument("--micro-batch", type=positive_int, required=True, help="samples per forward/backward")
    measure.add_argument("--accum-steps", "--accum", type=positive_int, default=1,
                         help="micro-batches per optimizer step, K (default 1)")
    add_axis_options(measure)
    add_model_options(measure)
    measure.add_argument("--warmup-steps", type=positive_int, default=_RUN.warmup_steps,
                         help=f"optimizer steps before measuring (default {_RUN.warmup_steps})")
    measure.add_argument("--measured-steps", type=positive_int, default=_RUN.measured_steps,
                         help=f"timed optimizer steps (default {_RUN.measured_steps})")
    measure.add_argument("--experiment", default="measure",
                         help="experiment name: the rows go to RESULTS/<experiment>/<device-tag>/runs.csv "
                              "(default: measure)")
    measure.add_argument("--results", type=Path, default=Path("results"), help="results root (default: results)")
    measure.add_argument("--force", action="store_true", help="measure again when the cell already has a row")
    measure.add_argument("--timeout-s", type=positive, default=_RUN.timeout_s,
                         help=f"the cell's time limit (default {_RUN.timeout_s:g})")
    measure.add_argument("--memory-limit-gib", type=positive,
                         help="cap the cell's memory (GPU memory on CUDA, address-space growth on CPU)")
    add_device_option(measure)
    add_format_option(measure)


def measure_cell(args: argparse.Namespace) -> int:
    if not re.fullmatch(NAME_PATTERN, args.experiment) or len(args.experiment) > 64:
        raise OptionError(f"--experiment {args.experiment!r}: letters, digits, _ and - (at most 64), as a grid "
                          "file's experiment.name")
    check_reference(args.model)
    fields = model_fields(args, args.image_size)
    from bench.measure.device import detect_device  # late: the device and the runner load torch
    from bench.report.console import console, summary_table
    from bench.results.lock import runner_lock
    from bench.run.grid_runner import RunOptions, results_dir, run_grid

    device = detect_device(args.device)
    profile = "cuda" if device.type == "cuda" else "cpu"
    cell = Cell(experiment=args.experiment, profile=profile, model=args.model, micro_batch=args.micro_batch,
                accum_steps=args.accum_steps, warmup_steps=args.warmup_steps, measured_steps=args.measured_steps,
                **{**{name: getattr(args, name) for name in probe_options()}, **fields})
    grid = Grid(path=Path("bench measure"), name=args.experiment, description="one cell from bench measure",
                profile=profile, profile_description="",
                run=RunSettings(warmup_steps=args.warmup_steps, measured_steps=args.measured_steps,
                                timeout_s=args.timeout_s), cells=(cell,))
    require_precisions(grid, device.precisions, device.name)
    check_built(cell)
    folder = results_dir(grid, device, args.results)
    options = RunOptions(results_root=args.results, force=args.force, memory_limit_gib=args.memory_limit_gib)
    with answer_only(args.format == "json"), runner_lock(args.results):
        existing = args.force is False and cell.cell_id in _ids(folder)
        rows = run_grid(grid, device, options)
    if args.format == "json":
        emit("measure", {"runs_file": folder / "runs.csv", "measured": not existing, "row": rows[0]})
        return 0 if rows[0]["status"] == "ok" else 1
    console.print(summary_table(f"{cell.cell_id} on {device.name} ({device.type}, {device.threads} threads)", rows))
    console.print(f"{'already measured, not run again (--force measures it again)' if existing else 'appended'}: "
                  f"{folder / 'runs.csv'}")
    return 0 if rows[0]["status"] == "ok" else 1


def _ids(folder: Path) -> set[str]:
    from bench.results.store import RunsFile

    path = folder / "runs.csv"
    return RunsFile(path).cell_ids() if path.is_file() else set()
