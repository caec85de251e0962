"""`bench measure`: one cell from flags, run as `bench run` runs a grid's cell, its row appended to the results."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from bench.commands.common import add_device_option, pair_value, positive, setting_value
from bench.commands.formats import add_format_option, answer_only, emit
from bench.commands.memory import add_axis_options
from bench.commands.model_options import (
    MODEL_HELP,
    add_model_options,
    check_built,
    check_reference,
    model_config_source,
    model_fields,
    model_sources,
)
from bench.errors import OptionError
from bench.grid.cell import PROBE_DEFAULTS, Cell, probe_options
from bench.grid.spec import MAX_PAIR_VALUE, NAME_PATTERN, Grid, RunSettings, require_precisions
from bench.units import GIB

_RUN = RunSettings()
CPU_MEMORY_SHARE = 0.5
"""On a CPU, without --memory-limit-gib, the cell may grow by this share of the host's available memory: a cell
asked for by mistake fails as out of memory instead of bringing the host's OOM killer."""


def register(commands: argparse._SubParsersAction) -> None:
    measure = commands.add_parser("measure", help="measure one configuration given by flags, in its own process, "
                                                  "and append its row to the results folder")
    measure.set_defaults(handler=measure_cell)
    measure.add_argument("model", metavar="MODEL", help=MODEL_HELP + "; random init")
    measure.add_argument("--micro-batch", type=pair_value, required=True,
                         help=f"samples per forward/backward (at most {MAX_PAIR_VALUE:,}, as in a grid)")
    measure.add_argument("--accum-steps", "--accum", type=pair_value, default=1,
                         help="micro-batches per optimizer step, K (default 1; micro-batch x K at most "
                              f"{MAX_PAIR_VALUE:,})")
    add_axis_options(measure)
    add_model_options(measure)
    measure.add_argument("--warmup-steps", type=setting_value(RunSettings, "warmup_steps"),
                         default=_RUN.warmup_steps,
                         help=f"optimizer steps before measuring (default {_RUN.warmup_steps}; run.warmup_steps)")
    measure.add_argument("--measured-steps", type=setting_value(RunSettings, "measured_steps"),
                         default=_RUN.measured_steps,
                         help=f"timed optimizer steps (default {_RUN.measured_steps}; run.measured_steps)")
    measure.add_argument("--experiment", default="measure",
                         help="experiment name: the rows go to RESULTS/<experiment>/<device-tag>/runs.csv "
                              "(default: measure)")
    measure.add_argument("--results", type=Path, default=Path("results"), help="results root (default: results)")
    measure.add_argument("--force", action="store_true", help="measure again when the cell already has a row")
    measure.add_argument("--timeout-s", type=setting_value(RunSettings, "timeout_s"), default=_RUN.timeout_s,
                         help=f"the cell's time limit (default {_RUN.timeout_s:g}; run.timeout_s)")
    measure.add_argument("--quiet-wait-s", type=setting_value(RunSettings, "quiet_wait_s"),
                         default=_RUN.quiet_wait_s,
                         help="seconds to wait at most for other work to leave the cell's cores free, saying so "
                              f"(default {_RUN.quiet_wait_s:g}; 0: measure at once)")
    measure.add_argument("--memory-limit-gib", type=positive,
                         help="cap the cell's memory (GPU memory on CUDA, address-space growth on CPU; default on a "
                              f"CPU: {CPU_MEMORY_SHARE * 100:.0f}%% of the host's available memory)")
    add_device_option(measure)
    add_format_option(measure)


def measure_cell(args: argparse.Namespace) -> int:
    if not re.fullmatch(NAME_PATTERN, args.experiment) or len(args.experiment) > 64:
        raise OptionError(f"--experiment {args.experiment!r}: letters, digits, _ and - (at most 64), as a grid "
                          "file's experiment.name")
    if args.micro_batch * args.accum_steps > MAX_PAIR_VALUE:
        raise OptionError(f"--micro-batch {args.micro_batch} x --accum-steps {args.accum_steps}: an effective batch "
                          f"of at most {MAX_PAIR_VALUE:,}, as in a grid file")
    check_reference(args.model)
    fields = model_fields(args, args.image_size, default_image_size=PROBE_DEFAULTS["image_size"])
    sources = model_sources(args, args.image_size, default_image_size=PROBE_DEFAULTS["image_size"])
    config_source = model_config_source(args, args.image_size, default_image_size=PROBE_DEFAULTS["image_size"])
    if sources:
        print(f"model: {sources}", file=sys.stderr, flush=True)
    from bench.run import start_cell_server

    start_cell_server()  # the cell forks from it: its imports beside this one's
    from bench.measure.device import detect_device  # late: the device and the runner load torch
    from bench.report.console import console, summary_table
    from bench.results.lock import runner_lock
    from bench.run.grid_runner import RunOptions, results_dir, run_grid

    device = detect_device(args.device)
    profile = "cuda" if device.type == "cuda" else "cpu"
    cell = Cell(experiment=args.experiment, profile=profile, model=args.model, micro_batch=args.micro_batch,
                accum_steps=args.accum_steps, warmup_steps=args.warmup_steps, measured_steps=args.measured_steps,
                model_config_source=config_source,
                **{**{name: getattr(args, name) for name in probe_options()}, **fields})
    grid = Grid(path=Path("bench measure"), name=args.experiment, description="one cell from bench measure",
                profile=profile, profile_description="",
                run=RunSettings(warmup_steps=args.warmup_steps, measured_steps=args.measured_steps,
                                timeout_s=args.timeout_s, quiet_wait_s=args.quiet_wait_s), cells=(cell,))
    require_precisions(grid, device.precisions, device.name)
    check_built(cell)
    folder = results_dir(grid, device, args.results)
    options = RunOptions(results_root=args.results, force=args.force, memory_limit_gib=_memory_limit_gib(args, device))
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


def _memory_limit_gib(args: argparse.Namespace, device) -> float | None:
    """--memory-limit-gib, else on a CPU a share of the host's available memory (said on stderr)."""
    if args.memory_limit_gib is not None or device.type != "cpu":
        return args.memory_limit_gib
    from bench.measure.host import available_memory_bytes

    available = available_memory_bytes()
    if available is None:
        raise OptionError("--memory-limit-gib: required here (this host's available memory cannot be read, so no "
                          "default cap can be set on the cell)")
    limit_gib = CPU_MEMORY_SHARE * available / GIB
    print(f"memory limit: {limit_gib:.1f} GiB for the cell ({CPU_MEMORY_SHARE:.0%} of the host's available "
          f"{available / GIB:.1f} GiB; --memory-limit-gib sets it)", file=sys.stderr)
    return limit_gib


def _ids(folder: Path) -> set[str]:
    from bench.results.store import RunsFile

    path = folder / "runs.csv"
    return RunsFile(path).cell_ids() if path.is_file() else set()
