"""`bench estimate` and `bench probe`: peak memory predicted without a device, and the largest micro-batch."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path

from bench.commands.common import (
    add_cache_option,
    add_device_option,
    axis_value,
    non_negative,
    positive,
    positive_int,
)
from bench.commands.formats import INTERACTIVE, add_format_option, answer_only, emit, probe_document
from bench.commands.model_options import (
    MODEL_HELP,
    add_model_options,
    check_built,
    check_reference,
    model_fields,
    model_sources,
)
from bench.errors import refused_step
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


def estimate_grids(args: argparse.Namespace) -> int:
    from bench.train.model_bounds import load_checked_grid  # builds each model once, unless the cache knows it

    grids = [load_checked_grid(path, args.profile) for path in args.files]  # every file and its models' bounds
    from bench.memory.estimate_grid import (  # late: fake tensors only here
        describe_estimate,
        estimate_grid,
    )
    from bench.memory.validate import agreement, agreement_text
    from bench.report.console import steps
    from bench.report.estimate_chart import write_estimate_chart

    answers = []
    with answer_only(args.format == "json"), steps(sum(len(g.cells) for g in grids), INTERACTIVE) as step:
        for grid in grids:
            step.say(f"{grid.name}: {len(grid.cells)} cells, profile {grid.profile}, estimated without a device")
            rows: list[dict] = []

            def on_row(row: dict, index: int, total: int) -> None:
                rows.append(row)
                step.say(f"  [{index + 1}/{total}] {describe_estimate(row)}")
                step.advance(f"{grid.name} {index + 1}/{total}")

            path = estimate_grid(grid, args.results, on_row=on_row)  # a cell the model refuses is an error row
            if any(row["status"] == "estimated" for row in rows):
                chart = write_estimate_chart(path.parent)
                step.say(f"  wrote {path} and {chart}")
            else:  # nothing to draw: every cell's error is on its line above
                chart = None
                step.say(f"  wrote {path}; no cell could be estimated, so no chart")
            agreements = {model: agreement(model=model) for model in dict.fromkeys(cell.model for cell in grid.cells)}
            for model, measured in agreements.items():  # how far such a fit / does-not-fit answer has been right
                step.say(f"  {model}: {agreement_text(measured)}")
            answers.append({"name": grid.name, "file": grid.path, "profile": grid.profile, "runs_file": path,
                            "chart": chart, "rows": rows,
                            "estimator_agreement": {model: None if measured is None else
                                                    {**asdict(measured), "text": measured.describe()}
                                                    for model, measured in agreements.items()}})
    if args.format == "json":
        emit("estimate", {"grids": answers})
    return 0


def probe_model(args: argparse.Namespace) -> int:
    import sys

    from bench.memory.budget import probe_budget

    check_reference(args.model)
    fields = model_fields(args, args.image_size, default_image_size=PROBE_DEFAULTS["image_size"])
    sources = model_sources(args, args.image_size, default_image_size=PROBE_DEFAULTS["image_size"])
    if sources:
        print(f"model: {sources}", file=sys.stderr, flush=True)
    budgets = [probe_budget(gpu=gpu, memory_gib=args.memory_gib, memory_limit_gib=args.memory_limit_gib,
                            device=args.device, headroom=args.headroom) for gpu in args.gpu or [None]]
    from bench.memory.probe import (  # late: the estimator loads torch; the input is checked by now
        EstimatedPeaks,
        ProbeConfig,
        describe_probe,
        probe_from_estimate,
        probe_on_device,
    )

    config = ProbeConfig.of(args.model, args.accum_steps,
                            **{**{name: getattr(args, name) for name in probe_options()}, **fields})
    check_built(config.base)
    # Each trial as it ends, on stderr: the answer alone goes to stdout.
    def show(trial) -> None:
        print(f"  {trial.describe()}", file=sys.stderr, flush=True)

    peaks = EstimatedPeaks(config, "cuda")  # shared by every GPU asked for: each micro-batch traced once
    results = []
    for budget in budgets:
        print(f"probe: {config.describe()}; budget {budget.source}", file=sys.stderr, flush=True)
        with answer_only(args.format == "json"), refused_step(args.model, config.describe()):
            results.append(probe_from_estimate(config, budget, on_trial=show, peaks=peaks)
                           if budget.device is None else
                           probe_on_device(config, budget, args.memory_limit_gib, args.timeout_s, on_trial=show))
    from bench.memory.validate import agreement, agreement_text

    agreements = {headroom: agreement(headroom, model=args.model)
                  for headroom in {budget.headroom for budget in budgets}}
    if args.format == "json":
        emit("probe", probe_document(config, list(zip(budgets, results)), agreements, sources))
    else:
        print("\n\n".join(describe_probe(config, budget, result, agreement_text(agreements[budget.headroom]))
                            for budget, result in zip(budgets, results)))
    return 0 if all((result.found or result.predicted).largest > 0 for result in results) else 1
