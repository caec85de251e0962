"""Fitting the throughput model's efficiency parameters, and judging it leave-one-family-out.

The data are the traced reference rows (`bench.speed.reference`): for each, its op table and the
measured samples/s on the RTX 3090. The fit minimises the mean |log(predicted / measured)| by a
deterministic Nelder-Mead in log-parameter space from a fixed start, so the same data give the
same parameters, byte for byte (`params_json`). Validation refits once per family without that
family and predicts it: the errors it reports are of models the fit never saw.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

from bench.measure.hardware import gpu_spec
from bench.speed.model import SpeedParams, gpu_rates, load_model_file, op_times, params_json
from bench.speed.host import stored_host_dispatch
from bench.speed.reference import (
    MEASUREMENTS_FILE,
    REFERENCE_GPU,
    REFERENCE_PRECISION,
    ReferenceRow,
    read_reference_ops,
    reference_rows,
)
from bench.speed.trace import OpTable

START = SpeedParams(e_matmul=0.7, e_conv=0.6, e_grouped_conv=0.2, nchw_conv_factor=0.8,
                    flops_half=1e8, e_memory=0.7, bytes_half=1e6, kernel_us=3.0, host_us=10.0)
"""Where the search starts: round figures of the usual order, not a result."""
_FRACTIONS = ("e_matmul", "e_conv", "e_grouped_conv", "e_memory")
"""Searched through a logistic (always in (0, 1)); every other parameter through a logarithm (positive)."""
ITERATIONS = 1500


@dataclass(frozen=True)
class Dataset:
    """Traced rows as one concatenated op table, with each entry's row index."""

    rows: tuple[ReferenceRow, ...]
    table: OpTable
    row_index: np.ndarray
    host_ops: np.ndarray
    """Ops the host dispatches per step, per row."""

    @classmethod
    def of(cls, rows: list[ReferenceRow], tables: dict[str, OpTable]) -> Dataset:
        kept = tuple(row for row in rows if row.trace in tables)
        parts = [tables[row.trace] for row in kept]
        index = np.concatenate([np.full(len(part.count), i) for i, part in enumerate(parts)])
        return cls(kept, OpTable.concat(parts), index, np.array([part.count.sum() for part in parts]))

    @property
    def measured_samples_per_s(self) -> np.ndarray:
        return np.array([row.samples_per_s for row in self.rows])

    @property
    def families(self) -> np.ndarray:
        return np.array([row.family for row in self.rows])


def to_search(params: SpeedParams) -> np.ndarray:
    """Parameters as the unconstrained vector the search moves."""
    return np.array([np.log(v / (1 - v)) if f.name in _FRACTIONS else np.log(v)
                     for f, v in zip(fields(SpeedParams), params.to_vector())])


def from_search(vector: np.ndarray) -> SpeedParams:
    return SpeedParams.from_vector([float(1 / (1 + np.exp(-x)) if f.name in _FRACTIONS else np.exp(x))
                                    for f, x in zip(fields(SpeedParams), vector)])


def predict_samples_per_s(data: Dataset, params: SpeedParams) -> np.ndarray:
    """Each row's predicted samples/s on the reference GPU (the model of `bench.speed.model`, vectorised)."""
    rates = gpu_rates(gpu_spec(REFERENCE_GPU), REFERENCE_PRECISION)
    times = op_times(data.table, rates.peak_flops_per_s, rates.bandwidth_bytes_per_s, params)
    per_op = np.maximum(times.compute_s, times.memory_s) + times.kernel_s
    gpu_s = np.bincount(data.row_index, weights=per_op, minlength=len(data.rows))
    step_s = np.maximum(gpu_s, data.host_ops * params.host_us * 1e-6)
    return np.array([row.batch_size for row in data.rows]) / step_s


