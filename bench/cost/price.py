"""Dollars per training run: measured rows x instance catalog x workload -> a priced table.

Pure arithmetic (no files, no clock, no device): numbers in, dataclasses out, like
Lightning's `Throughput`. The GPUs' figures come with the instances and rows (the GPU catalog rows
`bench.measure.hardware` holds), the projections' measured errors as `ProjectionErrors` from the
caller (`bench.planner.rows.projection_errors` reads them off the throughput model's validation).
Every per-GPU speed says how it is known (`basis`):

- `measured`: the row's own samples/s, on an instance with the GPU the row ran on;
- `projected_by_model`: the row's samples/s times the throughput model's predicted ratio between the
  target GPU and the row's own for the row's configuration (Habitat's way: the model predicts what
  changes between the GPUs, the measurement keeps what it got right on its own). Needs the row's
  `model_speeds` (`bench.planner.rows.with_model_speeds` looks them up); it carries the error of that
  projection across pairs of public rows on two GPUs (`bench.speed.validate.model_scaled_pairs`);
- `projected_from_gpu`: where the configuration cannot be traced or the model has no speed for one
  of the two GPUs, the row's MFU times the target GPU's datasheet dense peak for the row's
  precision, over the row's model FLOPs per sample. It assumes the MFU carries over; the
  assumption names the peak and memory-bandwidth ratios between the two GPUs, and the error and
  interval of that assumption across the same pairs (`bench.speed.validate.projection_band`),
  several times the model's;
- `projected_from_cpu_profile`: the same arithmetic from a row measured on a CPU at its
  profile's reduced size. Refused unless asked for, and labelled: never a GPU measurement;
- `predicted`: a row of the throughput model (`bench predict`, status `predicted`), one per GPU,
  priced only on instances with that GPU; its line says the model's version and validation error.

A multi-GPU instance runs data parallel, each GPU running the measured configuration
(global batch = effective_batch x GPUs): its samples/s = per-GPU x GPUs x scaling efficiency.
The efficiency is measured where the rows have it (a DDP row of the same configuration,
world_size > 1: `scaling_for`), else predicted from the instance's interconnect where the row has its
gradient bytes (`bench.speed.ddp`), else the `Assumptions` default; every line says which.
Memory fit: the row's peak (CUDA reserved when present, else `peak_memory_bytes`) plus
headroom against the GPU's nominal memory; what does not fit is marked and not priced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Iterable, Literal, Mapping

from bench.cost.catalog import Instance
from bench.cost.feeding import Feeding, LoaderCost, feeding, loader_cost_for
from bench.frames import Tabular
from bench.grid.cell import Cell
from bench.grid.model_ref import runs_code
from bench.measure.hardware import GpuSpec, find_gpu
from bench.measure.utilization import samples_per_s_at
from bench.memory.fit import DEFAULT_HEADROOM, MemoryFit, memory_fit
from bench.results.keys import Key, configuration_key, key_columns, varying
from bench.speed.ddp import predicted_efficiency
from bench.train.imagenet_like import IMAGENET_TRAIN
from bench.units import GIB, gib, percent, tflop_per_s

if TYPE_CHECKING:  # the throughput model imports torch; pricing does not
    from bench.speed.params import ErrorBand

SECONDS_PER_HOUR = 3600
LABELLED = ("model", "image_size", "precision", "checkpointing", "optimizer", "micro_batch", "accum_steps")
"""The configuration columns a strategy label (and a plan option's) names; the others are its variant."""
STRATEGY = ("micro_batch", "accum_steps", "precision", "checkpointing", "optimizer")
"""The configuration columns `MeasuredRow.strategy` names; a cost table's label adds any other its rows differ in."""

Basis = Literal["measured", "projected_by_model", "projected_from_gpu", "projected_from_cpu_profile", "predicted"]
Status = Literal["priced", "does_not_fit", "no_peak", "no_mfu"]


@dataclass(frozen=True, kw_only=True)
class Workload:
    """What one training run processes.

    Example:
        >>> Workload().samples_per_run
        115305030.0
    """

    dataset_size: int = IMAGENET_TRAIN.images
    """Training samples per epoch (default: the ImageNet-1k train split, `bench.train.imagenet_like`)."""
    epochs: float = 90
    """Passes over the dataset."""

    def __post_init__(self) -> None:
        if self.dataset_size <= 0 or self.epochs <= 0:
            raise ValueError(f"workload: dataset_size and epochs must be positive, "
                             f"got {self.dataset_size} and {self.epochs}")

    @property
    def samples_per_run(self) -> float:
        return float(self.dataset_size * self.epochs)

    def describe(self) -> str:
        """`1,281,167 samples x 90 epochs`."""
        return f"{self.dataset_size:,} samples x {self.epochs:g} epochs"


@dataclass(frozen=True, kw_only=True)
class Assumptions:
    """The knobs of a cost estimate that are not measurements."""

    scaling_efficiency: float = 0.9
    """Multi-GPU samples/s as a fraction of per-GPU samples/s x GPUs (1.0: perfect scaling)."""
    headroom: float = DEFAULT_HEADROOM
    """Memory kept free above the measured peak, as a fraction of the peak."""
    allow_cpu_projection: bool = False
    """Project CPU-profile rows to GPUs (labelled `projected_from_cpu_profile`) instead of refusing."""

    def __post_init__(self) -> None:
        if not 0 < self.scaling_efficiency <= 1:
            raise ValueError(f"scaling_efficiency must be in (0, 1], got {self.scaling_efficiency}")
        if self.headroom < 0:
            raise ValueError(f"headroom must be >= 0, got {self.headroom}")


class _Column:
    """A runs row's column read as an attribute of `MeasuredRow`: the row's value; where the row has none (empty, or
    a row built without it), an axis's grid default, else `empty`."""

    def __init__(self, empty: object = None) -> None:
        self.empty = empty

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, measured: MeasuredRow | None, owner: type) -> object:
        if measured is None:
            return self
        if self.name in key_columns():
            return measured.axes[self.name]
        value = measured.row.get(self.name)
        return self.empty if value is None else value


