"""How good the throughput model is where users meet it: on GPUs, sources and families the fit never saw.

Leave-one-GPU-out (each GPU predicted by a fit without a row of it) and leave-one-source-out (each benchmark
suite predicted by a fit without it) set the 80 % band every prediction carries, from training rows only, per
kind of GPU and op mix (`bench.speed.params.band_keys`); leave-one-generation-out widens it for a GPU whose
generation has no training row; leave-one-family-out is the cross-model error. `projection_band` validates what
`bench cost` does without the model: a measured MFU carried to another GPU.
"""

from __future__ import annotations

import numpy as np

from bench.grid.cell import Cell
from bench.measure.hardware import gpu_spec
from bench.speed.calibrate import (
    Dataset,
    error_summary,
    held_out,
    held_out_fits,
    predict_samples_per_s,
    reference_dataset,
)
from bench.speed.model import NoDatasheetPeak, op_mixes
from bench.speed.params import BAND_MIN_GPUS, BAND_MIN_ROWS, UNSEEN_GENERATION, ErrorBand, band_key, load_model_file
from bench.speed.predict import predict_on
from bench.memory.traces import trace_step_ops

RATIO_GPUS = ("A100-80GB", "A100-40GB", "H100-80GB", "H200", "B200", "RTX-3090", "RTX-4090", "L4", "L40S", "A10",
              "T4", "V100-16GB")
RATIO_CELLS = (("resnet50", 256), ("vit_base_patch16_224", 128))
"""Cross-GPU ratios: the study's two models at a micro-batch that fills a large GPU."""
VALIDATION_COLUMNS = ("source", "gpu", "mode", "precision", "model", "memory_format", "family", "op_mix", "batch_size",
                      "image_size", "stack",
                      "measured_samples_per_s", "logo_predicted_samples_per_s", "logo_error_pct",
                      "lofo_predicted_samples_per_s", "lofo_error_pct", "loso_predicted_samples_per_s",
                      "loso_error_pct", "logen_predicted_samples_per_s")
"""validation.csv: held-out predictions of each reference row, from fits without its GPU (logo), family (lofo),
source (loso) and, for training rows of a generation with training rows, generation (logen). `stack`: the row's
software where its source names it per row (Lambda's NGC container), else empty."""
ERROR_COLUMNS = ("rows", "median_error_pct", "p90_error_pct", "median_ratio")
"""The error tables (logo_by_gpu.csv ...), after the column they group by."""
BAND_QUANTILES = (10.0, 90.0)
"""The nominal 80 % band: these percentiles of predicted / measured, held out (a projection's band; a prediction's
band widens them to `calibrated_quantiles`)."""
BAND_COVERAGE_PCT = 80.0
"""How often a prediction's band must hold the truth on GPUs it never saw."""
BAND_TAILS = tuple(float(tail) for tail in np.arange(10.0, 2.49, -0.5))
"""The lower percentiles `calibrated_quantiles` tries, narrowest band first (the upper is 100 minus it)."""


def _summary(predicted: np.ndarray, measured: np.ndarray) -> dict:
    return {"rows": len(measured), **error_summary(predicted, measured),
            "median_ratio": round(float(np.median(predicted / measured)), 2)}


def _by(groups: np.ndarray, predicted: np.ndarray, measured: np.ndarray, name: str) -> list[dict]:
    return [{name: group, **_summary(predicted[groups == group], measured[groups == group])}
            for group in sorted(set(groups))]


def error_band(predicted: np.ndarray, measured: np.ndarray, held_out: str = "",
               quantiles: tuple[float, float] = BAND_QUANTILES) -> ErrorBand:
    ratio = predicted / measured
    low, high = np.percentile(ratio, quantiles)
    summary = error_summary(predicted, measured)
    return ErrorBand(summary["median_error_pct"], summary["p90_error_pct"], round(float(low), 3),
                     round(float(high), 3), len(measured), held_out)


BAND_SCHEMES = {"logo": "leave-one-GPU-out", "loso": "leave-one-source-out"}
"""The held-out predictions whose residuals, pooled, set a band: a fit without the row's GPU, and one without
its source (another benchmark suite's conditions: data loading, software stack)."""


