"""`bench predict`: predicted speed on catalog GPUs without a GPU; the fit and validation of its model."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.commands.formats import add_format_option
from bench.errors import OptionError

VALIDATION_DIR = Path("docs/speed")


def register(commands: argparse._SubParsersAction) -> None:
    predict = commands.add_parser("predict", help="predicted samples/s of every cell on catalog GPUs, no GPU needed")
    predict.set_defaults(handler=predict_command)
    add_format_option(predict, text_only=True)
    predict.add_argument("files", nargs="*", type=Path, metavar="FILE", help="grid file (TOML); its CUDA grid")
    predict.add_argument("--gpu", action="append", default=[], metavar="KEY",
                         help="catalog GPU key (bench/data/gpus.csv; repeatable; default: every GPU)")
    predict.add_argument("--only", action="append", default=[], metavar="AXIS=VALUE",
                         help="predict only the cells with this axis value, e.g. optimizer=adamw (repeatable)")
    predict.add_argument("--results", type=Path, default=Path("results"),
                         help="results root; rows go to <root>/<experiment>/predicted/ (default: results)")
    mode = predict.add_mutually_exclusive_group()
    mode.add_argument("--fit", action="store_true",
                      help="refit the efficiency parameters on the traced reference rows -> bench/data/speed_params.json")
    mode.add_argument("--validate", action="store_true",
                      help=f"leave-one-GPU-out and leave-one-family-out errors, the intervals, cross-GPU ratios and "
                           f"the chart -> {VALIDATION_DIR}/")
    mode.add_argument("--trace-reference", action="store_true",
                      help="trace the reference subset again -> bench/data/reference/reference_ops.csv.gz (minutes)")
    mode.add_argument("--measure-host", action="store_true",
                      help="measure this CPU's dispatch cost per op -> bench/data/host_dispatch.csv")


def predict_command(args: argparse.Namespace) -> int:
    modes = [args.fit, args.validate, args.trace_reference, args.measure_host]
    if any(modes) and args.files:
        raise OptionError("FILE: --fit, --validate, --trace-reference and --measure-host take no grid files")
    if args.fit:
        return _fit()
    if args.validate:
        return _validate()
    if args.trace_reference:
        return _trace_reference()
    if args.measure_host:
        return _measure_host()
    if not args.files:
        raise OptionError("FILE: give at least one grid file (or --fit, --validate, --trace-reference, --measure-host)")
    return _predict(args)


def _predict(args: argparse.Namespace) -> int:
    from bench.api import predict_grids
    from bench.speed.params import load_model_file
    from bench.speed.predict import describe_prediction

    basis = load_model_file().basis()

    def begin(grid) -> None:
        print(f"{grid.name}: {len(grid.cells)} cells x {len(args.gpu) or 'every'} GPU, {basis}")

    grids = predict_grids(args.files, gpus=args.gpu, only=_only(args.only), results_root=args.results,
                          on_grid=begin, on_row=lambda row: print(f"  {describe_prediction(row)}"))
    for found in grids:
        if found.accumulation_file is None:
            print(f"  wrote {found.runs_file} (no accumulation.csv: no configuration of the grid has two splits to "
                  "compare)")
            continue
        print(f"  wrote {found.runs_file} and {found.accumulation_file} (throughput lost at the most-accumulated "
              "split, per GPU)")
        for line in found.accumulation:
            print(f"  {line['gpu']:<15} {line['model']} {line['precision']} ckpt-{line['checkpointing']} "
                  f"{line['optimizer']}: {line['accumulated_split']} loses {line['throughput_lost_pct']:.1f} % vs "
                  f"{line['large_split']} ({line['accumulated_bound']}-bound)")
    return 0


def _only(conditions: list[str]) -> dict[str, str]:
    """`--only AXIS=VALUE` options as axis -> value (axes and values are checked against the grid's by `Grid.only`)."""
    from bench.grid.cell import axes

    wanted = {}
    for condition in conditions:
        name, _, value = condition.partition("=")
        if not name or not value:
            raise OptionError(f"--only {condition}: want AXIS=VALUE with AXIS one of {', '.join(axes())}")
        wanted[name] = value
    return wanted


def _fit() -> int:
    from bench.api import refit_speed_model

    fitted = refit_speed_model()
    print(f"fitted on {fitted.rows} reference rows -> {fitted.path}; run --validate to re-measure its errors")
    print(fitted.text, end="")
    return 0


def _validate() -> int:
    from bench.api import validate_speed_model

    validated, text, written = validate_speed_model(VALIDATION_DIR)
    print(text)
    page, *charts = written
    print(f"wrote {page}, its CSVs, {' and '.join(map(str, charts))}; bands -> {validated.params_path}")
    return 0


def _trace_reference() -> int:
    from bench.api import trace_speed_reference

    path, traces = trace_speed_reference(
        on_begin=lambda rows: print(f"tracing the configurations of {rows} reference rows (channels-last; contiguous "
                                    "derived)"),
        on_trace=lambda row, outcome: print(f"  {row.trace}: {outcome}", flush=True))
    print(f"wrote {path} ({traces} traces)")
    return 0


def _measure_host() -> int:
    from bench.api import measure_speed_host

    row, path = measure_speed_host()
    print(f"{row['us_per_op']} us per dispatched op ({row['ops_per_step']} ops, fastest step {row['step_ms']} ms, "
          f"{row['cpu_model']}) -> {path}; refit (bench predict --fit) to use it")
    return 0
