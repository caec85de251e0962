"""How good the throughput model is where users meet it: on GPUs and families the fit never saw.

Leave-one-GPU-out (each GPU predicted by a fit without a row of it) is the cross-GPU error every
prediction states, per kind of GPU (`band_key`); leave-one-family-out is the cross-model error.
"""

from __future__ import annotations

import numpy as np

from bench.grid.cell import Cell
from bench.measure.hardware import gpu_spec
from bench.speed.fit import Dataset, error_summary, held_out, reference_dataset
from bench.speed.model import NoDatasheetPeak
from bench.speed.params import ErrorBand, band_key, load_model_file
from bench.speed.predict import predict_on
from bench.speed.trace import trace_step_ops

RATIO_GPUS = ("A100-80GB", "A100-40GB", "H100-80GB", "H200", "B200", "RTX-3090", "RTX-4090", "L4", "L40S", "A10",
              "T4", "V100-16GB")
RATIO_CELLS = (("resnet50", 256), ("vit_base_patch16_224", 128))
"""Cross-GPU ratios: the study's two models at a micro-batch that fills a large GPU."""
BAND_QUANTILES = (10, 90)
"""The interval of a prediction: these percentiles of predicted / measured in the cross-GPU validation."""


def _summary(predicted: np.ndarray, measured: np.ndarray) -> dict:
    return {"rows": len(measured), **error_summary(predicted, measured),
            "median_ratio": round(float(np.median(predicted / measured)), 2)}


def _by(groups: np.ndarray, predicted: np.ndarray, measured: np.ndarray, name: str) -> list[dict]:
    return [{name: group, **_summary(predicted[groups == group], measured[groups == group])}
            for group in sorted(set(groups))]


def error_band(predicted: np.ndarray, measured: np.ndarray) -> ErrorBand:
    ratio = predicted / measured
    low, high = np.percentile(ratio, BAND_QUANTILES)
    summary = error_summary(predicted, measured)
    return ErrorBand(summary["median_error_pct"], summary["p90_error_pct"], round(float(low), 3),
                     round(float(high), 3), len(measured))


def validation_tables(data: Dataset | None = None) -> dict:
    """Held-out predictions of every reference row, and their errors by GPU, family and kind of GPU."""
    data = data or reference_dataset()
    measured = data.measured_samples_per_s
    gpus, families = data.column("gpu"), data.column("family")
    by_gpu = held_out(data, gpus)
    by_family = held_out(data, families)
    rows = [{"source": row.source, "gpu": row.gpu, "mode": row.mode, "precision": row.precision, "model": row.model,
             "memory_format": row.memory_format, "family": row.family, "batch_size": row.batch_size,
             "image_size": row.image_size, "measured_samples_per_s": row.samples_per_s,
             "logo_predicted_samples_per_s": round(float(g), 1), "logo_error_pct": round(abs(g / row.samples_per_s - 1) * 100, 1),
             "lofo_predicted_samples_per_s": round(float(f), 1), "lofo_error_pct": round(abs(f / row.samples_per_s - 1) * 100, 1)}
            for row, g, f in zip(data.rows, by_gpu, by_family)]
    kinds = np.array([band_key(gpu_spec(gpu)) for gpu in gpus])
    bands = {"all": error_band(by_gpu, measured),
             **{kind: error_band(by_gpu[kinds == kind], measured[kinds == kind]) for kind in sorted(set(kinds))}}
    return {"rows": rows, "logo_by_gpu": _by(gpus, by_gpu, measured, "gpu"),
            "logo_by_family": _by(families, by_gpu, measured, "family"),
            "lofo_by_family": _by(families, by_family, measured, "family"),
            "lofo_by_gpu": _by(gpus, by_family, measured, "gpu"),
            "logo": _summary(by_gpu, measured), "lofo": _summary(by_family, measured), "bands": bands}


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