def fit(data: Dataset, mask: np.ndarray | None = None, start: SpeedParams = START) -> SpeedParams:
    """The parameters that minimise the mean |log(pred / meas)| over the rows in `mask` (default all)."""
    mask = np.ones(len(data.rows), dtype=bool) if mask is None else mask
    measured = np.log(data.measured_samples_per_s)

    def loss(vector: np.ndarray) -> float:
        predicted = np.log(predict_samples_per_s(data, from_search(vector)))
        return float(np.abs(predicted - measured)[mask].mean())

    best = nelder_mead(loss, to_search(start), ITERATIONS)
    best = nelder_mead(loss, best, ITERATIONS)  # a restart from the optimum escapes a collapsed simplex
    return from_search(best)


def reference_start() -> SpeedParams:
    """`START`, with the host's dispatch cost as measured on this CPU (`bench/data/host_dispatch.csv`)."""
    return replace(START, host_us=stored_host_dispatch().us_per_op)


def fit_reference() -> tuple[SpeedParams, Dataset]:
    """The fit on every traced reference row: what `bench predict --fit` writes."""
    data = Dataset.of(reference_rows(), read_reference_ops())
    return fit(data, start=reference_start()), data


def fitted_params_json() -> tuple[str, Dataset]:
    """The parameter file a re-fit writes (the committed file's version and validation kept)."""
    current = load_model_file()
    params, data = fit_reference()
    fitted_on = (f"{len(data.rows)} rows of bench/data/reference/{MEASUREMENTS_FILE} ({REFERENCE_GPU}, AMP fp16, "
                 f"SGD), mean |log(predicted / measured)|; host_us started from {stored_host_dispatch().source}; "
                 "no project GPU rows exist yet")
    return params_json(current.version, params, fitted_on,
                       {"median_error_pct": current.validation_median_error_pct,
                        "p90_error_pct": current.validation_p90_error_pct}), data


def leave_one_family_out(data: Dataset) -> np.ndarray:
    """Each row's predicted samples/s from a fit that never saw its family."""
    predicted = np.zeros(len(data.rows))
    families = data.families
    for family in sorted(set(families)):
        held_out = families == family
        params = fit(data, ~held_out, reference_start())
        predicted[held_out] = predict_samples_per_s(data, params)[held_out]
    return predicted


def error_summary(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    """Median and 90th percentile of |predicted / measured - 1|, in percent.

    >>> error_summary(np.array([110.0, 80.0]), np.array([100.0, 100.0]))
    {'median_error_pct': 15.0, 'p90_error_pct': 19.0}
    """
    errors = np.abs(predicted / measured - 1) * 100
    return {"median_error_pct": round(float(np.median(errors)), 1),
            "p90_error_pct": round(float(np.percentile(errors, 90)), 1)}


def nelder_mead(loss, start: np.ndarray, iterations: int, step: float = 0.5) -> np.ndarray:
    """Minimise `loss` from `start` (standard coefficients; deterministic: no random restarts)."""
    simplex = [start] + [start + step * np.eye(len(start))[i] for i in range(len(start))]
    values = [loss(point) for point in simplex]
    for _ in range(iterations):
        order = np.argsort(values, kind="stable")
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        centroid = np.mean(simplex[:-1], axis=0)
        reflected = centroid + (centroid - simplex[-1])
        r = loss(reflected)
        if r < values[0]:
            expanded = centroid + 2 * (centroid - simplex[-1])
            e = loss(expanded)
            simplex[-1], values[-1] = (expanded, e) if e < r else (reflected, r)
        elif r < values[-2]:
            simplex[-1], values[-1] = reflected, r
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            c = loss(contracted)
            if c < values[-1]:
                simplex[-1], values[-1] = contracted, c
            else:
                simplex = [simplex[0]] + [simplex[0] + 0.5 * (p - simplex[0]) for p in simplex[1:]]
                values = [values[0]] + [loss(p) for p in simplex[1:]]
    return simplex[int(np.argmin(values))]
