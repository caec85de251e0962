"""The throughput model's parameter file (`bench/data/speed_params.json`): fitted parameters, their basis,
and the cross-GPU error bands every prediction states. No torch here: `bench plan` reads the bands.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from importlib import resources

from bench.measure.hardware import GpuSpec

PARAMS_FILE = "speed_params.json"
FITTED_GENERATIONS = ("volta", "turing", "ada")
"""Generations whose tensor-core factor the calibration rows can set (relative to Ampere's, 1). Hopper and
Blackwell have no public row in the calibration data: they take Ampere's factor, and say so."""


@dataclass(frozen=True)
class SpeedParams:
    """The fitted parameters (the fit's output, `bench/data/speed_params.json`)."""

    e_matmul: float
    """Best fraction of the dtype's dense peak a matrix multiply (and fused attention) reaches on Ampere."""
    e_conv: float
    """The same for a dense convolution."""
    e_grouped_conv: float
    """The same for a grouped or depthwise convolution."""
    e_tf32: float
    """Multiplies those efficiencies for an fp32 op run on TF32 tensor cores (tf32 and AMP precisions)."""
    e_fp32: float
    """Multiplies them for an fp32 op run on the FP32 (SIMT) units: fp32 precision, or a GPU without TF32."""
    gen_volta: float
    """Multiplies the tensor-core efficiencies on Volta (relative to Ampere; not the FP32 units')."""
    gen_turing: float
    """The same on Turing."""
    gen_ada: float
    """The same on Ada."""
    flops_per_sm_half: float
    """FLOPs per SM at which a tensor op reaches half its best efficiency."""
    nchw_half_bytes: float
    """Extra bytes, as a multiple of its own, a half-precision NCHW convolution moves (transposes)."""
    e_memory: float
    """Achievable fraction of the datasheet bandwidth (stream-like kernels reach 80-90 %)."""
    bytes_per_sm_half: float
    """Bytes per SM at which a memory-bound kernel reaches half its bandwidth (occupancy)."""
    l2_speedup: float
    """Bandwidth multiple for an op whose bytes fit in L2."""
    simt_per_cycle: float
    """Output elements per SM per clock cycle of a non-tensor kernel."""
    kernel_us: float
    """Fixed GPU time per kernel launched, microseconds."""
    host_us: float
    """The host's time to dispatch one op (eager PyTorch), microseconds: the step's floor is the ops
    times this. Fitted; this CPU's measured figure (`bench.speed.dispatch`) is its starting point."""

    @property
    def compute_efficiency(self) -> dict[str, float]:
        # Fused attention runs on the same tensor cores as a matmul; few calibration rows hold it.
        return {"matmul": self.e_matmul, "conv": self.e_conv, "grouped_conv": self.e_grouped_conv,
                "attention": self.e_matmul}

    def generation_factor(self, generation: str) -> float:
        return getattr(self, f"gen_{generation}") if generation in FITTED_GENERATIONS else 1.0

    def to_vector(self) -> list[float]:
        return [getattr(self, f.name) for f in fields(self)]

    @classmethod
    def from_vector(cls, values: list[float]) -> SpeedParams:
        return cls(*values)


@dataclass(frozen=True)
class ErrorBand:
    """What the cross-GPU validation measured for one kind of prediction: quantiles of predicted/measured."""

    median_error_pct: float
    p90_error_pct: float
    ratio_low: float
    """10th percentile of predicted / measured: the prediction divided by it is the interval's top."""
    ratio_high: float
    """90th percentile of predicted / measured."""
    rows: int


@dataclass(frozen=True)
class ModelFile:
    """What `bench/data/speed_params.json` holds: the version, the parameters, their basis and error."""

    version: str
    params: SpeedParams
    fitted_on: str
    validation: str
    """Which validation the error figures are: `leave-one-GPU-out` (cross-GPU)."""
    bands: dict[str, ErrorBand]
    """Cross-GPU error per kind of GPU (`band_key`), and `all`."""

    def band(self, spec: GpuSpec | None = None) -> ErrorBand | None:
        """The error band that applies on `spec`: its kind's, else the overall one (None: not validated)."""
        overall = self.bands.get("all")
        return overall if spec is None else self.bands.get(band_key(spec), overall)

    def basis(self, spec: GpuSpec | None = None) -> str:
        """`predicted (model v3, leave-one-GPU-out on gddr GPUs: median error 14.6 %, p90 41.5 %)`."""
        band = self.band(spec)
        if band is None:
            return f"predicted (model {self.version}, not validated)"
        kind = "" if spec is None or band_key(spec) not in self.bands else f" on {band_key(spec)} GPUs"
        return (f"predicted (model {self.version}, {self.validation}{kind}: median error "
                f"{band.median_error_pct:.1f} %, p90 {band.p90_error_pct:.1f} %)")

    def interval(self, samples_per_s: float, spec: GpuSpec) -> tuple[float, float] | None:
        """(low, high) samples/s: the prediction over the 90th and 10th percentiles of predicted/measured
        in the cross-GPU validation of `spec`'s kind of GPU (None: not validated)."""
        band = self.band(spec)
        return None if band is None else (samples_per_s / band.ratio_high, samples_per_s / band.ratio_low)


def band_key(spec: GpuSpec) -> str:
    """Kinds of GPU the validation can tell apart: datacenter HBM parts and GDDR parts."""
    return "hbm" if spec.generation in ("volta", "hopper", "blackwell") or spec.gpu.startswith("A100") else "gddr"


@lru_cache(maxsize=None)
def load_model_file() -> ModelFile:
    data = json.loads(resources.files("bench.data").joinpath(PARAMS_FILE).read_text())
    bands = {key: ErrorBand(**value) for key, value in data["validation"]["bands"].items()}
    return ModelFile(data["version"], SpeedParams(**data["params"]), data["fitted_on"],
                     data["validation"]["name"], bands)


def params_json(version: str, params: SpeedParams, fitted_on: str, validation: dict) -> str:
    """The parameter file's text: sorted, rounded, so a re-fit on the same data is the same bytes."""
    rounded = {name: float(f"{value:.6g}") for name, value in asdict(params).items()}
    return json.dumps({"version": version, "fitted_on": fitted_on, "params": rounded, "validation": validation},
                      indent=2, sort_keys=True) + "\n"