@dataclass(frozen=True)
class MeasuredRow:
    """A runs row that carries a speed, read as cost arithmetic reads it: status ok (measured), or predicted (a
    `bench predict` row, or a plan option of the throughput model). `row` is the row as
    `bench.results.read.records` gives it (None where a field is empty); the columns cost arithmetic reads are
    attributes (`_Column`), the figures derived from several columns properties.

    >>> MeasuredRow({"cell_id": "c", "status": "oom"})
    Traceback (most recent call last):
    ...
    ValueError: c: status oom, only ok and predicted rows carry a speed
    """

    row: Mapping[str, object]
    model_speeds: tuple[tuple[str, float], ...] = ()
    """(GPU, samples/s) the throughput model predicts for this configuration on each catalog GPU, the measuring GPU
    among them (`bench.speed.predict.model_speeds`): a GPU row's line on another GPU scales by their ratio.
    (): not traced (a CPU row, or a model the trace cannot run)."""

    cell_id = _Column()
    experiment = _Column()
    profile = _Column()
    model = _Column()
    image_size = _Column()
    micro_batch = _Column()
    accum_steps = _Column()
    precision = _Column()
    checkpointing = _Column()
    optimizer = _Column()
    world_size = _Column()
    """Processes the row was measured on (DDP); rows with more than one measure scaling, not speed."""
    ddp_sync = _Column()
    input = _Column()
    """Where the row's micro-batches came from; a loader row's speed includes this host's input pipeline."""
    device_type = _Column()
    device_name = _Column()
    samples_per_s = _Column()
    mfu_pct = _Column()
    model_flops_per_sample = _Column()
    peak_memory_bytes = _Column()
    peak_reserved_bytes = _Column()
    memory_source = _Column("")
    scaling_efficiency = _Column()
    """Global samples/s over world_size x the 1-process row's, measured (world_size > 1)."""
    speed_basis = _Column("")
    """A predicted row's basis in words: `predicted (model v3, leave-one-GPU-out, rows of conv nets on gddr GPUs:
    median error 15.0 %, p90 28.8 %, 120 rows)`: the cross-GPU error of its kind of GPU and op mix."""
    grads_bytes = _Column()
    """Gradient storage of one replica (what DDP all-reduces): with it, a multi-GPU instance whose interconnect
    is known scales as `bench.speed.ddp` predicts instead of at the assumed efficiency."""

    def __post_init__(self) -> None:
        if self.row.get("status") not in ("ok", "predicted"):
            raise ValueError(f"{self.row.get('cell_id')}: status {self.row.get('status')}, only ok and predicted rows "
                             "carry a speed")

    @cached_property
    def axes(self) -> dict[str, object]:
        """The row's configuration (`key`) by column: every axis and the split."""
        return dict(self.key())

    def with_columns(self, **columns: object) -> MeasuredRow:
        """This row with `columns` changed (its model speeds kept)."""
        return MeasuredRow({**self.row, **columns}, self.model_speeds)

    @property
    def predicted_gpu(self) -> str | None:
        """A predicted row's GPU (catalog key): its speed holds on that GPU only. None: a measured row."""
        return self.row.get("gpu") if self.row["status"] == "predicted" else None

    @property
    def speed_interval(self) -> tuple[float, float] | None:
        """(low, high) samples/s: a predicted row's 80 % band of its error (`samples_per_s_low`, `_high`), a measured
        row's 95 % interval of its median step (`step_time_ci95_low_ms`, `_high_ms`); None where the row has none."""
        if self.predicted_gpu is not None:
            low, high = self.row.get("samples_per_s_low"), self.row.get("samples_per_s_high")
            return None if low is None or high is None else (low, high)
        slow, fast = self.row.get("step_time_ci95_high_ms"), self.row.get("step_time_ci95_low_ms")
        if not slow or not fast:
            return None
        return self.effective_batch * 1e3 / slow, self.effective_batch * 1e3 / fast

    @property
    def effective_batch(self) -> int:
        return self.micro_batch * self.accum_steps

    @property
    def interval_basis(self) -> str:
        """What `speed_interval` is, in words."""
        return "80 % band of that error" if self.predicted_gpu else "95 % interval of the measured median step"

    def key(self, ignore: Iterable[str] = ()) -> Key:
        """The row's configuration key (`bench.results.keys`), less `ignore`: every axis, those without an attribute
        here too (channels_last, attention, ...), at its grid default where the row has none."""
        return configuration_key(self.row, ignore)

    @property
    def configuration(self) -> Key:
        """What a scaling measurement must share with a row to stand for it (the device and world size aside)."""
        return self.key(ignore=("world_size", "ddp_sync"))

    @property
    def strategy(self) -> str:
        """`128x1 bf16 ckpt-off adamw`: micro-batch x accumulation, precision, checkpointing, optimizer."""
        return (f"{self.micro_batch}x{self.accum_steps} {self.precision} "
                f"ckpt-{self.checkpointing} {self.optimizer}")

    @property
    def on_cpu(self) -> bool:
        """Measured on a CPU (its profile's reduced size), not on a GPU."""
        return self.device_type != "cuda" or self.profile == "cpu"

    @property
    def measured_gpu(self) -> GpuSpec | None:
        """The GPU catalog row of the device that measured this row; None on a CPU, an unknown GPU or a prediction."""
        return None if self.on_cpu or self.predicted_gpu else find_gpu(self.device_name)

    @property
    def projectable_by_model(self) -> bool:
        """A one-process synthetic-input row measured on a catalog GPU: its speed can be carried to another GPU by
        the model's ratio between the two (`model_speeds`). Not a model named as code: a runs file is data, and
        tracing the model would run the code it names, which nobody asked for here."""
        return (self.measured_gpu is not None and self.world_size == 1 and self.input == "synthetic"
                and not runs_code(self.model))

    def cell(self) -> Cell:
        """The row's configuration as a cell to trace (one warm-up and one measured step: the trace runs neither)."""
        return Cell(experiment=self.experiment, profile="cuda", warmup_steps=1, measured_steps=1, **dict(self.key()))

    def serves(self, gpu: str) -> bool:
        """Whether the row's speed can be priced on `gpu`: a predicted row only on its own GPU."""
        return self.predicted_gpu is None or self.predicted_gpu == gpu

    def memory_peak(self) -> tuple[int, str]:
        """(bytes, what they are): CUDA reserved when present, else `peak_memory_bytes`."""
        if self.memory_source.startswith("estimate"):
            return (self.peak_reserved_bytes or self.peak_memory_bytes,
                    "estimated (fake-tensor trace, bench estimate; reserved: the caching allocator replayed)")
        if self.peak_reserved_bytes is not None:
            return self.peak_reserved_bytes, "cuda_reserved (max_memory_reserved)"
        if self.memory_source == "tracked_tensors":
            return self.peak_memory_bytes, "tracked_tensors (CPU MemTracker peak; no CUDA allocator or context)"
        return self.peak_memory_bytes, self.memory_source or "peak_memory_bytes"


