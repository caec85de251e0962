"""The throughput model: a roofline per op, a per-kernel cost, and the host's dispatch as a floor.

Each op takes max(FLOPs / (peak[dtype] x e_c), bytes / (bandwidth x e_m)) plus a fixed
per-kernel cost. Efficiency saturates with size, e(x) = e_max x / (x + x_half): so an op's
time is (x + x_half) / (rate x e_max), and a kernel too small to fill the GPU pays x_half
extra; a small micro-batch pays it on every kernel. e_max is per op class (`COMPUTE_CLASSES`
by FLOPs, attention at the matmul's; every class by bytes). The GPU's time is the sum over ops; the host issues every op
(eager PyTorch) at a fitted dispatch cost per op, so the step is the longer of the two. The part
that sets the step names its bound: `compute`, `memory` or `overhead` (per-kernel cost or host).

The peaks and bandwidths are the GPU catalog's datasheet figures (`bench/data/gpus.csv`); the
efficiency parameters are fitted (`bench.speed.fit`) and read from `bench/data/speed_params.json`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from importlib import resources
from typing import Literal

import numpy as np

from bench.errors import BadInput
from bench.measure.hardware import PEAK_COLUMN, GpuSpec
from bench.speed.ops import COMPUTE_CLASSES
from bench.speed.trace import DTYPES, OP_CLASSES, OpTable

Bound = Literal["compute", "memory", "overhead"]
PARAMS_FILE = "speed_params.json"


class NoDatasheetPeak(BadInput):
    """A GPU's catalog row lacks the peak (or bandwidth) a prediction needs: refused, never guessed."""


@dataclass(frozen=True)
class SpeedParams:
    """The fitted efficiency parameters (the fit's output, `bench/data/speed_params.json`)."""

    e_matmul: float
    """Best fraction of the dtype's peak a matrix multiply reaches."""
    e_conv: float
    """The same for a dense convolution in channels-last format."""
    e_grouped_conv: float
    """The same for a grouped or depthwise convolution."""
    nchw_conv_factor: float
    """Multiplies a convolution's efficiency when its input is not channels-last."""
    flops_half: float
    """FLOPs at which a compute op reaches half its best efficiency."""
    e_memory: float
    """Best fraction of the datasheet bandwidth any op reaches."""
    bytes_half: float
    """Bytes at which an op reaches half its best bandwidth."""
    kernel_us: float
    """Fixed GPU time per kernel launched, microseconds."""
    host_us: float
    """The host's time to dispatch one op (eager PyTorch), microseconds: the step's floor is the ops
    times this. Fitted; this CPU's measured figure (`bench.speed.host`) is its starting point."""

    @property
    def compute_efficiency(self) -> dict[str, float]:
        # Fused attention runs on the same tensor cores as a matmul; the calibration rows (PyTorch 1.12,
        # eager attention) hold none, so it has no parameter of its own that data could set.
        return {"matmul": self.e_matmul, "conv": self.e_conv, "grouped_conv": self.e_grouped_conv,
                "attention": self.e_matmul}

    def to_vector(self) -> list[float]:
        return [getattr(self, f.name) for f in fields(self)]

    @classmethod
    def from_vector(cls, values: list[float]) -> SpeedParams:
        return cls(*values)


@dataclass(frozen=True)
class ModelFile:
    """What `bench/data/speed_params.json` holds: the version, the parameters and their basis."""

    version: str
    params: SpeedParams
    fitted_on: str
    validation_median_error_pct: float | None
    validation_p90_error_pct: float | None

    def basis(self) -> str:
        """`predicted (model v1, validation median error 12.3 %)`."""
        error = "not validated" if self.validation_median_error_pct is None else \
            f"validation median error {self.validation_median_error_pct:.1f} %"
        return f"predicted (model {self.version}, {error})"


@lru_cache(maxsize=None)
def load_model_file() -> ModelFile:
    data = json.loads(resources.files("bench.data").joinpath(PARAMS_FILE).read_text())
    return ModelFile(data["version"], SpeedParams(**data["params"]), data["fitted_on"],
                     data["validation"]["median_error_pct"], data["validation"]["p90_error_pct"])


def params_json(version: str, params: SpeedParams, fitted_on: str, validation: dict[str, float | None]) -> str:
    """The parameter file's text: sorted, rounded, so a re-fit on the same data is the same bytes."""
    rounded = {name: float(f"{value:.6g}") for name, value in asdict(params).items()}
    return json.dumps({"version": version, "fitted_on": fitted_on, "params": rounded, "validation": validation},
                      indent=2, sort_keys=True) + "\n"


@dataclass(frozen=True)
class GpuRates:
    """The datasheet figures one prediction divides by."""

    gpu: str
    peak_flops_per_s: np.ndarray
    """Per `DTYPES` entry, the peak a compute op of that dtype runs at (NaN: unknown)."""
    bandwidth_bytes_per_s: float
    headline_peak_flops_per_s: float
    """The cell's precision's peak: the MFU denominator."""