def pooled(held_out: dict[str, np.ndarray], measured: np.ndarray, rows: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray]:
    """(predicted, measured) of `rows` under every scheme of `held_out`, one after the other."""
    return (np.concatenate([held_out[name][rows] for name in held_out]),
            np.concatenate([measured[rows] for _ in held_out]))


def error_bands(held_out: dict[str, np.ndarray], measured: np.ndarray, gpus: np.ndarray, kinds: np.ndarray,
                mixes: np.ndarray, training: np.ndarray, unseen_generation: np.ndarray | None = None,
                quantiles: tuple[float, float] = BAND_QUANTILES) -> dict[str, ErrorBand]:
    """The 80 % band and error of every validation slice (`bench.speed.params.band_keys`): training rows only,
    their held-out residuals under every scheme of `held_out` (`BAND_SCHEMES`) pooled. A slice needs
    `BAND_MIN_ROWS` residuals of `BAND_MIN_GPUS` GPUs; `train` is always there. `unseen_generation`: each training
    row predicted by a fit without any row of its GPU's generation (NaN where not computed), the band
    `UNSEEN_GENERATION` of a GPU whose generation has no training row. `quantiles`: the band's percentiles."""
    schemes = " + ".join(BAND_SCHEMES.get(name, name) for name in held_out)
    slices = {"train": training}
    for kind in sorted(set(kinds)):
        slices[f"{kind} train"] = (kinds == kind) & training
        for mix in sorted(set(mixes)):
            slices[f"{kind} {mix} train"] = (kinds == kind) & (mixes == mix) & training
    bands = {key: error_band(*pooled(held_out, measured, rows), schemes, quantiles) for key, rows in slices.items()
             if (rows.sum() * len(held_out) >= BAND_MIN_ROWS and len(set(gpus[rows])) >= BAND_MIN_GPUS)
             or key == "train"}
    if unseen_generation is not None:
        rows = training & np.isfinite(unseen_generation)
        if rows.sum() >= BAND_MIN_ROWS:
            bands[UNSEEN_GENERATION] = error_band(unseen_generation[rows], measured[rows],
                                                  "leave-one-generation-out", quantiles)
    return bands


def band_inside(held_out: dict[str, np.ndarray], measured: np.ndarray, training: np.ndarray,
                groups: np.ndarray, quantiles: tuple[float, float] = BAND_QUANTILES) -> dict[str, np.ndarray]:
    """Per scheme of `held_out`, whether each training row's held-out prediction lies inside an 80 % band it never
    helped set: the band from the other groups' (GPUs', sources') pooled training residuals. False off training."""
    inside = {name: np.zeros(len(measured), dtype=bool) for name in held_out}
    for group in sorted(set(groups[training])):
        others, own = training & (groups != group), training & (groups == group)
        if not others.any():
            continue
        low, high = np.percentile(np.divide(*pooled(held_out, measured, others)), quantiles)
        for name, predicted in held_out.items():
            ratio = predicted[own] / measured[own]
            inside[name][own] = (ratio >= low) & (ratio <= high)
    return inside


def band_coverage(held_out: dict[str, np.ndarray], measured: np.ndarray, training: np.ndarray,
                  groups: np.ndarray, quantiles: tuple[float, float] = BAND_QUANTILES) -> dict[str, float | int]:
    """How often an 80 % band holds the truth on rows it never saw (`band_inside`), in percent, over every
    scheme's held-out prediction of every training row whose group has others to set its band."""
    others = np.array([(training & (groups != group)).any() for group in groups])
    counted = training & others
    inside = sum(int(flags[counted].sum())
                 for flags in band_inside(held_out, measured, training, groups, quantiles).values())
    total = int(counted.sum()) * len(held_out)
    return {"coverage_pct": round(100 * inside / total, 1) if total else float("nan"), "predictions": total}


