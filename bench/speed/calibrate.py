"""Fitting the throughput model's parameters on several GPUs, and judging it on GPUs and families it never saw.

The data are the traced reference rows (`bench.speed.reference`): for each, its op table, its GPU's
catalog figures at its precision, and the measured samples/s. The fit minimises the weighted mean
|log(predicted / measured)|, each (source, GPU) group weighted by 1 / sqrt(its rows) so the 140 timm
rows of the RTX 3090 do not drown a GPU with eight, by a deterministic search (scipy's Powell) from a fixed start:
the same data give the same parameters, byte for byte (`params_json`). Validation refits without one
GPU (leave-one-GPU-out) or one family (leave-one-family-out) and predicts what it left out.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np
from scipy.optimize import minimize

from bench.measure.hardware import gpu_spec
from bench.speed.dispatch import stored_host_dispatch
from bench.speed.model import GENERATIONS, KERNEL_US, EntryRates, OpFeatures, gpu_rates, op_features, op_times
from bench.speed.params import FITTED_GENERATIONS, SHARED_GENERATIONS, SpeedParams, load_model_file, params_json
from bench.speed.reference import ReferenceRow, read_reference_ops, reference_rows
from bench.measure.op_table import OpTable

START = SpeedParams(e_matmul=0.7, e_conv=0.6, e_grouped_conv=0.2, e_tf32=0.7, e_fp32=0.7, gen_volta=1.0, gen_turing=1.0, gen_ada=1.0,
                    gen_hopper=1.0,
                    flops_per_sm_half=1e6, nchw_half_bytes=1.0, e_grouped_nhwc=0.3, e_memory=0.8, batch_norm_bytes=1.6,
                    bytes_per_sm_half=1e4,
                    l2_speedup=2.0, elements_per_lane_cycle=0.25, kernel_us=KERNEL_US, host_us=10.0)
"""Where the search starts: round figures of the usual order, not a result (`kernel_us` and `host_us` are not
searched: `HELD_FIXED`)."""
HELD_FIXED = ("kernel_us", "host_us")
"""Parameters the fit does not move. The calibration rows are large steps (the fastest spends 17.5 us of
measured step per op it dispatches, most spend 400 us), so their loss is nearly flat in both; searched
freely, the v2 fit drove both to 0.02 us, which made a tiny step memory-bound. `kernel_us` is the
launch figure `KERNEL_US`; `host_us` is this CPU's measured dispatch (`bench/data/host_dispatch.csv`),
capped by the fastest fitted row (`host_bound_us`)."""
_FRACTIONS = ("e_matmul", "e_conv", "e_grouped_conv", "e_tf32", "e_fp32", "e_grouped_nhwc", "e_memory")
_AT_LEAST_ONE = ("l2_speedup", "batch_norm_bytes")
"""Searched through a logistic (always in (0, 1)); `_AT_LEAST_ONE` as 1 + a positive number (an L2 hit is never
slower, a batch norm moves at least its bytes); every other parameter through a logarithm (positive)."""
SEARCH = {"method": "Powell", "options": {"maxiter": 20000, "xtol": 1e-4, "ftol": 1e-7}}
"""scipy's Powell search: no gradient (the loss is an L1 of logs), deterministic, and on these rows it finds a
lower loss than the Nelder-Mead it replaced (0.161 against 0.175, the same model), which had let poorly
pinned parameters drift to extremes (an L2 hit 300x faster, free elementwise work)."""
GENERATION_PRIOR = 0.02
"""Weight of the squared log of each generation factor in the loss (a mean |log error| of 0.17 is typical)."""


@dataclass(frozen=True)
class Dataset:
    """Traced rows as one concatenated op table, with each entry's row and GPU figures."""

    rows: tuple[ReferenceRow, ...]
    table: OpTable
    row_index: np.ndarray
    features: OpFeatures
    """The op table's features on each row's GPU (`op_features`): what the parameters act on."""
    host_ops: np.ndarray
    """Ops the host dispatches per step, per row."""
    weights: np.ndarray
    """Each row's weight in the fit's loss."""

    @classmethod
    def of(cls, rows: list[ReferenceRow], tables: dict[str, OpTable]) -> Dataset:
        kept = tuple(row for row in rows if row.trace in tables)
        parts = [tables[row.trace] for row in kept]
        index = np.concatenate([np.full(len(part.count), i) for i, part in enumerate(parts)])
        # A reference row's TF32 switches are its precision's (`TF32_BY_PRECISION`): DLE's TF32 rows ran PyTorch
        # 1.7-1.8, whose matmul TF32 default was on, Lambda's NGC containers turn it on, timm's benchmark sets both.
        per_row = [EntryRates.of(part, gpu_rates(gpu_spec(row.gpu), row.precision)) for row, part in zip(kept, parts)]
        rates = EntryRates(*(np.concatenate([np.broadcast_to(getattr(r, f.name), len(p.count))
                                             for r, p in zip(per_row, parts)]) for f in fields(EntryRates)))
        spread = lambda values: np.concatenate([np.full(len(p.count), v) for p, v in zip(parts, values)])
        groups = [(row.source, row.gpu) for row in kept]
        weights = np.array([1 / np.sqrt(groups.count(g)) for g in groups])
        table = OpTable.concat(parts)
        cudnn8 = spread([row.cudnn8 for row in kept]).astype(bool)
        return cls(kept, table, index, op_features(table, rates, cudnn8), np.array([p.count.sum() for p in parts]),
                   weights)

    @property
    def measured_samples_per_s(self) -> np.ndarray:
        return np.array([row.samples_per_s for row in self.rows])

    def column(self, name: str) -> np.ndarray:
        """One field of every row: `data.column("gpu")`."""
        return np.array([getattr(row, name) for row in self.rows])


