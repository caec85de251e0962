"""The throughput model on Hopper and Blackwell, held out: Lambda's one-GPU BERT training rows on H100, H200 and
B200 (`bench.speed.reference.lambda_rows`), read from the validation's held-out predictions (`docs/speed/
validation.csv`, `bench predict --validate`): no fit here, seconds.

Two held-out predictions of each row, from fits that never saw:
- its GPU (`logo`): what a user gets for a catalog GPU without a row of its own (the H200 from H100 and B200 rows);
- its source (`loso`): a fit with no Hopper or Blackwell row at all, as the model was before these rows (the same
  fit as leaving BERT's family out: Lambda's are the only BERT rows).

Per configuration: the median of its systems' figures against each, how many systems the 80 % band of the leave-
one-GPU-out prediction holds (the band a prediction on that GPU states, `bench.speed.params.ModelFile.interval`),
and the cross-GPU ratios ranking rests on (H200 / H100: the same chip with faster memory; the PCIe card; B200).
"""

from __future__ import annotations

import numpy as np

from bench.measure.hardware import gpu_spec
from bench.speed.params import ModelFile, load_model_file
from bench.speed.reference import lambda_systems

SOURCE = "lambda-train"
HELD_OUT = ("logo", "loso")
ROW_COLUMNS = ("gpu", "model", "precision", "stack", "batch_size", "systems", "measured_samples_per_s",
               "measured_spread_pct", *(f"{name}_{what}" for name in HELD_OUT for what in ("predicted", "error_pct")),
               "band_low", "band_high", "systems_inside_band", "band_rests_on")
"""hopper_blackwell.csv: one line per GPU, model, precision and software stack (Lambda's container): the median of
its systems' figures (what the fit reads), each held-out prediction and its error, the leave-one-GPU-out
prediction's 80 % band and how many of the systems' own figures it holds."""
RATIO_PAIRS = (("H200", "H100-80GB"), ("H100-PCIe", "H100-80GB"), ("B200", "H100-80GB"), ("B200", "H200"))
RATIO_COLUMNS = ("pair", "model", "precision", "stacks", "measured_ratio", "logo_ratio", "logo_error_pct",
                 "loso_ratio", "loso_error_pct")


def configurations(validation: list[dict], model: ModelFile | None = None) -> list[dict]:
    """`ROW_COLUMNS` lines of the Lambda rows of `validation` (validation.csv's rows, as read: one per configuration,
    the median of its systems), with their systems' figures (`lambda_systems`)."""
    model = model or load_model_file()
    systems: dict[tuple, list[float]] = {}
    for system in lambda_systems():
        key = (system.gpu, system.model, system.precision, system.stack, system.batch_size)
        systems.setdefault(key, []).append(system.samples_per_s)
    lines = []
    for row in sorted((row for row in validation if row["source"] == SOURCE),
                      key=lambda row: (row["gpu"], row["model"], row["precision"], row["stack"])):
        measured = np.array(systems[(row["gpu"], row["model"], row["precision"], row["stack"],
                                     int(row["batch_size"]))])
        median = float(row["measured_samples_per_s"])
        line = {"gpu": row["gpu"], "model": row["model"], "precision": row["precision"], "stack": row["stack"],
                "batch_size": int(row["batch_size"]), "systems": len(measured), "measured_samples_per_s": median,
                "measured_spread_pct": round(100 * float(measured.max() - measured.min()) / median, 1)}
        for scheme in HELD_OUT:
            line[f"{scheme}_predicted"] = float(row[f"{scheme}_predicted_samples_per_s"])
            line[f"{scheme}_error_pct"] = round(100 * (line[f"{scheme}_predicted"] / median - 1), 1)
        spec = gpu_spec(row["gpu"])
        low, high = model.interval(line["logo_predicted"], spec, row["op_mix"])
        lines.append({**line, "band_low": round(low, 1), "band_high": round(high, 1),
                      "systems_inside_band": int(((low <= measured) & (measured <= high)).sum()),
                      "band_rests_on": model.rests_on(spec, row["op_mix"])})
    return lines


def ratios(lines: list[dict]) -> list[dict]:
    """`RATIO_PAIRS` per model and precision, from each GPU's line with the most systems (one stack per GPU).

    >>> line = lambda gpu, measured, predicted: {"gpu": gpu, "model": "m", "precision": "fp16", "stack": "c",
    ...     "systems": 1, "measured_samples_per_s": measured, "logo_predicted": predicted, "loso_predicted": predicted}
    >>> ratios([line("H200", 110.0, 103.0), line("H100-80GB", 100.0, 100.0)])[0]["logo_error_pct"]
    -6.4
    """
    best: dict[tuple, dict] = {}
    for line in lines:
        key = (line["gpu"], line["model"], line["precision"])
        if key not in best or line["systems"] > best[key]["systems"]:
            best[key] = line
    table = []
    for top, bottom in RATIO_PAIRS:
        for name, precision in sorted({(line["model"], line["precision"]) for line in lines}):
            a, b = best.get((top, name, precision)), best.get((bottom, name, precision))
            if a is None or b is None:
                continue
            measured = a["measured_samples_per_s"] / b["measured_samples_per_s"]
            ratio = {"pair": f"{top} / {bottom}", "model": name, "precision": precision,
                     "stacks": a["stack"] if a["stack"] == b["stack"] else f"{a['stack']} / {b['stack']}",
                     "measured_ratio": round(measured, 3)}
            for scheme in ("logo", "loso"):
                predicted = a[f"{scheme}_predicted"] / b[f"{scheme}_predicted"]
                ratio[f"{scheme}_ratio"] = round(predicted, 3)
                ratio[f"{scheme}_error_pct"] = round(100 * (predicted / measured - 1), 1)
            table.append(ratio)
    return table


def summary(lines: list[dict], ratio_lines: list[dict]) -> dict:
    """Median and largest |error| per held-out scheme, the band's share of systems, the ratios' median |error|."""
    out: dict = {"configurations": len(lines), "systems": sum(line["systems"] for line in lines)}
    for scheme in HELD_OUT:
        errors = np.abs([line[f"{scheme}_error_pct"] for line in lines])
        out[f"{scheme}_median_error_pct"] = round(float(np.median(errors)), 1)
        out[f"{scheme}_max_error_pct"] = round(float(errors.max()), 1)
    out["inside_band_pct"] = round(100 * sum(line["systems_inside_band"] for line in lines) / out["systems"], 1)
    for scheme in ("logo", "loso"):
        out[f"{scheme}_ratio_median_error_pct"] = round(float(np.median(
            np.abs([r[f"{scheme}_error_pct"] for r in ratio_lines]))), 1)
    return out
