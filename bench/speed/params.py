"""The throughput model's parameter file (`bench/data/speed_params.json`): fitted parameters, their basis,
and the cross-GPU error bands every prediction states. No torch here: `bench plan` reads the bands.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from functools import lru_cache
from importlib import resources

from bench.measure.hardware import GpuSpec, gpu_spec

PARAMS_FILE = "speed_params.json"
FITTED_GENERATIONS = ("volta", "turing", "ada", "hopper")
"""Generations whose tensor-core factor the calibration rows can set (relative to Ampere's, 1)."""
SHARED_GENERATIONS = {"blackwell": "hopper"}
"""A generation whose rows are too few to set a factor of its own takes its family's: Blackwell's are one GPU's
four rows (the B200's), so it shares Hopper's (the datacenter parts after Ampere), and says so."""


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
    gen_hopper: float
    """The same on Hopper, and on Blackwell (`SHARED_GENERATIONS`)."""
    flops_per_sm_half: float
    """FLOPs per SM at which a tensor op reaches half its best efficiency."""
    nchw_half_bytes: float
    """Bytes, as a multiple of its own, a half-precision NCHW convolution's transposes move (time added to its own)."""
    e_grouped_nhwc: float
    """Fraction of the FP32 units' peak a half-precision channels-last grouped convolution reaches."""
    e_memory: float
    """Achievable fraction of the datasheet bandwidth (stream-like kernels reach 80-90 %)."""
    batch_norm_bytes: float
    """A training batch norm's bytes (`batch_norm` ops: forward on the batch's statistics, and backward) as a
    multiple of what it reads and writes once: its kernels read their input twice (1.5-1.7x); the fit may put
    more here (time the recorded bytes miss, which it finds on these ops)."""
    bytes_per_sm_half: float
    """Bytes per SM at which a memory-bound kernel reaches half its bandwidth (occupancy)."""
    l2_speedup: float
    """Bandwidth multiple for an op whose bytes fit in L2."""
    elements_per_lane_cycle: float
    """Output elements of non-tensor work per FP32 lane per clock cycle (lanes: the FP32 peak / 2)."""
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
        generation = SHARED_GENERATIONS.get(generation, generation)
        return getattr(self, f"gen_{generation}") if generation in FITTED_GENERATIONS else 1.0

    def to_vector(self) -> list[float]:
        return [getattr(self, f.name) for f in fields(self)]

    @classmethod
    def from_vector(cls, values: list[float]) -> SpeedParams:
        return cls(*values)


@dataclass(frozen=True)
class ErrorBand:
    """What the validation measured for one kind of prediction: quantiles of predicted / measured over held-out
    predictions (each from a fit that never saw the row's GPU, source or generation)."""

    median_error_pct: float
    p90_error_pct: float
    ratio_low: float
    """Lower percentile of predicted / measured (p10, or wider where `bench.speed.validate.calibrated_quantiles`
    widens a prediction's band so it holds 80 % on GPUs it never saw): the prediction divided by it is the
    interval's top."""
    ratio_high: float
    """Upper percentile of predicted / measured (p90, or wider)."""
    rows: int
    """Held-out residuals the band rests on (a row counts once per held-out scheme that predicted it)."""
    held_out: str = ""
    """Which held-out schemes' residuals were pooled: `leave-one-GPU-out + leave-one-source-out`."""


BAND_MIN_ROWS = 20
"""The fewest held-out residuals a slice of the validation needs to set an interval of its own (`band_keys`)."""
BAND_MIN_GPUS = 2
"""... and the fewest GPUs they come from: a cross-GPU error from one GPU's rows is that GPU's error."""
UNSEEN_GENERATION = "unseen-generation train"
"""The slice of training rows predicted by a fit without any row of their GPU's generation: the band of a GPU
whose generation (Hopper, Blackwell, ...) has no training row, where it is wider than its own slice's."""


def band_keys(spec: GpuSpec | None, mix: str | None = None) -> tuple[str, ...]:
    """The validation slices a prediction's error may come from, narrowest first: its kind of GPU (`band_key`)
    and op mix (`bench.speed.model.mix_of`), then wider ones. Training rows only: a prediction is a training
    step, and inference rows' errors are not its errors. The first slice the validation holds (`BAND_MIN_ROWS`
    residuals or more, of `BAND_MIN_GPUS` GPUs) applies.

    >>> from bench.measure.hardware import gpu_spec
    >>> band_keys(gpu_spec("RTX-4090"), "conv")
    ('gddr conv train', 'gddr train', 'train')
    """
    if spec is None:
        return ("train",)
    kind = band_key(spec)
    narrow = (f"{kind} {mix} train",) if mix else ()
    return (*narrow, f"{kind} train", "train")


def describe_band_key(key: str) -> str:
    """`gddr conv train` -> `training rows of conv nets on gddr GPUs`."""
    if key == UNSEEN_GENERATION:
        return "training rows of a generation the fit never saw"
    words = key.split()
    if words in (["all"], ["train"]):
        return "training rows on all GPUs" if words == ["train"] else "all GPUs"
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
    training_gpus: tuple[str, ...] = ()
    """GPUs with a training row in the fit: a prediction on another GPU says so, and one on a generation none
    of them shares takes the wider of its slice's band and `UNSEEN_GENERATION`'s."""

    def band_and_key(self, spec: GpuSpec | None = None, mix: str | None = None) -> tuple[str, ErrorBand] | None:
        """The error band that applies to a prediction on `spec` of a step of `mix`, and its slice (None: not
        validated). On a GPU whose generation has no training row, the band is the wider of its slice's and
        `UNSEEN_GENERATION`'s at each end."""
        found = next(((key, self.bands[key]) for key in band_keys(spec, mix) if key in self.bands), None)
        unseen = self.bands.get(UNSEEN_GENERATION)
        if found is None or unseen is None or spec is None or not self.generation_unseen(spec):
            return found
        key, band = found
        return key, replace(band, ratio_low=min(band.ratio_low, unseen.ratio_low),
                            ratio_high=max(band.ratio_high, unseen.ratio_high),
                            median_error_pct=max(band.median_error_pct, unseen.median_error_pct),
                            p90_error_pct=max(band.p90_error_pct, unseen.p90_error_pct))

    def generation_unseen(self, spec: GpuSpec) -> bool:
        """True when no training GPU of the fit shares `spec`'s generation (no list stored: not known, False)."""
        return bool(self.training_gpus) and \
            spec.generation not in {gpu_spec(gpu).generation for gpu in self.training_gpus}

    def rests_on(self, spec: GpuSpec | None = None, mix: str | None = None) -> str:
        """What the band stands on, in words: `no training row on H200 (hopper, a generation with none): band from
        training rows on hbm GPUs, n=60, widened to training rows of a generation the fit never saw, n=170`."""
        found = self.band_and_key(spec, mix)
        if found is None:
            return "no band: not validated"
        key, band = found
        plain = self.bands[key]
        where = f"band from {describe_band_key(key)}, n={plain.rows}"
        if spec is None or not self.training_gpus or spec.gpu in self.training_gpus:
            return where if spec is None else f"training rows on {spec.gpu}; {where}"
        if not self.generation_unseen(spec):
            return f"no training row on {spec.gpu}: {where}"
        unseen = self.bands[UNSEEN_GENERATION] if UNSEEN_GENERATION in self.bands else None
        widened = "" if unseen is None else \
            f", widened to {describe_band_key(UNSEEN_GENERATION)}, n={unseen.rows}"
        return f"no training row on {spec.gpu} ({spec.generation}, a generation with none): {where}{widened}"

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
        errors = f"median error {band.median_error_pct:.1f} %, p90 {band.p90_error_pct:.1f} %"
        if band != self.bands[key]:  # widened on an unseen generation: the figures are the wider of two slices'
            return (f"predicted (model {self.version}, {band.held_out or self.validation}: {errors}, the wider of "
                    f"two slices'; 80 % band: {self.rests_on(spec, mix)})")
        return (f"predicted (model {self.version}, {band.held_out or self.validation}, {describe_band_key(key)}: "
                f"{errors}, {band.rows} rows; 80 % band: {self.rests_on(spec, mix)})")

    def interval(self, samples_per_s: float, spec: GpuSpec, mix: str | None = None) -> tuple[float, float] | None:
        """(low, high) samples/s, an 80 % band: the prediction over the upper and lower percentiles of predicted /
        measured in the held-out validation's slice that applies (`band_and_key`; None: not validated)."""
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
                     None if scaled is None else ErrorBand(**scaled),
                     tuple(data["validation"].get("training_gpus", ())))


def params_json(version: str, params: SpeedParams, fitted_on: str, validation: dict) -> str:
    """The parameter file's text: sorted, rounded, so a re-fit on the same data is the same bytes."""
    rounded = {name: float(f"{value:.6g}") for name, value in asdict(params).items()}
    return json.dumps({"version": version, "fitted_on": fitted_on, "params": rounded, "validation": validation},
                      indent=2, sort_keys=True) + "\n"
