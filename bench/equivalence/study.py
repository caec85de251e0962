"""The equivalence study: every variant of `bench.equivalence.compare`, K = 1..16, for a few models.

`run_study` measures one row per model, variant and K (a variant that cannot run for a model or
a K, such as a BatchNorm variant on a model without BatchNorm, is a `skipped` row with the reason)
and writes `equivalence.csv` with provenance; `bench.equivalence.table` renders the tables and the
chart from that file. `bench equivalence --study` (or `make equivalence`) runs it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable

import pandas as pd

from bench.equivalence.compare import (
    Comparison,
    EquivalenceError,
    Settings,
    compare,
    prepare,
)
from bench.equivalence.variants import VARIANTS
from bench.measure.device import DeviceInfo
from bench.results.provenance import provenance, utc_now
from bench.results.store import EQUIVALENCE_CSV


COLUMNS = [
    "model", "variant", "image_size_px", "dtype", "device", "optimizer", "seed", "effective_batch",
    "accum_steps", "micro_batch_sizes", "status", "equivalent", "tolerance", "grad_rel_l2", "grad_norm_ratio",
    "worst_parameters", "loss_large_batch_nats", "loss_accumulated_nats", "bn_stats_rel_l2",
    "bn_updates_large_batch", "bn_updates_accumulated", "weights_rel_l2", "weights_max_abs_diff", "reason",
    "device_name", "threads", "git_commit", "git_dirty", "torch_version", "timm_version", "bitsandbytes_version",
    "cuda_version", "python_version", "started_utc",
]
"""The CSV header. Relative L2 columns are ||accumulated - large batch|| / ||large batch|| (no unit)."""


def run_study(models: tuple[str, ...], accum_steps: tuple[int, ...], *, effective_batch: int, image_size: int,
              dtype: str, device: DeviceInfo, out: Path, on_row: Callable[[dict], None] | None = None) -> Path:
    """Measure every (model, variant, K) and write `out/equivalence.csv`; returns its path."""
    context = {"device_name": device.name, "threads": device.threads, **provenance(), "started_utc": utc_now()}
    rows = []
    for model in models:
        settings = Settings(model=model, effective_batch=effective_batch, image_size=image_size, dtype=dtype,
                            device=device.type)
        for variant in VARIANTS:
            for row in _measure(settings, variant, accum_steps, context):
                rows.append(row)
                if on_row:
                    on_row(row)
    # Whole numbers stay whole where skipped rows leave gaps.
    table = pd.DataFrame(rows, columns=COLUMNS).astype(
        {"accum_steps": "Int64", "bn_updates_large_batch": "Int64", "bn_updates_accumulated": "Int64"})
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / EQUIVALENCE_CSV, index=False)
    return out / EQUIVALENCE_CSV


def _measure(settings: Settings, variant: str, accum_steps: tuple[int, ...], context: dict) -> list[dict]:
    """One row per K for this model and variant; `skipped` rows where it cannot run."""
    base = {"model": settings.model, "variant": variant, "image_size_px": settings.image_size,
            "dtype": settings.dtype, "device": settings.device, "optimizer": settings.optimizer,
            "seed": settings.seed, "effective_batch": settings.effective_batch, **context}
    try:
        prepared = prepare(settings, variant)
    except EquivalenceError as exc:
        return [{**base, "status": "skipped", "reason": exc.message}]
    rows = []
    for k in accum_steps:
        try:
            rows.append({**base, **_row(compare(prepared, k))})
        except EquivalenceError as exc:
            rows.append({**base, "accum_steps": k, "status": "skipped", "reason": exc.message})
    return rows


def _row(c: Comparison) -> dict:
    fields = {f.name: getattr(c, f.name) for f in dataclasses.fields(c) if f.name != "settings"}
    return {**fields, "status": "ok", "micro_batch_sizes": json.dumps(c.micro_batch_sizes),
            "worst_parameters": json.dumps(c.worst_parameters), "grad_norm_ratio": c.grad_norm_ratio,
            "loss_large_batch_nats": c.loss_large_batch, "loss_accumulated_nats": c.loss_accumulated}
