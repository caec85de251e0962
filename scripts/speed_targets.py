"""`make bench-speed`: the throughput model's targets table (issue #36 item 6), printed and written to
docs/speed/targets.md, from the committed held-out predictions (docs/speed/validation.csv, written by `bench predict
--validate`); then the Hopper and Blackwell rows' held-out errors (`bench.speed.hopper_blackwell`), written to
docs/speed/hopper_blackwell.{md,csv} and hopper_blackwell_ratios.csv; then the channels-last / contiguous pairs'
ratios (`bench.speed.memory_format`) -> docs/speed/memory_format.{md,csv}; and the committed fit's in-sample
errors by mode and op mix (`bench.speed.validate.in_sample_table`). No fit and no timing: seconds."""

from __future__ import annotations

import csv
from pathlib import Path

from bench.frames import write_csv
from bench.speed.hopper_blackwell import RATIO_COLUMNS, ROW_COLUMNS, SOURCE, ratios, summary
from bench.speed.hopper_blackwell import configurations as hopper_blackwell_lines
from bench.speed.memory_format import PAIR_COLUMNS, format_pairs
from bench.speed.memory_format import summary as format_summary
from bench.speed.validate import in_sample_table, targets_table

VALIDATION, OUT, DOCS = Path("docs/speed/validation.csv"), Path("docs/speed/targets.md"), Path("docs/speed")


