"""`bench cost` and `bench plan`: measured rows turned into dollars per training run."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.commands.common import (
    add_cache_option,
    axis_value,
    fraction,
    non_negative,
    positive,
    positive_int,
    require_folders,
)
from bench.commands.formats import INTERACTIVE, add_format_option, answer_only, cost_document, emit
from bench.commands.model_options import (
    MODEL_HELP,
    add_model_options,
    check_built,
    check_reference,
    model_extras,
    model_fields,
)
from bench.cost.price import Assumptions, Workload
from bench.errors import OptionError


def register(commands: argparse._SubParsersAction) -> None:
    cost = commands.add_parser("cost", help="dollars per run of every measured row on every catalog instance")
    cost.set_defaults(handler=price_folders)
    plan = commands.add_parser("plan", help="rank instance x configuration by dollars per run for a target batch "
                                            "(measured rows where given, the throughput model elsewhere)")
    plan.set_defaults(handler=plan_run)
    plan.add_argument("--model", help=MODEL_HELP + ", as in the rows (or give it first: bench plan MODEL ...)")
    add_model_options(plan)
    plan.add_argument("--effective-batch", type=positive_int, required=True, help="samples per optimizer step, all GPUs")
    plan.add_argument("--image-size", type=axis_value("image_size"), help="only rows at this image size")
    plan.add_argument("--budget-usd", type=positive, help="leave out options costing more per run")
    plan.add_argument("--deadline-hours", type=positive, help="leave out options taking longer per run")
    plan.add_argument("--spot", action="store_true", help="rank by spot prices (options without one are left out)")
    plan.add_argument("--rank-by", choices=("cost", "hours"), default="cost",
                      help="rank by dollars per run (cost, the default) or by hours per run (hours)")
    plan.add_argument("--top", type=positive_int, default=10, help="options to print (default 10)")
    plan.add_argument("--wide", action="store_true",
                      help="every column on the option's line (feeding, basis), unwrapped; default: lines as wide as "
                           "the terminal (120 characters when not one), the basis after the table")
    plan.add_argument("--gpu", action="append", default=[], metavar="KEY",
                      help="only instances with this catalog GPU (repeatable; default: every GPU)")
    plan.add_argument("--precision", action="append", choices=("bf16", "fp16", "tf32", "fp32"), default=[],
                      help="precisions to predict (repeatable; default bf16, fp16, tf32)")
    plan.add_argument("--checkpointing", action="append", choices=("off", "full"), default=[],
                      help="checkpointing modes to predict (repeatable; default off)")
    plan.add_argument("--optimizer", choices=("adamw", "sgd", "adamw8bit"), default="adamw",
                      help="optimizer of the predicted options (default adamw)")
    plan.add_argument("--launch-spec", type=Path, metavar="FILE.yaml",
                      help="also write a SkyPilot task that measures the cheapest option on its instance, with "
                           "the grid it runs (FILE.toml) and this repository at the current commit "
                           "(FILE.src.tar.gz) beside it (docs/cloud.md)")
    plan.add_argument("--predict", choices=("auto", "always", "never"), default="auto",
                      help="throughput-model options: auto (when the rows hold no GPU row of the model), always "
                           "(beside the measured ones: a measured row wins on its own GPU, a measurement scaled by "
                           "the model's ratio between two GPUs over the model alone, the model over a measured MFU "
                           "carried to another GPU), never (default auto)")
    add_cache_option(plan)
    cost.add_argument("folders", nargs="+", type=Path, metavar="RESULTS_DIR",
                      help="results/<experiment>/<device-tag> folder with a runs.csv (a predicted/ folder too)")
    plan.add_argument("folders", nargs="*", type=Path, metavar="RESULTS_DIR",
                      help="results folders whose rows are priced too (optional: without any, every option is "
                           "predicted)")
    workload, assumptions = Workload(), Assumptions()  # the defaults, stated once in the dataclasses
    for sub in (cost, plan):
        sub.add_argument("--dataset-size", type=positive_int, default=workload.dataset_size,
                         help=f"samples per epoch (default: ImageNet-1k train, {workload.dataset_size:,})")
        sub.add_argument("--epochs", type=positive, default=workload.epochs,
                         help=f"epochs per run (default {workload.epochs:g})")
        sub.add_argument("--scaling-efficiency", type=fraction, default=assumptions.scaling_efficiency,
                         help="multi-GPU speed-up as a fraction of the GPU count where no DDP row measured it "
                              f"(default {assumptions.scaling_efficiency:g})")
        sub.add_argument("--headroom", type=non_negative, default=assumptions.headroom,
                         help=f"memory kept free above the measured peak, fraction of it (default "
                              f"{assumptions.headroom:.2f})")
        sub.add_argument("--provider", action="append", default=[], help="only this provider's instances (repeatable)")
        sub.add_argument("--catalog", type=Path, help="instance catalog CSV (default: bench/data/instances.csv)")
        sub.add_argument("--include-superseded", action="store_true", help="also price superseded catalog rows")
        sub.add_argument("--allow-cpu-projection", action="store_true",
                         help="project CPU-profile rows to GPUs (labelled; never GPU measurements)")
        sub.add_argument("--loader-rows", action="append", type=Path, default=[], metavar="RESULTS_DIR",
                         help="results folder whose loader rows (input = loader) give the CPU cost per sample of "
                              "feeding a GPU, e.g. results/input_pipeline/<device-tag> (repeatable; default: the "
                              "loader rows among the folders priced)")
        add_format_option(sub)


def price_folders(args: argparse.Namespace) -> int:
    require_folders(args.folders)
    from bench.api import price
    from bench.cost.outputs import summary, write_outputs  # late: matplotlib only here
    from bench.report.console import steps
    from bench.results.store import preflight

    answers = []
    with answer_only(args.format == "json"), steps(len(args.folders), INTERACTIVE) as step:
        for folder in args.folders:
            step.advance(str(folder))
            table = price(folder, **_pricing(args))
            if not table.lines and not table.refused:
                step.say(f"{folder}: no ok rows, skipped")
                continue
            rows = len({line.row.cell_id for line in table.lines} | {r.row.cell_id for r in table.refused})
            loader = list(table.loader_costs), table.loader_source
            step.say(f"{folder}: {rows} ok rows x {len(table.instances)} instances")
            step.say(summary(table, table.catalog, *loader))
            written = []
            if table.lines:
                preflight(folder / "cost", "the cost tables", "nothing was written there")
                written = write_outputs(table, folder / "cost", f"{folder.parent.name} on {folder.name}",
                                        table.catalog, *loader)
                step.say(f"  wrote {', '.join(str(path) for path in written)}")
            answers.append(cost_document(folder, table, table.catalog, loader[0], written))
    if args.format == "json":
        emit("cost", {"folders": answers})
    return 0


def plan_run(args: argparse.Namespace) -> int:
    model, folders = _model_and_folders(args)
    require_folders(folders)
    _check_launch_spec(args.launch_spec)
    from bench.api import plan as make_plan
    from bench.planner.render import plan_record, plan_text
    from bench.report.console import steps

    fields = model_fields(args, args.image_size)
    with answer_only(args.format == "json"), steps(len(folders) + 1, INTERACTIVE, "plan") as step:
        plan = make_plan(folders, model=model, effective_batch=args.effective_batch, spot=args.spot,
                         budget_usd=args.budget_usd, deadline_hours=args.deadline_hours,
                         image_size=fields["image_size"], predict=args.predict, gpus=args.gpu,
                         precisions=args.precision, checkpointing=args.checkpointing, optimizer=args.optimizer,
                         model_options=model_extras(fields), rank_by=args.rank_by, check_cell=check_built,
                         on_text=_progress, on_step=step.advance, **_pricing(args))
    if args.launch_spec:
        _write_launch_spec(plan, args, plan.image_size if fields["image_size"] is None else fields["image_size"])
    if args.format == "json":
        emit("plan", plan_record(plan, args.top))
    else:
        print(plan_text(plan, args.top, wide=args.wide, width=_text_width()))
    return 0 if plan.options else 1


def _pricing(args: argparse.Namespace) -> dict:
    """The options `bench cost` and `bench plan` share, as `bench.api.price` and `plan` take them."""
    return dict(allow_cpu_projection=args.allow_cpu_projection, providers=args.provider, catalog=args.catalog,
                include_superseded=args.include_superseded, dataset_size=args.dataset_size, epochs=args.epochs,
                scaling_efficiency=args.scaling_efficiency, headroom=args.headroom, loader_rows=args.loader_rows)


def _check_launch_spec(path: Path | None) -> None:
    """A task file that can be written, checked before anything is planned."""
    if path is None:
        return
    if path.suffix not in (".yaml", ".yml"):
        raise OptionError(f"--launch-spec {path}: name the task file FILE.yaml (or .yml)")
    if any(not char.isprintable() for char in str(path)):
        raise OptionError(f"--launch-spec {str(path)!r}: a file name without control characters "
                          "(the task's comments quote it)")
    from bench.results.store import preflight

    if path.is_dir():
        raise OptionError(f"--launch-spec {path}: is a directory; name the task file FILE.yaml")
    preflight(path.parent, "the launch spec", "nothing was planned or written", keep_folder=False)


def _progress(text: str) -> None:
    """What the predictor did, on stderr like every command's progress: stdout holds the plan alone."""
    import sys

    from bench.planner.render import wrapped

    print("\n".join(wrapped(text, "  ", _text_width())), file=sys.stderr, flush=True)