@dataclass(frozen=True)
class RunCost:
    """Time and price of one run on one instance."""

    samples_per_s: float
    """The whole instance: per-GPU x GPUs x scaling efficiency (when GPUs > 1)."""
    hours_per_run: float
    usd_per_run: float
    spot_usd_per_run: float | None
    """None when the catalog has no spot price."""


def run_cost(*, samples_per_run: float, samples_per_s_per_gpu: float, gpu_count: int,
             scaling_efficiency: float, usd_per_hour: float, spot_usd_per_hour: float | None = None) -> RunCost:
    """Hours and dollars for `samples_per_run` samples on an instance with `gpu_count` GPUs.

    Seed 002's arithmetic: 17.8 h on one A100, spread over a p4d.24xlarge's 8 GPUs at
    $32.77/h with perfect scaling, is 2.2 h and about $73:
        >>> c = run_cost(samples_per_run=1.0, samples_per_s_per_gpu=1 / (17.8 * 3600), gpu_count=8,
        ...              scaling_efficiency=1.0, usd_per_hour=32.77)
        >>> round(c.hours_per_run, 3), round(c.usd_per_run)
        (2.225, 73)
    """
    efficiency = scaling_efficiency if gpu_count > 1 else 1.0
    instance_samples_per_s = samples_per_s_per_gpu * gpu_count * efficiency
    hours = samples_per_run / instance_samples_per_s / SECONDS_PER_HOUR
    spot = None if spot_usd_per_hour is None else hours * spot_usd_per_hour
    return RunCost(instance_samples_per_s, hours, hours * usd_per_hour, spot)


MeasuredScaling = Mapping[tuple, Mapping[int, MeasuredRow]]
"""Data-parallel rows with a measured efficiency, by configuration, then by world size."""


@dataclass(frozen=True)
class Scaling:
    """The scaling efficiency a multi-GPU line runs at, and how it is known."""

    efficiency: float
    basis: str


def measured_scaling(rows: list[MeasuredRow]) -> dict[tuple, dict[int, MeasuredRow]]:
    """The rows that measured scaling on GPUs: world_size > 1, `no_sync` (the correct loop), efficiency present.

    A CPU's data-parallel rows (gloo ranks sharing one machine's cores) say nothing of NVLink or
    InfiniBand between GPUs: never applied to GPU instances, where the assumed default stands.
    """
    found: dict[tuple, dict[int, MeasuredRow]] = {}
    for row in rows:
        if row.on_cpu:
            continue
        if row.world_size > 1 and row.ddp_sync == "no_sync" and row.scaling_efficiency is not None:
            found.setdefault(row.configuration, {})[row.world_size] = row
    return found