def calibrated_quantiles(held_out: dict[str, np.ndarray], measured: np.ndarray, training: np.ndarray,
                         gpus: np.ndarray) -> tuple[float, float]:
    """A prediction band's percentiles, split-conformal over GPUs: the narrowest (p, 100 - p) of `BAND_TAILS` whose
    band, set for each GPU by the other GPUs' held-out training residuals, holds `BAND_COVERAGE_PCT` of that GPU's
    held-out predictions (`band_coverage`). Residuals pooled from many rows of a few GPUs are narrower than what
    a GPU never seen meets, so the nominal p10-p90 holds less than 80 % there; the coverage held out by source
    is not used to choose, and stays the check. Below: where every GPU's errors are alike the nominal band holds;
    where each GPU's lean their own way, it widens.

    >>> rows, spread = np.ones(40, dtype=bool), np.tile(np.linspace(0.5, 1.5, 10), 4)
    >>> gpus = np.repeat(["a", "b", "c", "d"], 10)
    >>> calibrated_quantiles({"logo": spread}, np.ones(40), rows, gpus)  # every GPU's errors alike
    (10.0, 90.0)
    >>> calibrated_quantiles({"logo": spread * np.repeat([0.8, 1.0, 1.0, 1.25], 10)}, np.ones(40), rows, gpus)
    (6.5, 93.5)
    """
    for tail in BAND_TAILS:
        quantiles = (tail, 100.0 - tail)
        if band_coverage(held_out, measured, training, gpus, quantiles)["coverage_pct"] >= BAND_COVERAGE_PCT:
            return quantiles
    return quantiles


TARGET_SLICES = ("source", "gpu", "precision", "memory_format", "family", "op_mix")
"""The slices `targets_table` lists, after `all`: the calibration source (how much of a figure is one table's), then
issue #36's GPU, precision, memory format and model family."""


def targets_table(rows: list[dict]) -> list[dict]:
    """Training rows of validation.csv against the targets (median |error| <= 10 %, p90 <= 25 %, 80 % band coverage
    75-85 % on held-out sources), for all and per slice: leave-one-GPU-out and leave-one-source-out errors, and the
    band's coverage (`band_inside` with each source's band set by the other sources' residuals, at the percentiles
    `calibrated_quantiles` sets by GPU: the sources had no say in them). No fit: reads the committed held-out
    predictions."""
    train = [row for row in rows if row["mode"] == "train"]
    measured = np.array([float(row["measured_samples_per_s"]) for row in train])
    held = {name: np.array([float(row[f"{name}_predicted_samples_per_s"]) for row in train])
            for name in ("logo", "loso")}
    gpus, sources = (np.array([row[name] for row in train]) for name in ("gpu", "source"))
    everything = np.ones(len(train), dtype=bool)
    inside = band_inside(held, measured, everything, sources, calibrated_quantiles(held, measured, everything, gpus))
    table = []
    for column in ("all", *TARGET_SLICES):
        values = np.array(["all" if column == "all" else str(row[column]) for row in train])
        for value in sorted(set(values)):
            rows_in = values == value
            line = {"slice": column, "value": value, "rows": int(rows_in.sum())}
            for name in held:
                summary = error_summary(held[name][rows_in], measured[rows_in])
                line[f"{name}_median_pct"], line[f"{name}_p90_pct"] = summary["median_error_pct"], \
                    summary["p90_error_pct"]
            line["coverage_pct"] = round(100 * float(np.mean([inside[name][rows_in] for name in held])), 1)
            table.append(line)
    return table


def in_sample_table(data: Dataset | None = None) -> list[dict]:
    """The committed fit's error on the rows it was fitted on (nothing held out), by mode and op mix: a slice wrong
    here is missed by the model's form, not only by its transfer to a GPU or source it never saw. No fit."""
    data = data or reference_dataset()
    predicted = predict_samples_per_s(data, load_model_file().params)
    measured, modes = data.measured_samples_per_s, data.column("mode")
    mixes = np.array(op_mixes(data.table, data.row_index, len(data.rows)))
    return [{"mode": mode, "op_mix": mix, **_summary(predicted[chosen], measured[chosen])}
            for mode in ("train", "infer") for mix in sorted(set(mixes))
            if (chosen := (modes == mode) & (mixes == mix)).any()]


