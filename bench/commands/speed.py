"""`bench predict`: predicted speed on catalog GPUs without a GPU; the fit and validation of its model."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from bench.commands.formats import add_format_option
from bench.errors import OptionError
from bench.frames import write_csv

DATA = Path(__file__).resolve().parents[1] / "data"
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
    from bench.speed.calibrate import fitted_params_json
    from bench.speed.params import PARAMS_FILE

    text, data = fitted_params_json()
    (DATA / PARAMS_FILE).write_text(text)
    print(f"fitted on {len(data.rows)} reference rows -> {DATA / PARAMS_FILE}; run --validate to re-measure "
          "its errors")
    print(text, end="")
    return 0


def _validate() -> int:
    from bench.report.speed_chart import write_validation_chart
    from bench.speed.calibrate import validation_json
    from bench.speed.params import PARAMS_FILE, load_model_file, params_json
    from bench.speed.validate import (ERROR_COLUMNS, PROJECTION_COLUMNS, VALIDATION_COLUMNS, cross_gpu_columns,
                                      cross_gpu_ratios, projection_band, projection_by_pair, projection_pairs,
                                      validation_tables)

    current = load_model_file()
    VALIDATION_DIR.mkdir(parents=True, exist_ok=True)
    tables = validation_tables()
    write_csv(tables["rows"], VALIDATION_DIR / "validation.csv", VALIDATION_COLUMNS)
    for name in ("logo_by_gpu", "logo_by_family", "lofo_by_family", "lofo_by_gpu"):
        write_csv(tables[name], VALIDATION_DIR / f"{name}.csv", (name.rpartition("_")[2], *ERROR_COLUMNS))
    pairs = projection_pairs()
    tables["projection"], tables["projection_by_pair"] = projection_band(pairs), projection_by_pair(pairs)
    write_csv(tables["projection_by_pair"], VALIDATION_DIR / "projection_by_pair.csv", PROJECTION_COLUMNS)
    # The cross-GPU bands go into the parameter file first: the ratios below are printed with them.
    validated = replace(current, bands=tables["bands"], projection=tables["projection"],
                        model_scaled=tables["model_scaled"], training_gpus=tables["training_gpus"])
    (DATA / PARAMS_FILE).write_text(params_json(current.version, current.params, current.fitted_on,
                                                validation_json(validated)))
    load_model_file.cache_clear()
    ratios = cross_gpu_ratios()
    write_csv(ratios, VALIDATION_DIR / "cross_gpu.csv", cross_gpu_columns())
    chart = write_validation_chart(
        [{**r, "predicted_samples_per_s": r["logo_predicted_samples_per_s"]} for r in tables["rows"]], "gpu",
        f"Leave-one-GPU-out: median error {tables['logo']['median_error_pct']} %, p90 "
        f"{tables['logo']['p90_error_pct']} % ({tables['logo']['rows']} rows)",
        "predicted samples/s (GPU held out of the fit)", VALIDATION_DIR / "validation.png")
    lofo_chart = write_validation_chart(
        [{**r, "predicted_samples_per_s": r["lofo_predicted_samples_per_s"]} for r in tables["rows"]], "family",
        f"Leave-one-family-out: median error {tables['lofo']['median_error_pct']} %, p90 "
        f"{tables['lofo']['p90_error_pct']} % ({tables['lofo']['rows']} rows)",
        "predicted samples/s (family held out of the fit)", VALIDATION_DIR / "validation_lofo.png")
    text = _validation_markdown(tables, ratios, current.version)
    (VALIDATION_DIR / "validation.md").write_text(text)
    print(text)
    print(f"wrote {VALIDATION_DIR}/validation.md, its CSVs, {chart} and {lofo_chart}; bands -> {DATA / PARAMS_FILE}")
    return 0


def _table(rows: list[dict], key: str) -> list[str]:
    lines = [f"| {key} | rows | median error % | p90 error % | median predicted / measured |", "|---|---|---|---|---|"]
    return lines + [f"| {r[key]} | {r['rows']} | {r['median_error_pct']} | {r['p90_error_pct']} | {r['median_ratio']} |"
                    for r in rows]


def _validation_markdown(tables: dict, ratios: list[dict], version: str) -> str:
    from bench.speed.params import BAND_MIN_GPUS, BAND_MIN_ROWS, UNSEEN_GENERATION
    from bench.speed.validate import BAND_COVERAGE_PCT

    logo, lofo = tables["logo"], tables["lofo"]
    low, high = tables["band_quantiles"]
    lines = [f"# Throughput model {version}: validation", "",
             "Every figure here is of rows the fit never saw. The rows (`bench/data/reference/`, sources in its "
             "README): timm's RTX 3090 training benchmark (AMP fp16), NVIDIA DeepLearningExamples training and "
             "inference on A100-40/80GB, V100-16/32GB and T4 (AMP, TF32, FP32; real data loading in its "
             "training rows), timm's inference benchmark on the RTX 3090 and 4090, Lambda's BERT-base and BERT-large "
             "training on H100 (SXM and PCIe), H200 and B200 (AMP and TF32, traced through a ViT of BERT's shapes). "
             "Error = |predicted / measured - 1|. Written by `bench predict --validate`.", "",
             f"- **Leave-one-GPU-out** (each GPU predicted by a fit without a row of it): median "
             f"**{logo['median_error_pct']} %**, p90 **{logo['p90_error_pct']} %** over {logo['rows']} rows "
             "(targets: median <= 10 %, p90 <= 25 %).",
             f"- **Leave-one-family-out** (each model family predicted by a fit without it): median "
             f"**{lofo['median_error_pct']} %**, p90 **{lofo['p90_error_pct']} %** (target: median <= 10 %).", "",
             f"- **Leave-one-source-out** (each benchmark suite with training rows predicted by a fit without it; "
             f"training rows): median "
             f"**{tables['loso']['median_error_pct']} %**, p90 **{tables['loso']['p90_error_pct']} %**.", "",
             "## The 80 % band every prediction carries", "",
             f"A prediction's interval is its value divided by the {high:g}th and {low:g}th percentiles of predicted / "
             "measured over held-out residuals of training rows only (inference rows never set a training step's band): "
             "each training row once predicted by a fit without its GPU and once by a fit without its source, "
             "pooled, in the narrowest slice that matches (kind of GPU and op mix, then kind of GPU, then all; a "
             f"slice needs {BAND_MIN_ROWS} residuals of {BAND_MIN_GPUS} GPUs). On a GPU whose generation has no "
             "training row (Turing and Ada here) each end is widened to the "
             f"`{UNSEEN_GENERATION}` slice's where that is wider: training rows predicted by a fit without any "
             "row of their generation. Each line says what its band rests on. Op mix: `matmul` where matmuls "
             "and attention do over half the compute FLOPs, else `grouped-conv` where any grouped or depthwise "
             "convolution runs, else `conv`.", "",
             f"Those percentiles are split-conformal over GPUs (`bench.speed.validate.calibrated_quantiles`): the "
             f"narrowest pair, from p10-p90 outward in steps of 0.5, whose band, set for each GPU by the other GPUs' "
             f"residuals, holds {BAND_COVERAGE_PCT:g} % of that GPU's held-out predictions (the nominal p10-p90 held "
             "less: residuals pooled from many rows of a few GPUs are narrower than what a new GPU meets).", "",
             "Measured coverage of the band on rows it never saw (each group's band from the other groups' "
             "residuals, applied to the group's held-out predictions; by GPU is how the percentiles were chosen, "
             "by source is the check): "
             + "; ".join(f"held out {how}: **{c['coverage_pct']} %** of {c['predictions']} predictions"
                         for how, c in tables["coverage"].items()) + " (target 75-85 %).", "",
             f"| slice | rows | median error % | p90 error % | predicted/measured p{low:g} | p{high:g} |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {key} | {b.rows} | {b.median_error_pct} | {b.p90_error_pct} | {b.ratio_low} | {b.ratio_high} |"
              for key, b in sorted(tables["bands"].items())]
    p = tables["projection"]
    lines += ["", "## A measured row carried to another GPU (`projected_from_gpu`)", "",
              "`bench cost` and `bench plan` price a GPU row on another GPU by carrying its MFU over to that GPU's "
              "datasheet peak. Done to every pair of public rows of one configuration (source, mode, precision, "
              f"model, memory format, batch, image size) on two GPUs, {p.rows} ordered pairs: median error "
              f"**{p.median_error_pct} %**, p90 **{p.p90_error_pct} %**, projected / measured p10 {p.ratio_low}, "
              f"p90 {p.ratio_high}: the interval such a line carries. Most pairs are the RTX 3090 and 4090, whose "
              "fp16 peaks differ 2.3x and bandwidths 1.08x.", "", "| from | to | pairs | median error % | "
              "p90 error % | median projected / measured |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['from_gpu']} | {r['to_gpu']} | {r['rows']} | {r['median_error_pct']} | {r['p90_error_pct']} | "
              f"{r['median_ratio']} |" for r in tables["projection_by_pair"]]
    scaled = tables["model_scaled"]
    lines += ["", f"Projected instead by the throughput model's ratio (Habitat's way: the measured samples/s times the "
              "predicted target / measured-GPU ratio, both predicted by the fit that never saw the target GPU), the "
              f"same {scaled.rows} pairs are off by median **{scaled.median_error_pct} %**, p90 "
              f"**{scaled.p90_error_pct} %** (projected / measured p10 {scaled.ratio_low}, p90 {scaled.ratio_high}), against "
              f"{p.median_error_pct} % / {p.p90_error_pct} % for the MFU carried over and {logo['median_error_pct']} % / "
              f"{logo['p90_error_pct']} % for the model alone (leave-one-GPU-out). `bench cost` and `bench plan` project "
              "a measured GPU row this way (`projected_by_model`, with this interval) wherever the row's "
              "configuration can be traced, and carry its MFU over only where it cannot."]
    lines += ["", "## Leave-one-GPU-out, by GPU", ""] + _table(tables["logo_by_gpu"], "gpu")
    lines += ["", "## Leave-one-GPU-out, by family", ""] + _table(tables["logo_by_family"], "family")
    lines += ["", "## Leave-one-family-out, by family", ""] + _table(tables["lofo_by_family"], "family")
    lines += ["", "## Leave-one-family-out, by GPU", ""] + _table(tables["lofo_by_gpu"], "gpu")
    gpus = [k[:-2] for k in ratios[0] if k.endswith("_x")]
    lines += ["", "## Predicted ratios between GPUs (samples/s relative to the A100-80GB, same cell; MFU %)", "",
              "No row of these two models is in any calibration file; H100, H200 and B200 have no calibration row "
              "at all (their tensor-core factor is Ampere's). Compare with published cross-GPU figures.", "",
              "| model | precision | micro-batch | " + " | ".join(gpus) + " |",
              "|---|---|---|" + "---|" * len(gpus)]
    lines += [f"| {r['model']} | {r['precision']} | {r['micro_batch']} | " +
              " | ".join(f"{r[g + '_x']}" + ("" if r[g + "_mfu_pct"] == "" else f" ({r[g + '_mfu_pct']} %)")
                         for g in gpus) + " |" for r in ratios]
    return "\n".join(lines) + "\n"


def _trace_reference() -> int:
    from bench.speed.reference import OPS_FILE, REFERENCE_FOLDER, reference_rows, trace_reference, write_reference_ops

    rows = reference_rows()
    print(f"tracing the configurations of {len(rows)} reference rows (channels-last; contiguous derived)")
    tables = trace_reference(rows, lambda row, outcome: print(f"  {row.trace}: {outcome}", flush=True))
    path = DATA / REFERENCE_FOLDER / OPS_FILE
    write_reference_ops(tables, path)
    print(f"wrote {path} ({len(tables)} traces)")
    return 0


def _measure_host() -> int:
    from bench.speed.dispatch import HOST_FILE, measure_host_dispatch, write_host_dispatch

    row = measure_host_dispatch()
    write_host_dispatch(row, DATA / HOST_FILE)
    print(f"{row['us_per_op']} us per dispatched op ({row['ops_per_step']} ops, fastest step {row['step_ms']} ms, "
          f"{row['cpu_model']}) -> {DATA / HOST_FILE}; refit (bench predict --fit) to use it")
    return 0