def scaling_for(row: MeasuredRow, gpu_count: int, measured: MeasuredScaling, default: float,
                instance: Instance | None = None, accum_steps_per_gpu: int | None = None) -> Scaling:
    """The efficiency of `row`'s configuration on `gpu_count` GPUs: measured at that count, else at the
    largest measured count below it (labelled as such), else predicted from `instance`'s interconnect
    (`bench.speed.ddp`, when the row has its gradient bytes and the instance is in
    `bench/data/interconnects.csv`; at `accum_steps_per_gpu` micro-steps per optimizer step, default the
    row's own), else `default` (assumed).

    Example: measured 0.94 on 2 processes, asked for 8 GPUs:
        >>> row = MeasuredRow(dict(status="ok", cell_id="c", experiment="e", profile="cuda", model="m", image_size=224,
        ...     micro_batch=64, accum_steps=2, precision="bf16", checkpointing="off", optimizer="adamw",
        ...     device_type="cuda", device_name="NVIDIA H200", samples_per_s=1.0, mfu_pct=None,
        ...     model_flops_per_sample=None, peak_memory_bytes=1, world_size=2, scaling_efficiency=0.94))
        >>> scaling_for(row, 8, measured_scaling([row]), 0.9)
        Scaling(efficiency=0.94, basis='measured with 2 processes on NVIDIA H200, applied to 8 GPUs')
    """
    by_size = measured.get(row.configuration, {})
    below = [size for size in by_size if size <= gpu_count]
    if not below:
        predicted = _interconnect_scaling(row, gpu_count, instance, accum_steps_per_gpu or row.accum_steps)
        return predicted or Scaling(default, "assumed (--scaling-efficiency)")
    size = max(below)
    source = by_size[size]
    applied = "" if size == gpu_count else f", applied to {gpu_count} GPUs"
    return Scaling(source.scaling_efficiency, f"measured with {size} processes on {source.device_name}{applied}")


def _interconnect_scaling(row: MeasuredRow, gpu_count: int, instance: Instance | None,
                          accum_steps: int) -> Scaling | None:
    if instance is None or not row.grads_bytes or row.samples_per_s <= 0:
        return None
    micro_step_s = row.micro_batch / row.samples_per_s
    predicted = predicted_efficiency(step_s=micro_step_s * accum_steps, micro_step_s=micro_step_s,
                                     grads_bytes=row.grads_bytes, gpus=gpu_count, provider=instance.provider,
                                     instance=instance.instance)
    return None if predicted is None else Scaling(round(predicted[0], 4), predicted[1])


@dataclass(frozen=True)
class GpuSpeed:
    """Per-GPU samples/s of a row on a GPU, and how it is known."""

    samples_per_s: float
    basis: Basis
    assumption: str
    interval: tuple[float, float] | None = None
    """(low, high) per-GPU samples/s: a prediction's or projection's validated error, a measurement's 95 % interval."""
    interval_basis: str = ""
    """What `interval` is, in words."""
    error: str = ""
    """A projection's error across public pairs of GPUs, in words ("" for any other basis, or none measured)."""


@dataclass(frozen=True)
class ProjectionErrors:
    """What the two projections from a GPU row have missed by across public pairs of rows on two GPUs (`bench predict
    --validate`, kept in the throughput model's parameter file): the caller passes them in, so pricing reads no file.
    None: not measured (the projection then states no error and no interval)."""

    model_scaled: ErrorBand | None = None
    """`projected_by_model`: measured speed x the model's ratio between the two GPUs."""
    mfu_carried: ErrorBand | None = None
    """`projected_from_gpu`: the measured MFU carried over to the other GPU's datasheet peak."""

    def band(self, basis: Basis) -> tuple[ErrorBand | None, str]:
        """(the band, what the projection is) for a projection's basis; (None, "") for any other."""
        if basis == "projected_by_model":
            return self.model_scaled, "measured speed x the model's ratio between the two GPUs"
        if basis == "projected_from_gpu":
            return self.mfu_carried, "measured MFU carried over"
        return None, ""

    def describe(self, basis: Basis) -> str:
        """What the projection of `basis` has missed by in public rows; "" for any other basis, or one not measured."""
        band, what = self.band(basis)
        return ("" if band is None else f"{what}: across {band.rows} pairs of public rows on two GPUs, "
                f"median error {band.median_error_pct:.1f} %, p90 {band.p90_error_pct:.1f} %")

    def interval(self, basis: Basis, samples_per_s: float) -> tuple[float, float] | None:
        """The band's p10-p90 around a projected speed; None where there is no band."""
        band, _ = self.band(basis)
        return None if band is None else (samples_per_s / band.ratio_high, samples_per_s / band.ratio_low)


def gpu_speed(row: MeasuredRow, gpu: GpuSpec,
              errors: ProjectionErrors = ProjectionErrors()) -> GpuSpeed | tuple[Status, str]:
    """The row's per-GPU samples/s on `gpu`, or (status, why not) when there is no honest number; a projection
    carries its error and interval from `errors`.

    Example: a row measured on an A100-40GB at 40 % MFU, projected to an H100 (same MFU):
        >>> from bench.measure.hardware import gpu_spec
        >>> row = MeasuredRow(dict(status="ok", cell_id="c", experiment="e", profile="cuda", model="m", image_size=224,
        ...     micro_batch=128, accum_steps=1, precision="bf16", checkpointing="off", optimizer="adamw",
        ...     device_type="cuda", device_name="NVIDIA A100-SXM4-40GB", samples_per_s=5073.2,
        ...     mfu_pct=40.0, model_flops_per_sample=24.6e9, peak_memory_bytes=2**34))
        >>> speed = gpu_speed(row, gpu_spec("H100-80GB"))
        >>> speed.basis, round(speed.samples_per_s)
        ('projected_from_gpu', 16081)
    """
    if row.predicted_gpu is not None:
        if row.predicted_gpu != gpu.gpu:
            return "no_peak", f"predicted for {row.predicted_gpu}, not {gpu.gpu}"
        return GpuSpeed(row.samples_per_s, "predicted", row.speed_basis or "predicted", row.speed_interval,
                        row.interval_basis)
    measured = row.measured_gpu
    if measured is not None and measured.gpu == gpu.gpu:
        return GpuSpeed(row.samples_per_s, "measured", f"measured on {row.device_name}", row.speed_interval,
                        row.interval_basis)
    scaled = _model_scaled(row, measured, gpu, errors)
    if scaled is not None:
        return scaled
    peak = gpu.peak_flops_per_s(row.precision)
    if peak is None:
        return "no_peak", f"{gpu.gpu} datasheet has no {row.precision} peak: no projection"
    if row.mfu_pct is None or not row.model_flops_per_sample:
        return "no_mfu", f"row has no MFU ({row.device_name} has no known peak): no projection"
    samples_per_s = samples_per_s_at(row.mfu_pct, row.model_flops_per_sample, peak)
    target = f"{gpu.gpu}'s {row.precision} datasheet peak {tflop_per_s(peak)}"
    if row.on_cpu and row.precision == "fp16":
        return "no_mfu", (f"fp16 on a CPU ({row.device_name}) runs without fp16 arithmetic units (emulated, often "
                          "30x slower than fp32): its MFU says nothing about a GPU's fp16 tensor cores; no projection")
    if row.on_cpu:
        return GpuSpeed(samples_per_s, "projected_from_cpu_profile",
                        f"NOT a GPU measurement: MFU {row.mfu_pct:.1f}% (of a measured matmul peak) on a CPU ({row.device_name}) "
                        f"at the CPU profile's reduced size ({row.image_size} px, effective batch "
                        f"{row.effective_batch}) applied to {target}")
    return _projected("projected_from_gpu", samples_per_s, errors,
                      f"projection: MFU {row.mfu_pct:.1f}% measured on {measured.gpu if measured else row.device_name} "
                      f"assumed to carry over to {target}{_ratios(measured, gpu, row.precision)}")