def validation_tables(data: Dataset | None = None) -> dict:
    """Held-out predictions of every reference row, and their errors by GPU, family, source and validation slice."""
    data = data or reference_dataset()
    measured = data.measured_samples_per_s
    gpus, families, sources = data.column("gpu"), data.column("family"), data.column("source")
    generations = np.array([gpu_spec(gpu).generation for gpu in gpus])
    training = data.column("mode") == "train"
    mixes = np.array(op_mixes(data.table, data.row_index, len(data.rows)))
    gpu_fits = held_out_fits(data, gpus)
    by_gpu = held_out(gpu_fits, gpus)
    by_family = held_out(held_out_fits(data, families), families)
    # Only sources with training rows are held out: the others' rows are inference, never in a band.
    by_source = np.full(len(measured), np.nan)
    for source, prediction in held_out_fits(data, sources, set(sources[training])).items():
        by_source[sources == source] = prediction[sources == source]
    # Only generations with a training row are held out: the others' rows are inference, never in a band.
    by_generation = np.full(len(measured), np.nan)
    for generation, prediction in held_out_fits(data, generations, set(generations[training])).items():
        by_generation[generations == generation] = prediction[generations == generation]
    error = lambda predicted: [round(float(e), 1) for e in np.abs(predicted / measured - 1) * 100]  # noqa: E731
    columns = zip(data.rows, mixes, by_gpu, error(by_gpu), by_family, error(by_family), by_source, error(by_source),
                  by_generation)
    rows = [dict(zip(VALIDATION_COLUMNS, (
                row.source, row.gpu, row.mode, row.precision, row.model, row.memory_format, row.family, mix,
                row.batch_size, row.image_size, row.stack, row.samples_per_s, round(float(g), 1), g_err, round(float(f), 1),
                f_err, *(("", "") if np.isnan(s) else (round(float(s), 1), s_err)),
                "" if np.isnan(n) else round(float(n), 1))))
            for row, mix, g, g_err, f, f_err, s, s_err, n in columns]
    kinds = np.array([band_key(gpu_spec(gpu)) for gpu in gpus])
    schemes = {"logo": by_gpu, "loso": by_source}
    quantiles = calibrated_quantiles(schemes, measured, training, gpus)
    bands = error_bands(schemes, measured, gpus, kinds, mixes, training, by_generation, quantiles)
    return {"rows": rows, "logo_by_gpu": _by(gpus, by_gpu, measured, "gpu"),
            "logo_by_family": _by(families, by_gpu, measured, "family"),
            "lofo_by_family": _by(families, by_family, measured, "family"),
            "lofo_by_gpu": _by(gpus, by_family, measured, "gpu"),
            "logo": _summary(by_gpu, measured), "lofo": _summary(by_family, measured),
            "loso": _summary(by_source[training], measured[training]), "bands": bands,
            "band_quantiles": quantiles,
            "coverage": {"by GPU": band_coverage(schemes, measured, training, gpus, quantiles),
                         "by source": band_coverage(schemes, measured, training, sources, quantiles)},
            "training_gpus": tuple(sorted(str(gpu) for gpu in set(gpus[training]))),
            "model_scaled": projection_band(model_scaled_pairs(data, gpu_fits))}


PROJECTION_COLUMNS = ("from_gpu", "to_gpu", *ERROR_COLUMNS)
"""projection_by_pair.csv: the MFU carry-over's error per (measured GPU, target GPU)."""


def _configuration(row) -> tuple:
    """What two reference rows must share to be one configuration on two GPUs."""
    return (row.source, row.mode, row.precision, row.model, row.memory_format, row.batch_size, row.image_size,
            row.attention)


def model_scaled_pairs(data: Dataset, gpu_fits: dict[str, np.ndarray]) -> list[tuple[str, str, float]]:
    """(measured GPU, target GPU, projected / measured) for the pairs of `projection_pairs`, projected instead by
    the throughput model's ratio (Habitat's way: the measured samples/s times the predicted target-over-measured
    ratio), both predictions from the fit that never saw the target GPU (`held_out_fits`)."""
    groups: dict[tuple, list[int]] = {}
    for index, row in enumerate(data.rows):
        groups.setdefault(_configuration(row), []).append(index)
    pairs = []
    for key, members in sorted(groups.items()):
        for a in members:
            for b in members:
                row_a, row_b = data.rows[a], data.rows[b]
                if row_a.gpu != row_b.gpu:
                    fit = gpu_fits[row_b.gpu]
                    pairs.append((row_a.gpu, row_b.gpu,
                                  row_a.samples_per_s * fit[b] / fit[a] / row_b.samples_per_s))
    return pairs


