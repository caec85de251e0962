"""How good the throughput model is: leave-one-family-out errors, and what it says between GPUs."""

from __future__ import annotations

import numpy as np

from bench.grid.cell import Cell
from bench.measure.hardware import gpu_spec
from bench.speed.fit import Dataset, error_summary, leave_one_family_out
from bench.speed.model import NoDatasheetPeak, load_model_file
from bench.speed.predict import predict_on
from bench.speed.reference import read_reference_ops, reference_rows
from bench.speed.trace import trace_step_ops

RATIO_GPUS = ("A100-80GB", "H100-80GB", "H200", "RTX-3090", "RTX-4090", "L4", "L40S", "A10", "T4", "V100-16GB")
RATIO_CELLS = (("resnet50", 256), ("vit_base_patch16_224", 128))
"""Cross-GPU ratios: the study's two models at a micro-batch that fills a large GPU."""


def validation_table() -> tuple[list[dict], list[dict], dict]:
    """(one row per reference row, one per family, the overall summary) of the held-out predictions."""
    data = Dataset.of(reference_rows(), read_reference_ops())
    predicted = leave_one_family_out(data)
    measured = data.measured_samples_per_s
    rows = [{"model": row.model, "memory_format": row.memory_format, "family": row.family,
             "batch_size": row.batch_size, "image_size": row.image_size,
             "measured_samples_per_s": row.samples_per_s, "predicted_samples_per_s": round(float(p), 1),
             "error_pct": round(abs(float(p) / row.samples_per_s - 1) * 100, 1)}
            for row, p in zip(data.rows, predicted)]
    families = data.families
    by_family = [{"family": family, "rows": int((families == family).sum()),
                  **error_summary(predicted[families == family], measured[families == family]),
                  "median_ratio": round(float(np.median(predicted[families == family] / measured[families == family])), 2)}
                 for family in sorted(set(families))]
    overall = {"rows": len(rows), **error_summary(predicted, measured),
               "median_ratio": round(float(np.median(predicted / measured)), 2)}
    return rows, by_family, overall


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
                    rates[gpu] = predict_on(cell, ops, gpu_spec(gpu), model).samples_per_s
                except NoDatasheetPeak:
                    rates[gpu] = None
            base = rates[RATIO_GPUS[0]]
            table.append({"model": name, "precision": precision, "micro_batch": micro_batch,
                          f"{RATIO_GPUS[0]}_samples_per_s": round(base, 1),
                          **{f"{gpu}_x": "no peak" if rate is None else round(rate / base, 2)
                             for gpu, rate in rates.items()}})
    return table
