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


BAND_MIN_ROWS = 20
"""The fewest held-out rows a slice of the validation needs to set an interval of its own (`band_keys`)."""
BAND_MIN_GPUS = 2
"""... and the fewest GPUs they come from: a cross-GPU error from one GPU's rows is that GPU's error."""


def band_keys(spec: GpuSpec | None, mix: str | None = None) -> tuple[str, ...]:
    """The validation slices a prediction's error may come from, narrowest first: its kind of GPU (`band_key`),
    op mix (`bench.speed.model.mix_of`) and training rows (a prediction is a training step), then wider ones.
    The first slice the validation holds (`BAND_MIN_ROWS` rows or more, of `BAND_MIN_GPUS` GPUs) applies.

    >>> from bench.measure.hardware import gpu_spec
    >>> band_keys(gpu_spec("RTX-4090"), "conv")
    ('gddr conv train', 'gddr conv', 'gddr train', 'gddr', 'all')
    """
    if spec is None:
        return ("all",)
    kind = band_key(spec)
    narrow = (f"{kind} {mix} train", f"{kind} {mix}") if mix else ()
    return (*narrow, f"{kind} train", kind, "all")


def describe_band_key(key: str) -> str:
    """`gddr conv train` -> `training rows of conv nets on gddr GPUs`."""
    words = key.split()
    if words == ["all"]:
        return "all GPUs"
    rows = "training rows" if "train" in words else "rows"
    mix = f" of {words[1]} nets" if len(words) > 1 and words[1] != "train" else ""
    return f"{rows}{mix} on {words[0]} GPUs"


@dataclass(frozen=True)
class ModelFile:
    """What `bench/data/speed_params.json` holds: the version, the parameters, their basis and error."""

    version: str
    params: SpeedParams
    fitted_on: str
    validation: str
    """Which validation the error figures are: `leave-one-GPU-out` (cross-GPU)."""
    bands: dict[str, ErrorBand]
    """Cross-GPU error per validation slice (`band_keys`), and `all`."""
    projection: ErrorBand | None = None
    """The error of carrying a measured MFU over to another GPU (`bench cost`'s `projected_from_gpu`), from pairs
    of public rows of one configuration on two GPUs (`bench.speed.validate.projection_band`)."""
    model_scaled: ErrorBand | None = None
    """The error of scaling a measured speed by the model's predicted ratio between the two GPUs (`bench cost`'s
    `projected_by_model`, Habitat's way), on the same pairs (`bench.speed.validate.model_scaled_pairs`)."""

    def band_and_key(self, spec: GpuSpec | None = None, mix: str | None = None) -> tuple[str, ErrorBand] | None:
        """The error band that applies to a prediction on `spec` of a step of `mix`, and its slice (None: not
        validated)."""
        return next(((key, self.bands[key]) for key in band_keys(spec, mix) if key in self.bands), None)

    def band(self, spec: GpuSpec | None = None, mix: str | None = None) -> ErrorBand | None:
        found = self.band_and_key(spec, mix)
        return None if found is None else found[1]

    def basis(self, spec: GpuSpec | None = None, mix: str | None = None) -> str:
        """`predicted (model v3, leave-one-GPU-out, rows of conv nets on gddr GPUs: median error 15.0 %, p90 28.8 %,
        120 rows)`."""
        found = self.band_and_key(spec, mix)
        if found is None:
            return f"predicted (model {self.version}, not validated)"
        key, band = found
        return (f"predicted (model {self.version}, {self.validation}, {describe_band_key(key)}: median error "
                f"{band.median_error_pct:.1f} %, p90 {band.p90_error_pct:.1f} %, {band.rows} rows)")

    def interval(self, samples_per_s: float, spec: GpuSpec, mix: str | None = None) -> tuple[float, float] | None:
        """(low, high) samples/s: the prediction over the 90th and 10th percentiles of predicted/measured
        in the cross-GPU validation's slice that applies (`band_keys`; None: not validated)."""
        band = self.band(spec, mix)
        return None if band is None else (samples_per_s / band.ratio_high, samples_per_s / band.ratio_low)


def band_key(spec: GpuSpec) -> str:
    """Kinds of GPU the validation can tell apart: datacenter HBM parts and GDDR parts."""
    return "hbm" if spec.generation in ("volta", "hopper", "blackwell") or spec.gpu.startswith("A100") else "gddr"


@lru_cache(maxsize=None)
def load_model_file() -> ModelFile:
    data = json.loads(resources.files("bench.data").joinpath(PARAMS_FILE).read_text())
    bands = {key: ErrorBand(**value) for key, value in data["validation"]["bands"].items()}
    projection, scaled = (data["validation"].get(name) for name in ("projection", "model_scaled"))
    return ModelFile(data["version"], SpeedParams(**data["params"]), data["fitted_on"],
                     data["validation"]["name"], bands, None if projection is None else ErrorBand(**projection),
                     None if scaled is None else ErrorBand(**scaled))


def params_json(version: str, params: SpeedParams, fitted_on: str, validation: dict) -> str:
    """The parameter file's text: sorted, rounded, so a re-fit on the same data is the same bytes."""
    rounded = {name: float(f"{value:.6g}") for name, value in asdict(params).items()}
    return json.dumps({"version": version, "fitted_on": fitted_on, "params": rounded, "validation": validation},
                      indent=2, sort_keys=True) + "\n"