def _model_scaled(row: MeasuredRow, measured: GpuSpec | None, gpu: GpuSpec,
                  errors: ProjectionErrors) -> GpuSpeed | None:
    """The row's speed times the model's predicted ratio of `gpu` to the measuring GPU; None without both."""
    speeds = dict(row.model_speeds)
    if measured is None or measured.gpu not in speeds or gpu.gpu not in speeds:
        return None
    ratio = speeds[gpu.gpu] / speeds[measured.gpu]
    return _projected("projected_by_model", row.samples_per_s * ratio, errors,
                      f"projection: {row.samples_per_s:,.1f} samples/s measured on {measured.gpu} x {ratio:.3g}, the "
                      f"throughput model's predicted ratio of {gpu.gpu} to {measured.gpu} for this configuration")


def _projected(basis: Basis, samples_per_s: float, errors: ProjectionErrors, how: str) -> GpuSpeed:
    """A projection from a GPU row: how it was made, then its error across public pairs of GPUs and that error's
    p10-p90 as its interval."""
    error = errors.describe(basis)
    return GpuSpeed(samples_per_s, basis, how + (f"; {error}" if error else ""),
                    errors.interval(basis, samples_per_s), "p10-p90 of that error", error)


def _ratios(measured: GpuSpec | None, target: GpuSpec, precision: str) -> str:
    measured_peak = measured.peak_flops_per_s(precision) if measured else None
    if measured is None or not measured_peak:
        return ""
    text = f" ({target.peak_flops_per_s(precision) / measured_peak:.2f}x the peak"
    if measured.memory_bandwidth_gb_per_s and target.memory_bandwidth_gb_per_s:
        text += f", {target.memory_bandwidth_gb_per_s / measured.memory_bandwidth_gb_per_s:.2f}x the memory bandwidth"
    return text + f" of {measured.gpu})"


