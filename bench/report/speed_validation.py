"""The throughput model's validation page and charts (`docs/speed/`), from what `bench.speed.refit.revalidate`
measured: `bench predict --validate` writes them through `bench.api.validate_speed_model`."""

from __future__ import annotations

from pathlib import Path

from bench.measure.hardware import gpu_spec
from bench.report.speed_chart import write_validation_chart
from bench.speed.refit import Validated


def write_validation_report(validated: Validated, folder: Path) -> tuple[str, list[Path]]:
    """The leave-one-GPU-out and leave-one-family-out charts and `validation.md` under `folder`: (the page's text,
    the files written)."""
    tables = validated.tables
    charts = [write_validation_chart(
        [{**r, "predicted_samples_per_s": r[f"{held}_predicted_samples_per_s"]} for r in tables["rows"]], group,
        f"{title}: median error {tables[held]['median_error_pct']} %, p90 {tables[held]['p90_error_pct']} % "
        f"({tables[held]['rows']} rows)", f"predicted samples/s ({what} held out of the fit)", folder / name)
        for held, group, title, what, name in (
            ("logo", "gpu", "Leave-one-GPU-out", "GPU", "validation.png"),
            ("lofo", "family", "Leave-one-family-out", "family", "validation_lofo.png"))]
    text = validation_markdown(tables, validated.ratios, validated.version)
    page = folder / "validation.md"
    page.write_text(text)
    return text, [page, *charts]


def _newest_rows(rows: list[dict]) -> str:
    """What the fit saw of Hopper and Blackwell, the GPUs these ratios are read for."""
    newest = [r for r in rows if gpu_spec(r["gpu"]).generation in ("hopper", "blackwell")]
    if not newest:
        return "No Hopper or Blackwell GPU has a calibration row (their tensor-core factor is Ampere's)."
    families, gpus = sorted({r["family"] for r in newest}), sorted({r["gpu"] for r in newest})
    return (f"The fit's rows on Hopper and Blackwell: {len(newest)} ({', '.join(gpus)}), of the families "
            f"{', '.join(families)}.")


def _table(rows: list[dict], key: str) -> list[str]:
    lines = [f"| {key} | rows | median error % | p90 error % | median predicted / measured |", "|---|---|---|---|---|"]
    return lines + [f"| {r[key]} | {r['rows']} | {r['median_error_pct']} | {r['p90_error_pct']} | {r['median_ratio']} |"
                    for r in rows]


def validation_markdown(tables: dict, ratios: list[dict], version: str) -> str:
    """The validation page (`docs/speed/validation.md`): every held-out error, band, projection and predicted ratio."""
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
              "No row of these two models is in any calibration file. " + _newest_rows(tables["rows"]) +
              " Compare with published cross-GPU figures.", "",
              "| model | precision | micro-batch | " + " | ".join(gpus) + " |",
              "|---|---|---|" + "---|" * len(gpus)]
    lines += [f"| {r['model']} | {r['precision']} | {r['micro_batch']} | " +
              " | ".join(f"{r[g + '_x']}" + ("" if r[g + "_mfu_pct"] == "" else f" ({r[g + '_mfu_pct']} %)")
                         for g in gpus) + " |" for r in ratios]
    return "\n".join(lines) + "\n"