def gpu_rates(spec: GpuSpec, precision: str) -> GpuRates:
    """The peaks `precision` runs at on `spec`; refuses a GPU whose datasheet lacks one.

    fp32 compute ops run at the TF32 peak under tf32 and under AMP (the runner allows TF32
    there), at the FP32 peak under fp32; a GPU without TF32 (Turing, Volta) runs them at FP32.
    """
    column = PEAK_COLUMN[precision]
    headline = spec.peak_tflops[column]
    if headline is None:
        raise NoDatasheetPeak(f"--gpu {spec.gpu}: bench/data/gpus.csv has no {column} (datasheet peak) for "
                              f"{precision}; no prediction rather than a guess")
    if spec.memory_bandwidth_gb_per_s is None:
        raise NoDatasheetPeak(f"--gpu {spec.gpu}: bench/data/gpus.csv has no memory_bandwidth_gb_per_s")
    tflops = spec.peak_tflops
    fp32 = tflops["fp32_tflops"] if precision == "fp32" else (tflops["tf32_tflops"] or tflops["fp32_tflops"])
    by_dtype = {"float16": tflops["fp16_tflops"], "bfloat16": tflops["bf16_tflops"], "float32": fp32,
                "other": fp32}
    peaks = np.array([np.nan if by_dtype[d] is None else by_dtype[d] * 1e12 for d in DTYPES])
    return GpuRates(spec.gpu, peaks, spec.memory_bandwidth_gb_per_s * 1e9, headline * 1e12)


@dataclass(frozen=True)
class OpTimes:
    """Per-op times of one step (seconds), by part of the roofline."""

    compute_s: np.ndarray
    memory_s: np.ndarray
    kernel_s: np.ndarray


_COMPUTE_INDEX = np.array([name in COMPUTE_CLASSES for name in OP_CLASSES])
_KERNEL_INDEX = np.array([name != "view" for name in OP_CLASSES])
_CONV_INDEX = np.array([name in ("conv", "grouped_conv") for name in OP_CLASSES])


def op_times(table: OpTable, peaks: np.ndarray, bandwidth: float, params: SpeedParams) -> OpTimes:
    """Roofline times of every entry in `table` (times its count). `peaks` per `DTYPES` index."""
    e_max = np.array([params.compute_efficiency.get(name, 0.0) for name in OP_CLASSES])[table.op_class]
    e_max = e_max * np.where(_CONV_INDEX[table.op_class] & ~table.channels_last, params.nchw_conv_factor, 1.0)
    computing = _COMPUTE_INDEX[table.op_class] & (table.flops > 0)
    peak = peaks[table.dtype]
    with np.errstate(invalid="ignore", divide="ignore"):
        compute = np.where(computing, (table.flops + params.flops_half) / (peak * np.minimum(e_max, 1.0)), 0.0)
    launched = _KERNEL_INDEX[table.op_class]
    memory = np.where(launched & (table.bytes_moved > 0),
                      (table.bytes_moved + params.bytes_half) / (bandwidth * min(params.e_memory, 1.0)), 0.0)
    return OpTimes(compute * table.count, memory * table.count,
                   np.where(launched, params.kernel_us * 1e-6, 0.0) * table.count)


@dataclass(frozen=True)
class StepTime:
    """A predicted step: its time, and what sets it."""

    step_time_s: float
    gpu_s: float
    host_s: float
    compute_s: float
    """Time of the ops whose FLOPs take longer than their bytes."""
    memory_s: float
    """Time of the ops whose bytes take longer than their FLOPs."""
    kernel_overhead_s: float
    bound: Bound


def step_time(table: OpTable, rates: GpuRates, params: SpeedParams) -> StepTime:
    """The predicted time of the step whose ops are `table` on the GPU of `rates`."""
    if np.isnan(rates.peak_flops_per_s[table.dtype[_COMPUTE_INDEX[table.op_class] & (table.flops > 0)]]).any():
        raise NoDatasheetPeak(f"--gpu {rates.gpu}: a compute op's dtype has no datasheet peak in "
                              "bench/data/gpus.csv; no prediction rather than a guess")
    times = op_times(table, rates.peak_flops_per_s, rates.bandwidth_bytes_per_s, params)
    compute_bound = times.compute_s >= times.memory_s
    compute_s = float(times.compute_s[compute_bound].sum())
    memory_s = float(times.memory_s[~compute_bound].sum())
    kernel_s = float(times.kernel_s.sum())
    gpu_s = compute_s + memory_s + kernel_s
    host_s = float(table.count.sum()) * params.host_us * 1e-6
    parts = {"compute": compute_s, "memory": memory_s, "overhead": max(kernel_s, host_s if host_s > gpu_s else 0)}
    bound: Bound = max(parts, key=parts.get) if host_s <= gpu_s else "overhead"
    return StepTime(max(gpu_s, host_s), gpu_s, host_s, compute_s, memory_s, kernel_s, bound)