def targets(validation: list[dict]) -> str:
    table = targets_table(validation)
    lines = ["# Throughput model: targets", "",
             f"Written by `make bench-speed` (`scripts/speed_targets.py`) from `{VALIDATION}`: training rows only, "
             "|predicted / measured - 1| of predictions from fits without the row's GPU (leave-one-GPU-out) and "
             "without its source (leave-one-source-out); coverage = share of both predictions inside the 80 % band "
             "set by the other sources' held-out residuals, at the percentiles calibrated by GPU "
             "(`bench.speed.validate.calibrated_quantiles`: the sources had no say in them). Targets: median <= 10 %, p90 <= 25 %, coverage 75-85 %. "
             "The fit's training rows are the RTX 3090 (timm), A100-40/80GB and V100-16/32GB (DLE) and H100 SXM and "
             "PCIe, H200 and B200 (Lambda's BERT rows: `docs/speed/sources.md`; held out per configuration in "
             "`docs/speed/hopper_blackwell.md`).",
             "", "| slice | value | rows | LOGO median % | LOGO p90 % | LOSO median % | LOSO p90 % | coverage % | met |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        met = all(r[f"{s}_median_pct"] <= 10 and r[f"{s}_p90_pct"] <= 25 for s in ("logo", "loso")) \
            and 75 <= r["coverage_pct"] <= 85
        lines.append(f"| {r['slice']} | {r['value']} | {r['rows']} | {r['logo_median_pct']} | {r['logo_p90_pct']} | "
                     f"{r['loso_median_pct']} | {r['loso_p90_pct']} | {r['coverage_pct']} | {'yes' if met else 'no'} |")
    lines += ["", "## In sample", "",
              "The committed fit (`bench/data/speed_params.json`) on the rows it was fitted on, nothing held out "
              "(`bench.speed.validate.in_sample_table`): a slice whose error is large here is missed by the model's "
              "form, not only by its transfer to a GPU or source it never saw.", "",
              "| mode | op mix | rows | median % | p90 % | median predicted / measured |", "|---|---|---|---|---|---|"]
    for r in in_sample_table():
        lines.append(f"| {r['mode']} | {r['op_mix']} | {r['rows']} | {r['median_error_pct']} | {r['p90_error_pct']} | "
                     f"{r['median_ratio']} |")
    return "\n".join(lines) + "\n"




def hopper_blackwell(validation: list[dict]) -> str:
    lines_ = hopper_blackwell_lines(validation)
    ratio_lines = ratios(lines_)
    write_csv(lines_, DOCS / "hopper_blackwell.csv", ROW_COLUMNS)
    write_csv(ratio_lines, DOCS / "hopper_blackwell_ratios.csv", RATIO_COLUMNS)
    s = summary(lines_, ratio_lines)
    lines = ["# Throughput model on Hopper and Blackwell, held out", "",
             "Written by `make bench-speed` (`bench.speed.hopper_blackwell`) from the held-out predictions of "
             f"`{SOURCE}`. Measured: Lambda's PyTorch training benchmark, one-GPU BERT-base and BERT-large SQuAD "
             "fine-tuning (sequence 384; fp16 = apex AMP O2, tf32 = Lambda's \"FP32\" on TF32 tensor cores), "
             "rows with a doubt flag left out (`bench/data/reference/lambda_v2_train.csv`, "
             "`docs/speed/sources.md`); the fit reads one row per configuration, the median of its systems, "
             "traced through a ViT of BERT's encoder shapes (`bench.speed.reference.STANDINS`). Each prediction "
             "comes from a fit that never saw the row's GPU (LOGO) or its source (LOSO: no Hopper or Blackwell "
             "row at all, as the model stood before these rows, and no BERT row).", "",
             f"- **{s['configurations']} configurations, {s['systems']} systems.** Median |error| (largest): "
             f"LOGO {s['logo_median_error_pct']} % ({s['logo_max_error_pct']} %), LOSO {s['loso_median_error_pct']} % "
             f"({s['loso_max_error_pct']} %).",
             f"- **The 80 % band** a prediction on these GPUs states, around the LOGO prediction, holds "
             f"{s['inside_band_pct']} % of the systems' figures.",
             f"- **Cross-GPU ratios** (what ranking GPUs rests on): median |error| {s['logo_ratio_median_error_pct']} % "
             f"(LOGO), {s['loso_ratio_median_error_pct']} % (LOSO).", "",
             "## Per configuration (`hopper_blackwell.csv`)", "",
             "| GPU | model | precision | stack | batch | systems | measured/s (median) | spread % | LOGO/s | LOGO % "
             "| LOSO/s | LOSO % | 80 % band (LOGO) | systems inside |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in lines_:
        lines.append(f"| {r['gpu']} | {r['model']} | {r['precision']} | {r['stack']} | {r['batch_size']} | "
                     f"{r['systems']} | {r['measured_samples_per_s']:g} | {r['measured_spread_pct']} | "
                     f"{r['logo_predicted']:g} | {r['logo_error_pct']} | {r['loso_predicted']:g} | "
                     f"{r['loso_error_pct']} | {r['band_low']}-{r['band_high']} | {r['systems_inside_band']} |")
    lines += ["", "What each band rests on: " + "; ".join(sorted({f"{r['gpu']}: {r['band_rests_on']}"
                                                                for r in lines_})) + ".", "",
              "## Cross-GPU ratios (`hopper_blackwell_ratios.csv`)", "",
              "Each GPU's stack with the most systems; the B200's (nv25.06) is newer than the others' (nv24.03).", "",
              "| pair | model | precision | stacks | measured | LOGO | LOGO % | LOSO | LOSO % |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in ratio_lines:
        lines.append(f"| {r['pair']} | {r['model']} | {r['precision']} | {r['stacks']} | {r['measured_ratio']} | "
                     f"{r['logo_ratio']} | {r['logo_error_pct']} | {r['loso_ratio']} | {r['loso_error_pct']} |")
    text = "\n".join(lines) + "\n"
    (DOCS / "hopper_blackwell.md").write_text(text)
    return text


def memory_format(validation: list[dict]) -> str:
    pairs = format_pairs(validation)
    write_csv(pairs, DOCS / "memory_format.csv", PAIR_COLUMNS)
    overall = {line["mode"]: line for line in format_summary(pairs)}
    train, infer = overall["train"], overall["infer"]
    lines = ["# Throughput model: channels-last against contiguous", "",
             "Written by `make bench-speed` (`bench.speed.memory_format`) from the held-out predictions of "
             f"`{VALIDATION}`: every pair of rows that differ only in memory format (timm's RTX 3090 training and "
             "RTX 3090 / 4090 inference benchmarks run each model both ways), channels-last samples/s over "
             "contiguous, measured against predicted (each side from a fit without the pair's GPU, and from one "
             "without its family). "
             "One line per pair: `memory_format.csv`.", "",
             f"- **Training, {train['pairs']} pairs** (timm's RTX 3090 table, PyTorch 1.12): measured ratio "
             f"{train['measured_p10']}-{train['measured_p90']} (p10-p90, median {train['measured_median']}), predicted "
             f"{train['predicted_median']} (median). Error on the ratio, GPU held out: median "
             f"{train['median_error_pct']} %, p90 {train['p90_error_pct']} %; family held out: median "
             f"{train['lofo_median_error_pct']} %, p90 {train['lofo_p90_error_pct']} %.",
             f"- **Inference, {infer['pairs']} pairs** (RTX 3090 and 4090, PyTorch 2.4 and 2.9): measured "
             f"{infer['measured_p10']}-{infer['measured_p90']} (median {infer['measured_median']}), predicted "
             f"{infer['predicted_median']}; error on the ratio, GPU held out: median {infer['median_error_pct']} %, "
             f"p90 {infer['p90_error_pct']} %; family held out: median {infer['lofo_median_error_pct']} %, p90 "
             f"{infer['lofo_p90_error_pct']} %.",
             "- The model's two format terms (`bench.speed.model`): an NCHW half-precision convolution pays cuDNN's "
             "layout transposes as time of their own (`nchw_half_bytes` x its bytes at the memory rate), so a "
             "channels-last conv net predicts faster; on PyTorch 1.x / cuDNN 8 rows only, a channels-last grouped "
             "convolution with wide groups runs off the tensor cores (`e_grouped_nhwc`), which is why RegNets and "
             "NFNets train slower channels-last in timm's PyTorch 1.12 table. A prediction for the runner (torch 2, "
             "cuDNN 9) pays the first and not the second: the inference pairs, on torch 2, are its check.", "",
             "| mode | family | pairs | measured p10 | median | p90 | predicted median | median error % | p90 error % "
             "| family held out: median error % | p90 error % |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in format_summary(pairs) + format_summary(pairs, "family"):
        lines.append(f"| {r['mode']} | {r['value']} | {r['pairs']} | {r['measured_p10']} | {r['measured_median']} | "
                     f"{r['measured_p90']} | {r['predicted_median']} | {r['median_error_pct']} | "
                     f"{r['p90_error_pct']} | {r['lofo_median_error_pct']} | {r['lofo_p90_error_pct']} |")
    text = "\n".join(lines) + "\n"
    (DOCS / "memory_format.md").write_text(text)
    return text


def main() -> None:
    with VALIDATION.open(newline="") as handle:
        validation = list(csv.DictReader(handle))
    text = targets(validation)
    OUT.write_text(text)
    print(text, end="")
    print()
    print(hopper_blackwell(validation), end="")
    print()
    print(memory_format(validation), end="")


if __name__ == "__main__":
    main()