@dataclass(frozen=True, kw_only=True)
class CostLine:
    """One measured row on one instance: priced, or marked with why not."""

    row: MeasuredRow
    instance: Instance
    status: Status
    note: str
    """How the speed is known (basis and assumption), or why the line is not priced."""
    basis: Basis | None
    samples_per_s_per_gpu: float | None
    memory: MemoryFit
    memory_basis: str
    cost: RunCost | None
    scaling: Scaling | None = None
    """The scaling efficiency used on a multi-GPU instance; None on one GPU."""
    speed_interval: tuple[float, float] | None = None
    """(low, high) per-GPU samples/s (`GpuSpeed.interval`)."""
    interval_basis: str = ""
    """What `speed_interval` is, in words."""
    accum_steps_per_gpu: int | None = None
    """Micro-steps each GPU runs per optimizer step on this line (None: the row's own accumulation)."""
    speed_error: str = ""
    """A projected speed's error across public pairs of GPUs, in words (`GpuSpeed.error`)."""

    @property
    def accum_steps(self) -> int:
        """Micro-steps each GPU runs per optimizer step on this line: `accum_steps_per_gpu`, else the row's."""
        return self.accum_steps_per_gpu or self.row.accum_steps

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step across the instance: micro-batch x this line's accumulation x GPUs.

        >>> row = MeasuredRow(dict(status="ok", cell_id="c", experiment="e", profile="cuda", model="m", image_size=224,
        ...     micro_batch=256, accum_steps=16, precision="bf16", checkpointing="off", optimizer="adamw",
        ...     device_type="cuda", device_name="NVIDIA H100 80GB HBM3", samples_per_s=1.0, mfu_pct=None,
        ...     model_flops_per_sample=None, peak_memory_bytes=1))
        >>> from bench.cost.catalog import load_catalog
        >>> (p5,) = [i for i in load_catalog().select() if i.instance == "p5.48xlarge"]
        >>> price_line(row, p5, Workload(), Assumptions(), accum_steps_per_gpu=2).global_batch
        4096
        """
        return self.row.micro_batch * self.accum_steps * self.instance.gpu_count

    def over_speed_range(self, amount: float) -> tuple[float, float] | None:
        """`amount` (hours or dollars per run: inversely proportional to the speed) at the fast and the slow end of
        `speed_interval`; None without one."""
        if self.speed_interval is None:
            return None
        low, high = self.speed_interval
        return amount * self.samples_per_s_per_gpu / high, amount * self.samples_per_s_per_gpu / low


def price_line(row: MeasuredRow, instance: Instance, workload: Workload, assumptions: Assumptions,
               measured: MeasuredScaling | None = None, accum_steps_per_gpu: int | None = None,
               errors: ProjectionErrors = ProjectionErrors()) -> CostLine:
    """`row` on `instance`: memory fit first, then speed, then hours and dollars.

    `measured`: scaling efficiencies measured by data-parallel rows (`measured_scaling`).
    `accum_steps_per_gpu`: micro-steps each GPU runs per optimizer step where the caller splits the row's
    effective batch over the GPUs (`bench plan`); default the row's own accumulation.
    `errors`: what a projection from a GPU row has missed by in public rows (default: not known).
    """
    peak_bytes, memory_basis = row.memory_peak()
    fit = memory_fit(peak_bytes, assumptions.headroom, instance.gpu_spec.memory_gib)
    speed = gpu_speed(row, instance.gpu_spec, errors)
    scaling = (scaling_for(row, instance.gpu_count, measured or {}, assumptions.scaling_efficiency, instance,
                           accum_steps_per_gpu)
               if instance.gpu_count > 1 else None)
    common = dict(row=row, instance=instance, memory=fit, memory_basis=memory_basis, scaling=scaling,
                  accum_steps_per_gpu=accum_steps_per_gpu)
    if isinstance(speed, tuple):
        status, why = speed
        return CostLine(**common, status=status, note=why, basis=None, samples_per_s_per_gpu=None, cost=None)
    note = speed.assumption
    if scaling is not None:
        note += (f"; x{instance.gpu_count} GPUs at {scaling.efficiency:.3g} scaling efficiency, {scaling.basis} "
                 f"(data parallel, global batch "
                 f"{row.micro_batch * (accum_steps_per_gpu or row.accum_steps) * instance.gpu_count})")
    if not fit.fits:
        return CostLine(**common, status="does_not_fit", basis=speed.basis, samples_per_s_per_gpu=speed.samples_per_s,
                        note=f"does not fit: needs {gib(fit.required_bytes, 1)} ({memory_basis} "
                             f"+ {percent(assumptions.headroom)} headroom), {instance.gpu} has "
                             f"{gib(fit.capacity_bytes, None)}", cost=None)
    cost = run_cost(samples_per_run=workload.samples_per_run, samples_per_s_per_gpu=speed.samples_per_s,
                    gpu_count=instance.gpu_count, scaling_efficiency=scaling.efficiency if scaling else 1.0,
                    usd_per_hour=instance.usd_per_hour, spot_usd_per_hour=instance.spot_usd_per_hour)
    return CostLine(**common, status="priced", note=note, basis=speed.basis,
                    samples_per_s_per_gpu=speed.samples_per_s, cost=cost, speed_interval=speed.interval,
                    interval_basis=speed.interval_basis, speed_error=speed.error)


@dataclass(frozen=True)
class Refusal:
    """A row left out of the whole table, and why."""

    row: MeasuredRow
    reason: str


@dataclass(frozen=True)
class CostTable(Tabular):
    """Every (row, instance) line, the rows refused outright, and what the numbers assume."""

    lines: tuple[CostLine, ...]
    refused: tuple[Refusal, ...]
    workload: Workload
    assumptions: Assumptions
    instances: tuple[Instance, ...] = ()
    """The instances every row was offered to (a line per row and instance whose GPU it serves)."""
    catalog: str = ""
    """The instance catalog priced, in words (its file, which prices, which providers)."""
    loader_costs: tuple[LoaderCost, ...] = ()
    """The loader rows' CPU cost per sample that sizes the cores feeding each line (empty: none found)."""
    loader_source: str = ""
    """Where those loader rows were looked for."""
    priced: tuple[CostLine, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "priced", tuple(line for line in self.lines if line.status == "priced"))

    @property
    def oldest_price_observed(self) -> str | None:
        """The oldest `observed` date among the prices actually used; None if nothing was priced."""
        return min((line.instance.observed for line in self.priced), default=None)

    @cached_property
    def variant_axes(self) -> tuple[str, ...]:
        """The configuration columns beyond `STRATEGY` that the table's rows differ in (model, channels_last ...)."""
        return tuple(name for name in varying(line.row.key() for line in self.lines) if name not in STRATEGY)

    def strategy(self, row: MeasuredRow) -> str:
        """`row`'s label in this table: `128x1 bf16 ckpt-off adamw`, then the value of each of `variant_axes`
        (`... channels_last=False`), so two rows apart in any axis never share a label."""
        key = dict(row.key())
        return " ".join([row.strategy, *(f"{name}={key[name]}" for name in self.variant_axes)])

    def frame_rows(self) -> list[dict]:
        """Every line as cost.csv writes it (`to_frame()`, and the table a notebook shows)."""
        return [record(line, self.workload.samples_per_run, strategy=self.strategy(line.row)) for line in self.lines]


@dataclass(frozen=True)
class NotPriced:
    """Why a row is priced on no instance at all: `label` counts it among a plan's rows left out, `reason` says it
    in cost.md."""

    label: str
    reason: str