def projection_pairs() -> list[tuple[str, str, float]]:
    """(measured GPU, target GPU, projected / measured) for every ordered pair of public rows of one configuration
    (source, mode, precision, model, memory format, batch, image size, attention) on two GPUs, projected as `bench
    cost` projects a measured row (`bench.cost.price.gpu_speed`, `projected_from_gpu`): the first row's MFU
    carried over to the second GPU's datasheet peak for the precision, i.e. its samples/s x the peaks' ratio."""
    from bench.speed.reference import reference_rows

    groups: dict[tuple, list] = {}
    for row in reference_rows():
        groups.setdefault(_configuration(row), []).append(row)
    pairs = []
    for key, rows in sorted(groups.items()):
        for a in rows:
            for b in rows:
                peaks = [gpu_spec(row.gpu).peak_flops_per_s(row.precision) for row in (a, b)]
                if a.gpu != b.gpu and all(peaks):
                    pairs.append((a.gpu, b.gpu, a.samples_per_s * peaks[1] / peaks[0] / b.samples_per_s))
    return pairs


def projection_band(pairs: list[tuple[str, str, float]]) -> ErrorBand:
    """The interval and error of a projected speed, from `projection_pairs`."""
    ratio = np.array([r for _, _, r in pairs])
    return error_band(ratio, np.ones(len(ratio)))


def projection_by_pair(pairs: list[tuple[str, str, float]]) -> list[dict]:
    """`projection_pairs`' error per (measured GPU, target GPU)."""
    keys = sorted({(a, b) for a, b, _ in pairs})
    return [{"from_gpu": a, "to_gpu": b,
             **_summary(np.array([r for x, y, r in pairs if (x, y) == (a, b)]),
                        np.ones(sum((x, y) == (a, b) for x, y, _ in pairs)))} for a, b in keys]


def cross_gpu_columns() -> tuple[str, ...]:
    """cross_gpu.csv: the cell, the A100-80GB's samples/s, then each GPU's ratio to it, then each GPU's MFU."""
    return ("model", "precision", "micro_batch", f"{RATIO_GPUS[0]}_samples_per_s",
            *(f"{gpu}_x" for gpu in RATIO_GPUS), *(f"{gpu}_mfu_pct" for gpu in RATIO_GPUS))


def cross_gpu_ratios() -> list[dict]:
    """Predicted samples/s on each of `RATIO_GPUS` over the A100-80GB's, for ResNet-50 and ViT-B/16 in bf16 and tf32."""
    model = load_model_file()
    table = []
    for name, micro_batch in RATIO_CELLS:
        for precision in ("bf16", "tf32"):
            cell = Cell(experiment="cross_gpu", profile="cuda", model=name, image_size=224, micro_batch=micro_batch,
                        accum_steps=1, precision=precision, checkpointing="off", optimizer="adamw",
                        channels_last=True, warmup_steps=1, measured_steps=1)
            ops = trace_step_ops(cell)
            rates = {}
            for gpu in RATIO_GPUS:
                try:
                    rates[gpu] = predict_on(cell, ops, gpu_spec(gpu), model)
                except NoDatasheetPeak:
                    rates[gpu] = None
            base = rates[RATIO_GPUS[0]].samples_per_s
            table.append({"model": name, "precision": precision, "micro_batch": micro_batch,
                          f"{RATIO_GPUS[0]}_samples_per_s": round(base, 1),
                          **{f"{gpu}_x": "no peak" if p is None else round(p.samples_per_s / base, 2)
                             for gpu, p in rates.items()},
                          **{f"{gpu}_mfu_pct": "" if p is None else round(p.mfu_pct, 1) for gpu, p in rates.items()}})
    return table