def to_search(params: SpeedParams) -> np.ndarray:
    """Parameters as the unconstrained vector the search moves."""
    def one(name: str, v: float) -> float:
        if name in _FRACTIONS:
            return float(np.log(v / (1 - v)))
        return float(np.log(v - 1)) if name in _AT_LEAST_ONE else float(np.log(v))
    return np.array([one(f.name, v) for f, v in zip(fields(SpeedParams), params.to_vector())])


def from_search(vector: np.ndarray) -> SpeedParams:
    def one(name: str, x: float) -> float:
        if name in _FRACTIONS:
            return float(1 / (1 + np.exp(-x)))
        return float(1 + np.exp(x)) if name in _AT_LEAST_ONE else float(np.exp(x))
    return SpeedParams.from_vector([one(f.name, x) for f, x in zip(fields(SpeedParams), vector)])


def predict_samples_per_s(data: Dataset, params: SpeedParams) -> np.ndarray:
    """Each row's predicted samples/s on its own GPU (the model of `bench.speed.model`, vectorised)."""
    per_op = op_times(data.features, None, params).op_s
    gpu_s = np.bincount(data.row_index, weights=per_op, minlength=len(data.rows))
    step_s = np.maximum(gpu_s, data.host_ops * params.host_us * 1e-6)
    return np.array([row.batch_size for row in data.rows]) / step_s


def fit(data: Dataset, mask: np.ndarray | None = None, start: SpeedParams = START) -> SpeedParams:
    """The parameters that minimise the weighted mean |log(pred / meas)| over the rows in `mask` (default all)."""
    mask = np.ones(len(data.rows), dtype=bool) if mask is None else mask
    measured = np.log(data.measured_samples_per_s)
    weights = data.weights * mask

    generations = np.array([f.name.startswith("gen_") for f in fields(SpeedParams)])

    def loss(vector: np.ndarray) -> float:
        with np.errstate(over="ignore"):
            predicted = np.log(predict_samples_per_s(data, from_search(vector)))
        value = float((np.abs(predicted - measured) * weights).sum() / weights.sum())
        # A prior that generations are alike unless the rows say otherwise: without it a class that only
        # one generation's rows hold (matmuls: the RTX 4090's) trades its efficiency against that
        # generation's factor freely, and a GPU held out of the fit inherits the drift.
        value += GENERATION_PRIOR * float((vector[generations] ** 2).sum())
        return value if np.isfinite(value) else np.inf

    # A generation with no row in the fit has no say in its factor: held at the start's (Ampere's, 1),
    # not left to drift along a flat direction of the search.
    seen = {SHARED_GENERATIONS.get(GENERATIONS[g], GENERATIONS[g])
            for g in np.unique(data.features.rates.generation[mask[data.row_index]])}
    held = {f"gen_{g}" for g in FITTED_GENERATIONS if g not in seen} | set(HELD_FIXED)
    free = np.array([f.name not in held for f in fields(SpeedParams)])
    base = to_search(replace(start, host_us=host_bound_us(data, mask, start.host_us)))

    def full(sub: np.ndarray) -> np.ndarray:
        vector = base.copy()
        vector[free] = sub
        return vector

    best = minimize(lambda sub: loss(full(sub)), base[free], **SEARCH).x
    return from_search(full(best))


