"""`bench estimate` and `bench probe`: peak memory predicted without a device, and the largest micro-batch."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.commands.common import (
    add_cache_option,
    add_device_option,
    axis_value,
    non_negative,
    positive,
    positive_int,
)
from bench.commands.formats import (
    INTERACTIVE,
    add_format_option,
    answer_only,
    emit,
    estimate_document,
    probe_document,
)
from bench.commands.model_options import (
    MODEL_HELP,
    add_model_options,
    check_built,
    check_reference,
    model_fields,
    model_sources,
)
from bench.grid.cell import PROBE_DEFAULTS, choices, field_docs, field_types, probe_options
from bench.memory.fit import DEFAULT_HEADROOM


def register(commands: argparse._SubParsersAction) -> None:
    estimate = commands.add_parser("estimate", help="predicted peak memory of every cell, without running it")
    estimate.set_defaults(handler=estimate_grids)
    estimate.add_argument("files", nargs="+", type=Path, metavar="FILE", help="grid file (TOML)")
    estimate.add_argument("--profile", choices=("cuda", "cpu"), default="cuda",
                          help="cuda: the grid as written, predicted for a GPU (default); cpu: its CPU profile")
    estimate.add_argument("--results", type=Path, default=Path("results"),
                          help="results root; rows go to <root>/<experiment>/estimate/ (default: results)")
    add_cache_option(estimate)
    add_format_option(estimate)

    probe = commands.add_parser("probe", help="the largest micro-batch that fits: estimated, then found by real runs")
    probe.set_defaults(handler=probe_model)
    probe.add_argument("model", metavar="MODEL", help=MODEL_HELP + "; random init")
    add_axis_options(probe)
    add_model_options(probe)
    probe.add_argument("--accum-steps", type=positive_int, default=1, help="micro-batches per optimizer step (default 1)")
    answer = probe.add_mutually_exclusive_group()
    answer.add_argument("--memory-gib", type=positive, help="answer from the estimator alone for a GPU with this much memory")
    answer.add_argument("--gpu", action="append", metavar="GPU",
                        help="answer from the estimator alone for this catalog GPU (e.g. A100-40GB); repeat it for "
                             "several GPUs, each micro-batch traced once for all")
    answer.add_argument("--memory-limit-gib", type=positive,
                        help="cap each trial's memory (GPU memory on CUDA; address-space growth on CPU, required there)")
    probe.add_argument("--headroom", type=non_negative, default=DEFAULT_HEADROOM,
                       help="fraction of the peak kept free when answering for a GPU from the estimator "
                            f"(default {DEFAULT_HEADROOM:g}, as bench plan)")
    add_device_option(probe, help="device for real trials")
    probe.add_argument("--timeout-s", type=positive, default=600.0, help="per-trial time limit (default 600)")
    add_cache_option(probe)
    add_format_option(probe)


def add_axis_options(probe: argparse.ArgumentParser) -> None:
    """One option per axis the probe takes (`bench.grid.cell.probe_options`), typed as the grid's."""
    for name, default in probe_options().items():
        flag, doc = "--" + name.replace("_", "-"), field_docs()[name]
        if field_types()[name] is bool:
            probe.add_argument(flag, action="store_true", help=doc)
        elif choices(name):
            probe.add_argument(flag, choices=choices(name), default=default, help=f"{doc} (default {default})")
        elif name == "image_size":  # unsaid: an hf-hub model's config decides (`model_fields`)
            probe.add_argument(flag, type=axis_value(name), help=f"{doc} (default {default}, or an hf-hub model's "
                                                                     "config's)")
        else:
            probe.add_argument(flag, type=axis_value(name), default=default, help=f"{doc} (default {default})")


def _start_far_end_early(files: list[Path], profile: str) -> None:
    """Start the fork server now when a grid will be traced from both ends (its far end by a child of the server):
    the server's imports then run beside this command's own, not after them. Read without the model checks (torch
    free); a file that does not load is left to the command, which says why."""
    from bench.errors import BadInput
    from bench.grid.spec import load_grid
    from bench.memory.traces import start_far_end_early

    try:
        cells = max(len(load_grid(path, profile, check_models=False).cells) for path in files)
    except (BadInput, OSError):
        return
    start_far_end_early(cells)


def estimate_grids(args: argparse.Namespace) -> int:
    _start_far_end_early(args.files, args.profile)
    from bench.api import estimate_grids as estimate
    from bench.report.console import steps

    name = ""  # the grid being estimated, for the progress bar
    with answer_only(args.format == "json"), steps(None, INTERACTIVE) as step:
        def begin(grid) -> None:
            nonlocal name
            name = grid.name
            step.expect(len(grid.cells))
            step.say(f"{grid.name}: {len(grid.cells)} cells, profile {grid.profile}, estimated without a device")

        def show(row: dict, index: int, total: int) -> None:
            from bench.memory.estimate_grid import describe_estimate  # loaded by now: the grids passed their checks

            step.say(f"  [{index + 1}/{total}] {describe_estimate(row)}")
            step.advance(f"{name} {index + 1}/{total}")

        grids = estimate(args.files, profile=args.profile, results_root=args.results, on_grid=begin, on_row=show)
        from bench.memory.validate import agreement_text

        for found in grids:
            step.say(f"  wrote {found.runs_file} and {found.chart}" if found.chart else
                     f"  wrote {found.runs_file}; no cell could be estimated, so no chart")  # each error on its line
            for model, measured in found.agreements.items():  # how far such a fit / does-not-fit answer has been right
                step.say(f"  {model}: {agreement_text(measured)}")
    if args.format == "json":
        emit("estimate", {"grids": [estimate_document(found) for found in grids]})
    return 0


def probe_model(args: argparse.Namespace) -> int:
    import sys

    from bench.api import probe_report
    from bench.memory.probe import probe_text

    check_reference(args.model)
    fields = model_fields(args, args.image_size, default_image_size=PROBE_DEFAULTS["image_size"])
    sources = model_sources(args, args.image_size, default_image_size=PROBE_DEFAULTS["image_size"])
    if sources:
        print(f"model: {sources}", file=sys.stderr, flush=True)

    def announce(text: str) -> None:  # progress on stderr: the answer alone goes to stdout
        print(text, file=sys.stderr, flush=True)

    axes = {**{name: getattr(args, name) for name in probe_options()}, **fields}
    with answer_only(args.format == "json"):
        report = probe_report(args.model, gpus=args.gpu or (), memory_gib=args.memory_gib,
                              memory_limit_gib=args.memory_limit_gib, device=args.device,
                              accum_steps=args.accum_steps, headroom=args.headroom, timeout_s=args.timeout_s,
                              check_cell=check_built, on_trial=lambda trial: announce(f"  {trial.describe()}"),
                              on_text=announce, **axes)
    if args.format == "json":
        emit("probe", probe_document(report, sources))
    else:
        print(probe_text(report))
    return 0 if report.every_budget_fits_one else 1
