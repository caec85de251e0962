"""`bench equivalence`: one step as K accumulated micro-batches against one large batch, or the whole study."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import get_args

from bench.commands.common import add_device_option, positive_int, positive_int_list
from bench.commands.formats import add_format_option
from bench.errors import OptionError
from bench.grid.cell import OptimizerName
from bench.measure.device import detect_device


def register(commands: argparse._SubParsersAction) -> None:
    from bench.equivalence.variants import STUDY_ACCUM_STEPS, STUDY_MODELS, VARIANTS, DType

    equivalence = commands.add_parser(
        "equivalence", help="one step: K accumulated micro-batches against one large batch (--study: every variant)")
    equivalence.set_defaults(handler=run_equivalence)
    add_format_option(equivalence, text_only=True)
    equivalence.add_argument("models", nargs="*", metavar="MODEL",
                             help=f"timm model name(s), random init (--study default: {', '.join(STUDY_MODELS)})")
    equivalence.add_argument("--study", action="store_true",
                             help="every variant at every K -> equivalence.csv, .md and .png in --out")
    equivalence.add_argument("--effective-batch", type=positive_int,
                             help="samples in the step (N); required without --study (study default: 32)")
    equivalence.add_argument("--accum", dest="accum_steps", type=positive_int_list,
                             help="micro-batches accumulated (K), dividing N; one value, or a comma-separated list "
                                  f"with --study (default: {','.join(map(str, STUDY_ACCUM_STEPS))})")
    equivalence.add_argument("--variant", choices=tuple(VARIANTS), default="correct",
                             help="; ".join(f"{name}: {setup.summary}" for name, setup in VARIANTS.items()))
    equivalence.add_argument("--image-size", type=positive_int, default=32, help="square image side in pixels (default: 32)")
    equivalence.add_argument("--dtype", choices=get_args(DType), default="fp32", help="weights and inputs (default: fp32)")
    equivalence.add_argument("--optimizer", choices=get_args(OptimizerName), default="sgd",
                             help="the step that turns gradients into weights (default: sgd)")
    equivalence.add_argument("--seed", type=int, default=0, help="seeds the weights and the batch (default: 0)")
    equivalence.add_argument("--out", type=Path, help="--study: folder for its files (default: results/equivalence/<cpu|cuda>)")
    add_device_option(equivalence, default="cpu", help="cpu (default), cuda, or auto: CUDA if present")


def run_equivalence(args: argparse.Namespace) -> int:
    return run_study(args) if args.study else compare_step(args)


def compare_step(args: argparse.Namespace) -> int:
    from bench.equivalence.compare import EquivalenceError, Settings, compare, prepare
    from bench.equivalence.table import comparison_table
    from bench.report.console import console

    if len(args.models) != 1:
        raise OptionError(f"MODEL: name one model (got {len(args.models)}); several only with --study")
    if args.effective_batch is None or args.accum_steps is None or len(args.accum_steps) != 1:
        raise OptionError("--effective-batch and --accum: required, one value each (lists only with --study)")
    device = detect_device(args.device)
    try:
        settings = Settings(model=args.models[0], effective_batch=args.effective_batch, image_size=args.image_size,
                            dtype=args.dtype, device=device.type, seed=args.seed, optimizer=args.optimizer)
        comparison = compare(prepare(settings, args.variant), args.accum_steps[0])
    except EquivalenceError as exc:
        flag = {"model": "MODEL", "accum_steps": "--accum"}.get(exc.setting, "--" + exc.setting.replace("_", "-"))
        raise OptionError(f"{flag}: {exc.message}") from None
    console.print(comparison_table(comparison))
    verdict = "equivalent" if comparison.equivalent else "NOT equivalent"
    console.print(f"[bold]{verdict}[/] (rule: relative L2 of the gradients and of the BatchNorm statistics "
                  f"<= {comparison.tolerance:g} in {settings.dtype}): {comparison.reason}")
    return 0


def run_study(args: argparse.Namespace) -> int:
    from bench.equivalence.compare import EquivalenceError
    from bench.equivalence.study import run_study as measure_study
    from bench.equivalence.variants import STUDY_ACCUM_STEPS, STUDY_MODELS
    from bench.equivalence.table import write_study_tables
    from bench.results.store import EQUIVALENCE_FOLDER, results_folder

    device = detect_device(args.device)
    out = args.out or results_folder(Path("results"), EQUIVALENCE_FOLDER, device.type)

    def show(row: dict) -> None:
        k = "" if row.get("accum_steps") is None else f" K={row['accum_steps']}"
        outcome = ("skipped" if row["status"] == "skipped" else "equal" if row["equivalent"] else "differs")
        detail = row["reason"] if row["status"] == "skipped" else f"gradient relative L2 {row['grad_rel_l2']:.2e}"
        print(f"  {outcome:<8} {row['model']} {row['variant']}{k}: {detail}")

    try:
        path = measure_study(tuple(args.models) or STUDY_MODELS, tuple(args.accum_steps or STUDY_ACCUM_STEPS),
                             effective_batch=args.effective_batch or 32, image_size=args.image_size,
                             dtype=args.dtype, device=device, out=out, on_row=show)
    except EquivalenceError as exc:  # a model or size no variant can run
        raise OptionError(f"{'MODEL' if exc.setting == 'model' else '--' + exc.setting.replace('_', '-')}: "
                          f"{exc.message}") from None
    written = [path, *write_study_tables(out)]
    print(f"wrote {', '.join(str(p) for p in written)}")
    return 0