def not_priced(row: MeasuredRow, assumptions: Assumptions) -> NotPriced | None:
    """The one rule for which rows `bench cost` and `bench plan` price: None for a row they do.

    >>> row = MeasuredRow(dict(status="ok", cell_id="c", experiment="e", profile="cpu", model="m", image_size=32,
    ...     micro_batch=4, accum_steps=4, precision="fp32", checkpointing="off", optimizer="adamw", device_type="cpu",
    ...     device_name="Some CPU", samples_per_s=40.0, mfu_pct=2.0, model_flops_per_sample=1e9, peak_memory_bytes=1))
    >>> not_priced(row, Assumptions()).label, not_priced(row, Assumptions(allow_cpu_projection=True))
    ('CPU-profile rows, not projected to GPUs (--allow-cpu-projection)', None)
    """
    if row.world_size > 1:
        return NotPriced("data-parallel rows (their measured scaling efficiency is used instead)",
                         "data-parallel row (world_size > 1): its measured scaling efficiency prices the 1-process "
                         "row of the same configuration on multi-GPU instances")
    if row.input != "synthetic":
        return NotPriced("loader-input rows (their CPU cost per sample sizes the feeding instead)",
                         "loader-input row: its speed includes the measuring host's input pipeline; the synthetic row "
                         "of the configuration is priced, and the loader's CPU cost per sample says how many cores "
                         "feed it")
    if row.on_cpu and not assumptions.allow_cpu_projection:
        return NotPriced("CPU-profile rows, not projected to GPUs (--allow-cpu-projection)",
                         f"CPU-profile row (measured on a CPU, {row.device_name}, at {row.image_size} px, effective "
                         f"batch {row.effective_batch}); a GPU price from it would be a projection, not a GPU "
                         "measurement, so it is not priced unless CPU projection is allowed (--allow-cpu-projection)")
    return None


def price_rows(rows: list[MeasuredRow], instances: tuple[Instance, ...], workload: Workload,
               assumptions: Assumptions, errors: ProjectionErrors = ProjectionErrors()) -> CostTable:
    """Every row on every instance (`errors`: as `price_line` takes them).

    Example (a made-up row measured on an L4, priced on AWS's g6.xlarge):
        >>> from bench.cost.catalog import load_catalog
        >>> row = MeasuredRow(dict(status="ok", cell_id="c", experiment="e", profile="cuda", model="m", image_size=224,
        ...     micro_batch=64, accum_steps=2, precision="bf16", checkpointing="off", optimizer="adamw",
        ...     device_type="cuda", device_name="NVIDIA L4", samples_per_s=400.0, mfu_pct=8.1,
        ...     model_flops_per_sample=24.6e9, peak_memory_bytes=10 * 2**30))
        >>> g6 = [i for i in load_catalog().select() if i.instance == "g6.xlarge"]
        >>> line, = price_rows([row], tuple(g6), Workload(), Assumptions()).priced
        >>> line.basis, round(line.cost.hours_per_run, 1), round(line.cost.usd_per_run, 2)
        ('measured', 80.1, 64.44)
    """
    lines: list[CostLine] = []
    refused: list[Refusal] = []
    measured = measured_scaling(rows)
    for row in rows:
        refusal = not_priced(row, assumptions)
        if refusal is not None:
            refused.append(Refusal(row, refusal.reason))
            continue
        lines.extend(price_line(row, instance, workload, assumptions, measured, errors=errors) for instance in instances
                     if row.serves(instance.gpu))
    return CostTable(tuple(lines), tuple(refused), workload, assumptions, instances=tuple(instances))


# One priced line as one row: the columns of cost.csv, the row (`record`, also `bench cost`'s and `bench plan`'s
# JSON and `CostTable.to_frame()`), and the cores the line's instance needs to feed its GPUs.

# The header of cost.csv comes from this list. Units are in the names.
COLUMNS: dict[str, str] = {
    "experiment": "", "cell_id": "the measured row", "model": "", "image_size": "pixels, as measured",
    "strategy": "micro_batch x accum_steps, precision, checkpointing, optimizer; then axis=value for any other axis "
                "the priced rows differ in (channels_last=True ...)",
    "micro_batch": "per GPU", "accum_steps_per_gpu": "micro-steps each GPU runs per optimizer step on this line",
    "effective_batch_per_gpu": "micro_batch x accum_steps_per_gpu",
    "measured_accum_steps": "the row's accumulation, as measured (differs from accum_steps_per_gpu where a plan "
                            "re-splits the effective batch over the instance's GPUs)",
    "precision": "", "checkpointing": "", "optimizer": "",
    "profile": "cuda or cpu (a CPU-profile row was measured at reduced size on a CPU)",
    "measured_device": "device_name of the row",
    "provider": "", "instance": "", "region": "", "gpu": "", "gpu_count": "",
    "global_batch": "effective_batch_per_gpu x gpu_count: samples per optimizer step across the instance",
    "status": "priced | does_not_fit | no_peak (no datasheet peak for the precision) | no_mfu",
    "basis": "measured | projected_by_model (measured x the model's ratio between the GPUs) | projected_from_gpu "
             "(measured MFU carried over) | projected_from_cpu_profile | predicted (the throughput model)",
    "note": "how the speed is known and what it assumes, or why the line is not priced",
    "samples_per_s_per_gpu": "measured; measured x the model's predicted ratio of this GPU to the measuring one; "
                             "MFU x the GPU's peak / model FLOPs per sample; or predicted",
    "samples_per_s_per_gpu_low": "the p10-p90 range of a predicted or projected speed's validated cross-GPU error "
                                 "(docs/speed/validation.md), or a measured speed's 95 % interval of its median "
                                 "step; empty where neither is known (a CPU-profile projection)",
    "samples_per_s_per_gpu_high": "",
    "samples_per_s_instance": "per GPU x GPUs x scaling efficiency (GPUs > 1)",
    "scaling_efficiency": "the efficiency used on a multi-GPU instance; empty on one GPU",
    "scaling_basis": "measured with N processes on a device (a DDP row of the configuration) | assumed",
    "memory_basis": "which peak the fit uses",
    "peak_memory_gib": "that peak, GiB (2**30 bytes)",
    "required_memory_gib": "peak x (1 + headroom)",
    "gpu_memory_gib": "the GPU's nominal memory",
    "samples_per_run": "dataset_size x epochs",
    "hours_per_run": "", "usd_per_hour": "on-demand, whole instance", "usd_per_run": "on-demand",
    "usd_per_run_low": "on-demand at samples_per_s_per_gpu_high",
    "usd_per_run_high": "on-demand at samples_per_s_per_gpu_low",
    "spot_usd_per_hour": "empty if unknown", "spot_usd_per_run": "empty if unknown",
    "price_observed": "when the price was seen", "price_valid_until": "empty: the current price",
    "price_source": "",
    "loader_cpu_ms_per_sample": "the loader's CPU time per sample used for feeding (loader rows); empty without them",
    "cores_to_feed_per_gpu": "samples_per_s_per_gpu x loader_cpu_ms_per_sample / 1000: cores decoding for one GPU",
    "vcpus_needed": "gpu_count x (cores_to_feed_per_gpu + 1 for the training process), rounded up",
    "instance_vcpus": "the catalog's vCPUs of the instance; empty if unknown",
    "vcpus_feed_gpus": "true when instance_vcpus >= vcpus_needed; empty when either is unknown",
    "feeding_basis": "how the loader's CPU cost was measured (rows, workers, image size, host CPU)",
}