DLE_PLATFORMS_FILE = "dle_platforms.csv"


def dle_scaling_check() -> list[dict]:
    """The DLE 8-GPU training rows against the interconnect model: per pair of a configuration's 1-GPU and
    8-GPU rows (same table version, GPU, precision, batch), the measured efficiency (8-GPU per-GPU samples/s
    over the 1-GPU's) beside `bench.speed.ddp`'s prediction from the 1-GPU step, the model's fp32 gradient
    bytes and the DGX's NVLink (`bench/data/reference/dle_platforms.csv`)."""
    import csv
    from importlib import resources

    import timm
    import torch

    from bench.speed.ddp import BYTES_PER_GRADIENT, Interconnect, ddp_step
    from bench.speed.reference import DLE_DOUBTS, DLE_FILE, REFERENCE_FOLDER

    folder = resources.files("bench.data").joinpath(REFERENCE_FOLDER)
    platforms = {row["platform"]: row
                 for row in csv.DictReader(folder.joinpath(DLE_PLATFORMS_FILE).read_text().splitlines())}
    rows = [row for row in csv.DictReader(folder.joinpath(DLE_FILE).read_text().splitlines())
            if row["mode"] == "train" and row["platform"] in platforms and row["timm_equiv"]
            and row["batch_size_per_gpu"] and row["n_nodes"] == "1"
            and not any(doubt in row["flags"] for doubt in DLE_DOUBTS)]
    key = lambda r: (r["dle_model"], r["platform"], r["precision"], r["container"], r["batch_size_per_gpu"])
    one = {key(r): r for r in rows if r["n_gpus"] == "1"}
    params: dict[str, int] = {}
    table = []
    for row in rows:
        base = one.get(key(row))
        if row["n_gpus"] != "8" or base is None:
            continue
        name = row["timm_equiv"].split(" ")[0]  # the widese variants: their base model's parameters
        if name not in params:
            with torch.device("meta"):
                params[name] = sum(p.numel() for p in timm.create_model(name).parameters())
        platform = platforms[row["platform"]]
        link = Interconnect(platform["interconnect"], float(platform["link_gb_per_s"]), platform["source"])
        batch = float(row["batch_size_per_gpu"])
        step_s = batch / float(base["img_per_s_per_gpu"])
        predicted = ddp_step(step_s=step_s, micro_step_s=step_s, grads_bytes=params[name] * BYTES_PER_GRADIENT,
                             gpus=8, link=link)
        measured = float(row["img_per_s_per_gpu"]) / float(base["img_per_s_per_gpu"])
        table.append({"dle_model": row["dle_model"], "platform": row["platform"], "precision": row["precision"],
                      "container": row["container"], "data_backend": row["data_backend"].split(" ")[0],
                      "batch_size_per_gpu": int(batch), "one_gpu_img_per_s": float(base["img_per_s_per_gpu"]),
                      "eight_gpu_img_per_s_per_gpu": float(row["img_per_s_per_gpu"]),
                      "measured_efficiency": round(measured, 3),
                      "eight_gpu_img_per_s_total": round(float(row["img_per_s_per_gpu"]) * 8),
                      "grads_mib": round(params[name] * BYTES_PER_GRADIENT / 2**20, 1),
                      "allreduce_ms": round(predicted.allreduce_s * 1e3, 2),
                      "exposed_ms": round(predicted.exposed_s * 1e3, 3),
                      "predicted_efficiency": round(predicted.efficiency, 3),
                      "predicted_over_measured": round(predicted.efficiency / measured, 3)})
    return table


def write_dle_scaling_check(path: str = "docs/speed/dle_8gpu_scaling.csv") -> int:
    """`dle_scaling_check` as CSV at `path`; returns the pairs written."""
    import csv

    table = dle_scaling_check()
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, list(table[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(table)
    return len(table)


if __name__ == "__main__":  # python -m bench.speed.validate: the DLE 8-GPU check (seconds; no fit)
    print(f"wrote {write_dle_scaling_check()} DLE 8-GPU pairs to docs/speed/dle_8gpu_scaling.csv")