def _model_and_folders(args: argparse.Namespace) -> tuple[str, list[Path]]:
    """`bench plan MODEL [RESULTS_DIR...]`, or `bench plan --model MODEL RESULTS_DIR...`."""
    items = list(args.folders)
    if args.model is None:
        if not items or items[0].is_dir():
            raise OptionError("MODEL: give the timm model first (bench plan MODEL --effective-batch N "
                              "[RESULTS_DIR...]) or --model")
        model, items = str(items.pop(0)), items
    else:
        model = args.model
    if args.predict != "never":
        check_reference(model)
    return model, items


def _text_width() -> int:
    """Columns a plan's lines may take: the terminal's (rich's console width) when stdout is one, else the plan's
    default (`bench.planner.render.WIDTH`)."""
    from bench.planner.render import WIDTH
    from bench.report.console import console

    return console.width if console.is_terminal else WIDTH


def _write_launch_spec(plan, args: argparse.Namespace, image_size: int | None) -> None:
    """The task, its grid and the source archive; what was written, the measurement's predicted cost and (without
    SkyPilot here) how to get it, on stderr (stdout holds the plan)."""
    import importlib.util
    import shlex
    import sys

    from bench.planner.launch import write_launch_spec

    files = write_launch_spec(plan, args.launch_spec, model_extras(model_fields(args, image_size)))
    print(f"launch spec: {files.task} (SkyPilot task), {files.grid.name} (the grid it runs), {files.source.name} "
          f"(commit {files.commit[:12]}); sky launch -c bench {shlex.quote(str(files.task))}", file=sys.stderr)
    print(f"  {files.measurement}", file=sys.stderr)
    if importlib.util.find_spec("sky") is None:
        print("  SkyPilot is not installed here (no module sky): pip install 'bench[cloud]' to launch the task "
              "(docs/cloud.md)", file=sys.stderr)