def line_feeding(line: CostLine, costs: list[LoaderCost]) -> tuple[Feeding, LoaderCost, str] | None:
    """The cores `line`'s instance needs to feed its GPUs at the line's speed; None without a speed or loader rows."""
    found = loader_cost_for(costs, line.row.image_size)
    if found is None or line.samples_per_s_per_gpu is None:
        return None
    cost, note = found
    return feeding(line.samples_per_s_per_gpu, line.instance.gpu_count, line.instance.vcpus, cost), cost, note


def record(line: CostLine, samples_per_run: float, loader_costs: list[LoaderCost] | None = None, *,
           strategy: str) -> dict[str, object]:
    """One cost.csv row; `strategy` is the row's label in its table (`CostTable.strategy`)."""
    row, instance, cost = line.row, line.instance, line.cost
    peak_bytes, _ = row.memory_peak()
    fed = line_feeding(line, loader_costs or [])
    return {
        "experiment": row.experiment, "cell_id": row.cell_id, "model": row.model, "image_size": row.image_size,
        "strategy": strategy, "micro_batch": row.micro_batch, "accum_steps_per_gpu": line.accum_steps,
        "effective_batch_per_gpu": row.micro_batch * line.accum_steps, "measured_accum_steps": row.accum_steps,
        "precision": row.precision, "checkpointing": row.checkpointing,
        "optimizer": row.optimizer, "profile": row.profile, "measured_device": row.device_name,
        "provider": instance.provider, "instance": instance.instance, "region": instance.region,
        "gpu": instance.gpu, "gpu_count": instance.gpu_count, "global_batch": line.global_batch,
        "status": line.status, "basis": line.basis, "note": line.note,
        "samples_per_s_per_gpu": line.samples_per_s_per_gpu,
        "samples_per_s_per_gpu_low": line.speed_interval[0] if line.speed_interval else None,
        "samples_per_s_per_gpu_high": line.speed_interval[1] if line.speed_interval else None,
        "samples_per_s_instance": cost.samples_per_s if cost else None,
        "scaling_efficiency": line.scaling.efficiency if line.scaling else None,
        "scaling_basis": line.scaling.basis if line.scaling else None,
        "memory_basis": line.memory_basis, "peak_memory_gib": peak_bytes / GIB,
        "required_memory_gib": line.memory.required_bytes / GIB, "gpu_memory_gib": line.memory.capacity_bytes / GIB,
        "samples_per_run": samples_per_run, "hours_per_run": cost.hours_per_run if cost else None,
        "usd_per_hour": instance.usd_per_hour, "usd_per_run": cost.usd_per_run if cost else None,
        **_usd_range(line),
        "spot_usd_per_hour": instance.spot_usd_per_hour, "spot_usd_per_run": cost.spot_usd_per_run if cost else None,
        "price_observed": instance.observed, "price_valid_until": instance.valid_until,
        "price_source": instance.source,
        "loader_cpu_ms_per_sample": fed[1].cpu_ms_per_sample if fed else None,
        "cores_to_feed_per_gpu": fed[0].cores_per_gpu if fed else None,
        "vcpus_needed": fed[0].vcpus_needed if fed else None, "instance_vcpus": instance.vcpus,
        "vcpus_feed_gpus": fed[0].feeds if fed else None,
        "feeding_basis": fed[1].describe() + fed[2] if fed else None,
    }


def _usd_range(line: CostLine) -> dict[str, float | None]:
    """The run's on-demand dollars at the ends of the line's speed interval."""
    usd = line.over_speed_range(line.cost.usd_per_run) if line.cost else None
    return {"usd_per_run_low": usd[0] if usd else None, "usd_per_run_high": usd[1] if usd else None}