def host_bound_us(data: Dataset, mask: np.ndarray, measured_us: float) -> float:
    """The host's dispatch cost per op: `measured_us` (this CPU), or less where a fitted row's measured step
    over the ops it dispatches is shorter (a step never finishes before its host has issued every op, so
    that row's host dispatched faster). Rounded so the parameter file's bytes do not hang on float noise.

    >>> import types
    >>> rows = types.SimpleNamespace(measured_samples_per_s=np.array([1000.0, 100.0]), host_ops=np.array([250, 10]),
    ...                              rows=[types.SimpleNamespace(batch_size=4)] * 2)
    >>> host_bound_us(rows, np.array([True, True]), 22.158), host_bound_us(rows, np.array([False, True]), 22.158)
    (16.0, 22.158)
    """
    batch = np.array([row.batch_size for row in data.rows])
    per_op_us = batch / data.measured_samples_per_s / data.host_ops * 1e6
    return round(float(min(measured_us, per_op_us[mask].min())), 3)


def reference_start() -> SpeedParams:
    """`START`, with the host's dispatch cost as measured on this CPU (`bench/data/host_dispatch.csv`)."""
    return replace(START, host_us=stored_host_dispatch().us_per_op)


def reference_dataset() -> Dataset:
    return Dataset.of(reference_rows(), read_reference_ops())


def fitted_on(data: Dataset) -> str:
    """The fit's basis in words: rows per source and GPU."""
    groups: dict[str, int] = {}
    for row in data.rows:
        key = f"{row.source} {row.gpu}"
        groups[key] = groups.get(key, 0) + 1
    listed = ", ".join(f"{key} {n}" for key, n in sorted(groups.items()))
    return (f"{len(data.rows)} rows of bench/data/reference/ ({listed}); weighted mean |log(predicted / measured)|;"
            f" held, not fitted: kernel_us {KERNEL_US:g} (the launch figure), host_us the lesser of the "
            f"{stored_host_dispatch().source} and the fastest fitted row's measured step per dispatched op")


def fitted_params_json() -> tuple[str, Dataset]:
    """The parameter file a re-fit writes (the committed file's version and validation kept)."""
    current = load_model_file()
    data = reference_dataset()
    params = fit(data, start=reference_start())
    return params_json(current.version, params, fitted_on(data), validation_json(current)), data


def validation_json(model) -> dict:
    """The validation part of the parameter file, as `load_model_file` reads it."""
    projections = {name: vars(band) for name, band in (("projection", model.projection),
                                                       ("model_scaled", model.model_scaled)) if band is not None}
    return {"name": model.validation, "bands": {key: vars(band) for key, band in sorted(model.bands.items())},
            "training_gpus": list(model.training_gpus), **projections}


def held_out_fits(data: Dataset, groups: np.ndarray, only: set[str] | None = None) -> dict[str, np.ndarray]:
    """Per group (a GPU, a family; those in `only`, default all): every row's predicted samples/s from a fit that
    never saw a row of that group."""
    start = reference_start()
    return {group: predict_samples_per_s(data, fit(data, groups != group, start)) for group in sorted(set(groups))
            if only is None or group in only}


def held_out(fits: dict[str, np.ndarray], groups: np.ndarray) -> np.ndarray:
    """Each row's prediction from the fit of `held_out_fits` that never saw its group."""
    predicted = np.zeros(len(groups))
    for group, prediction in fits.items():
        predicted[groups == group] = prediction[groups == group]
    return predicted


def error_summary(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    """Median and 90th percentile of |predicted / measured - 1|, in percent.

    >>> error_summary(np.array([110.0, 80.0]), np.array([100.0, 100.0]))
    {'median_error_pct': 15.0, 'p90_error_pct': 19.0}
    """
    errors = np.abs(predicted / measured - 1) * 100
    return {"median_error_pct": round(float(np.median(errors)), 1),
            "p90_error_pct": round(float(np.percentile(errors, 90)), 1)}
