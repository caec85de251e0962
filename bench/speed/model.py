"""The throughput model (v6): three GPU resources per op, a per-kernel cost, and the host's dispatch as a floor.

Each op costs the largest of three times, plus a fixed cost per kernel launched:

- tensor work (matmul, convolution, attention): FLOPs / (the dtype's dense peak x an efficiency per op
  class x a factor per GPU generation), paid in whole waves: the op's output is cut into tiles of
  `TILE_ELEMENTS`, a long reduction split across tiles of its own (`SPLIT_K_MIN`: split-K), and a kernel whose
  tiles do not fill every SM pays for a full wave (Habitat's wave scaling, NeuSight's tile-level utilisation).
  A small op also pays `flops_per_sm_half` per SM.
- memory traffic: bytes / (datasheet bandwidth x the achievable fraction `e_memory`), with a per-SM
  occupancy term (a kernel too small to keep every SM's loads in flight reaches less) and
  `l2_speedup` for an op whose bytes fit in L2. A training batch norm moves `batch_norm_bytes` times the bytes
  it reads and writes once (its kernels read their input twice: statistics, then normalising or the gradient).
- memory format (half-precision convolutions only; timm's pairs of one model run both ways pin it): an
  NCHW convolution pays, on top of its own time, the transposes to and from NHWC that cuDNN's tensor-core
  kernels need (`nchw_half_bytes` x its bytes at the memory rate: separate kernels, so added, not overlapped);
  on PyTorch 1.x and cuDNN 8 only (calibration rows: `bench.speed.reference.CUDNN8_SOURCES`), a channels-last
  grouped convolution with wide groups (`GROUPED_NHWC_MIN_K`) runs off the tensor cores, at `e_grouped_nhwc` of
  the FP32 units' peak (cuDNN 8's direct grouped kernels, pytorch/pytorch#34977: channels-last RegNets and
  NFNets train at 0.3-0.45x their NCHW speed in timm's PyTorch 1.12 table, and infer at 0.9-1.15x on PyTorch
  2.4). A prediction is for the runner's torch 2 and cuDNN 9, which does not pay it.
- non-tensor work (elementwise, reductions, normalisation, optimizer): output elements / (FP32 lanes x boost
  clock x `elements_per_lane_cycle`), the lanes read off the datasheet as the FP32 peak / (2 x SMs x clock): 64
  per SM on V100 and A100, 128 on GA10x, Ada, Hopper and Blackwell.

The GPU's time is the sum over ops, each paying `KERNEL_US` (the launch figure, not fitted); the host issues
every op (eager PyTorch) at `host_us` each (measured, bounded by the calibration rows: `bench.speed.calibrate`), so
the step is the longer of the two. The part that sets the step names its bound.

Precision follows the runner's TF32 switches (`bench.grid.cell.TF32_BY_PRECISION`, which
`bench.train.step.configure_precision` sets), one per library: an fp32 matmul or attention runs at the TF32 peak
where cuBLAS's switch is on, an fp32 convolution where cuDNN's is, each at the FP32 (SIMT) peak otherwise and on a
GPU without TF32 (Turing, Volta). Under fp32 both are off; under tf32 and AMP both are on.

GPU facts are the catalog's (`bench/data/gpus.csv`, sourced per figure); the efficiencies are fitted
(`bench.speed.calibrate`) on public measurements of several GPUs and read from `bench/data/speed_params.json`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from bench.errors import BadInput
from bench.grid.cell import TF32_BY_PRECISION, Tf32
from bench.measure.hardware import PEAK_COLUMN, GpuSpec
from bench.speed.params import SpeedParams
from bench.measure.op_table import COMPUTE_CLASSES, DTYPES, OP_CLASSES, OpTable

Bound = Literal["compute", "memory", "non-tensor", "overhead"]
OpMix = Literal["matmul", "conv", "grouped-conv"]
"""What kind of network a step's compute is: the validation's error differs by it (`bench.speed.params.band_keys`)."""
TILE_ELEMENTS = 128 * 128
"""Output elements per thread-block tile of a tensor-core kernel (cuBLAS and cuDNN's common 128 x 128
tile): what a wave over the SMs is counted in. A fixed figure, not fitted."""
SPLIT_K_MIN = 128
"""The shortest slice of a matmul or convolution's reduction (FLOPs / 2 / output elements) that cuBLAS and cuDNN
give a thread block of its own when the output's tiles alone do not fill the SMs (split-K, then a reduction of the
partial tiles): a weight gradient's output is the weight (a few tiles), its reduction every position of the batch.
Counted without it (v5 and before), a weight gradient with a two-tile output paid 41 whole waves on an RTX 3090's
82 SMs: 46-60 % of the predicted training step of MLP-Mixer-S/32, XCiT-nano, Swin-T and ConvNeXt-T was idle SMs, and
the fit put the matmul and convolution efficiencies at the cap to make up for it. Attention is not split (flash
attention parallelises over queries, heads and samples). Chosen among 128, 256 and 512 by the training rows'
leave-one-GPU-out error (median / p90 13.1 / 43.8 %, 14.1 / 46.5, 13.4 / 45.9; the fit's loss alike, 0.129;
attention split too, 13.2 / 47.7 at 128): a chosen figure, counted among the parameters."""
KERNEL_US = 3.25
"""GPU time per kernel launched beyond its roofline time, microseconds: a fixed figure, not fitted (the
calibration rows are too large to see it). Source: CUDA.jl's CUDA-graphs guide (cuda.juliagpu.org/
dev/usage/graphs/, read 2026-12-02 as a search excerpt): 80 broadcast kernels of an RK4 step take 260 us launched one by
one, 3.25 us a kernel, and 70 us replayed as a graph (0.9 us a kernel: the GPU-side floor). The launched
figure is taken: eager PyTorch launches one by one."""
GENERATIONS = ("volta", "turing", "ampere", "ada", "hopper", "blackwell")
SIMT_GEMM_CEILING = 0.75
"""The most an fp32 matmul or attention on the FP32 (SIMT) units is predicted to reach of the FP32 peak.
An assumption, not a fit: no calibration row runs an fp32 GEMM there (the V100 and T4 FP32 rows are
convolutions, which cuDNN may run as Winograd, doing fewer FLOPs than counted: their fitted efficiency,
near 1, says nothing about a GEMM)."""
GROUPED_NHWC_MIN_K = 300.0
"""A cuDNN 8 channels-last grouped convolution runs off the tensor cores when its reduction per output element
(FLOPs / 2 / output elements: channels per group x kernel area) exceeds this: depthwise and narrow-group
convolutions (MobileNets, EfficientNets, ResNeXt's 4-wide groups, under 150) train faster channels-last there,
wide-group ones (RegNetX-3.2GF's 48, NFNet's 128) at 0.3-0.45x. Chosen by the fit's loss among 150, 300 and 500
(0.158, 0.151, 0.152): a fitted figure, counted among the parameters."""


class NoDatasheetPeak(BadInput):
    """A GPU's catalog row lacks a figure a prediction needs: refused, never guessed."""


_COMPUTE_INDEX = np.array([name in COMPUTE_CLASSES for name in OP_CLASSES])
_KERNEL_INDEX = np.array([name != "view" for name in OP_CLASSES])
_CONV_INDEX = np.array([name in ("conv", "grouped_conv") for name in OP_CLASSES])
_MATMUL_INDEX = np.array([name in ("matmul", "attention") for name in OP_CLASSES])
_HALF_INDEX = np.array([name in ("float16", "bfloat16") for name in DTYPES])
_BATCH_NORM = OP_CLASSES.index("batch_norm")
_ATTENTION = OP_CLASSES.index("attention")


def mix_of(matmul_flops: float, grouped_conv_flops: float, compute_flops: float) -> OpMix:
    """`matmul` where matmuls and attention do more than half the compute FLOPs (ViTs, MLP-mixers, ConvNeXts,
    whose 1x1 convolutions are linear layers), else `grouped-conv` where any grouped or depthwise convolution runs
    (RegNets, EfficientNets, MobileNets, ResNeXts), else `conv` (ResNets, VGGs, DenseNets).

    >>> mix_of(6.0, 0.0, 10.0), mix_of(1.0, 0.2, 10.0), mix_of(1.0, 0.0, 10.0)
    ('matmul', 'grouped-conv', 'conv')
    """
    if matmul_flops > compute_flops / 2:
        return "matmul"
    return "grouped-conv" if grouped_conv_flops > 0 else "conv"


def op_mixes(table: OpTable, row_index: np.ndarray, rows: int) -> list[OpMix]:
    """`mix_of` each of `rows` steps whose ops are concatenated in `table` (`row_index`: each entry's step)."""
    flops = table.flops * table.count

    def per_row(names: tuple[str, ...]) -> np.ndarray:
        chosen = np.isin(table.op_class, [OP_CLASSES.index(name) for name in names])
        return np.bincount(row_index, weights=flops * chosen, minlength=rows)

    return [mix_of(m, g, c) for m, g, c in zip(per_row(("matmul", "attention")), per_row(("grouped_conv",)),
                                               per_row(COMPUTE_CLASSES))]


def op_mix(table: OpTable) -> OpMix:
    """`mix_of` the step whose ops are `table`."""
    return op_mixes(table, np.zeros(len(table.count), dtype=int), 1)[0]


@dataclass(frozen=True)
class GpuRates:
    """The catalog figures one prediction uses."""

    gpu: str
    peak_flops_per_s: np.ndarray
    """Per `DTYPES` entry, the peak a compute op of that dtype runs at (NaN: unknown)."""
    bandwidth_bytes_per_s: float
    headline_peak_flops_per_s: float
    """The cell's precision's peak: the MFU denominator."""
    sm_count: int
    clock_hz: float
    l2_bytes: float
    generation: str
    tf32: Tf32
    """Which fp32 compute ops run on TF32 tensor cores (both off on a GPU without TF32)."""
    tf32_peak_flops_per_s: float
    """The TF32 tensor cores' peak (NaN: none)."""
    fp32_peak_flops_per_s: float
    """The FP32 units' peak: fp32 ops without TF32 run there, and it counts the lanes non-tensor work runs on."""


def gpu_rates(spec: GpuSpec, precision: str) -> GpuRates:
    """The figures `precision` runs at on `spec`; refuses a GPU whose catalog row lacks one.

    fp32 compute ops run at the TF32 peak where `precision`'s switch for their library is on
    (`TF32_BY_PRECISION`), else at the FP32 peak; a GPU without TF32 (Turing, Volta) runs them at FP32.
    """
    column = PEAK_COLUMN[precision]
    headline = spec.peak_tflops[column]
    missing = [name for name, value in (
        (column, headline), ("fp32_tflops", spec.peak_tflops["fp32_tflops"]),
        ("memory_bandwidth_gb_per_s", spec.memory_bandwidth_gb_per_s),
        ("sm_count", spec.sm_count), ("boost_clock_mhz", spec.boost_clock_mhz)) if value is None]
    if missing:
        raise NoDatasheetPeak(f"--gpu {spec.gpu}: bench/data/gpus.csv has no {', '.join(missing)} for "
                              f"{precision}; no prediction rather than a guess")
    tflops = spec.peak_tflops
    by_dtype = {"float16": tflops["fp16_tflops"], "bfloat16": tflops["bf16_tflops"], "float32": tflops["fp32_tflops"],
                "other": tflops["fp32_tflops"]}
    peaks = np.array([np.nan if by_dtype[d] is None else by_dtype[d] * 1e12 for d in DTYPES])
    # A GPU with no L2 figure gets no L2 hits: the slower, never the flattering, assumption.
    l2 = (spec.l2_mib or 0.0) * 2**20
    has_tf32 = tflops["tf32_tflops"] is not None
    switches = TF32_BY_PRECISION[precision]
    tf32 = Tf32(matmul=switches.matmul and has_tf32, conv=switches.conv and has_tf32)
    return GpuRates(spec.gpu, peaks, spec.memory_bandwidth_gb_per_s * 1e9, headline * 1e12, spec.sm_count,
                    spec.boost_clock_mhz * 1e6, l2, spec.generation, tf32,
                    tflops["tf32_tflops"] * 1e12 if has_tf32 else np.nan, tflops["fp32_tflops"] * 1e12)


def tf32_entries(table: OpTable, tf32: Tf32) -> np.ndarray:
    """Per entry of `table`: an fp32 op that runs on TF32 tensor cores under `tf32`'s switches (matmuls and
    attention by cuBLAS's, convolutions by cuDNN's)."""
    on = np.where(_MATMUL_INDEX[table.op_class], tf32.matmul, np.where(_CONV_INDEX[table.op_class], tf32.conv, False))
    return on & ~_HALF_INDEX[table.dtype]


@dataclass(frozen=True)
class EntryRates:
    """The GPU figures of each op-table entry (arrays, one value per entry, or scalars for one GPU)."""

    peak: np.ndarray
    bandwidth: np.ndarray | float
    sm_count: np.ndarray | float
    clock_hz: np.ndarray | float
    l2_bytes: np.ndarray | float
    generation: np.ndarray
    """Index into `GENERATIONS`."""
    tf32: np.ndarray
    """The entry is an fp32 op run on TF32 tensor cores."""
    fp32_peak: np.ndarray | float
    """The FP32 units' peak: a TF32-allowed op may run there instead, when that is faster."""

    @classmethod
    def of(cls, table: OpTable, rates: GpuRates) -> EntryRates:
        tf32 = tf32_entries(table, rates.tf32)
        return cls(np.where(tf32, rates.tf32_peak_flops_per_s, rates.peak_flops_per_s[table.dtype]),
                   rates.bandwidth_bytes_per_s, rates.sm_count, rates.clock_hz, rates.l2_bytes,
                   np.full(len(table.count), GENERATIONS.index(rates.generation)), tf32, rates.fp32_peak_flops_per_s)


@dataclass(frozen=True)
class OpTimes:
    """Per-op times of one step (seconds, times each entry's count), by resource."""

    tensor_s: np.ndarray
    memory_s: np.ndarray
    non_tensor_s: np.ndarray
    kernel_s: np.ndarray
    transpose_s: np.ndarray
    """NCHW half-precision convolutions' layout transposes: memory time of their own, after the op's."""

    @property
    def op_s(self) -> np.ndarray:
        return np.maximum(np.maximum(self.tensor_s, self.memory_s), self.non_tensor_s) + self.kernel_s + \
            self.transpose_s




@dataclass(frozen=True)
class OpFeatures:
    """What the parameters act on, per op-table entry: computed once per table and GPU (the fit reuses it)."""

    op_class: np.ndarray
    generation: np.ndarray
    flops: np.ndarray
    bytes_moved: np.ndarray
    out_elements: np.ndarray
    count: np.ndarray
    computing: np.ndarray
    launched: np.ndarray
    non_tensor: np.ndarray
    transposed: np.ndarray
    """Half-precision NCHW convolutions: cuDNN transposes their tensors."""
    grouped_nhwc: np.ndarray
    """Half-precision channels-last grouped convolutions on a cuDNN 8 stack: run on the FP32 units."""
    fp32: np.ndarray
    """fp32 ops (run on TF32 tensor cores where `rates.tf32`, else on the FP32 units)."""
    in_l2: np.ndarray
    wave_cost: np.ndarray
    """>= 1: whole waves of tiles over the SMs over the tiles the op has, its reduction's splits counted (a partial
    wave costs a full one)."""
    rates: EntryRates


def op_features(table: OpTable, rates: EntryRates, cudnn8: np.ndarray | bool = False) -> OpFeatures:
    """`cudnn8`: per entry (or for all), the step ran on PyTorch 1.x and cuDNN 8 (a calibration row's stack,
    `bench.speed.reference.ReferenceRow.cudnn8`); a prediction is for the runner's torch 2 and cuDNN 9."""
    cls = table.op_class
    with np.errstate(invalid="ignore", divide="ignore"):
        reduction = np.where(table.out_elements > 0, table.flops / (2 * table.out_elements), 0.0)
    splits = np.where(cls == _ATTENTION, 1.0, np.maximum(np.floor(reduction / SPLIT_K_MIN), 1.0))
    tiles = np.maximum(np.ceil(table.out_elements / TILE_ELEMENTS), 1) * splits
    return OpFeatures(cls, rates.generation, table.flops, table.bytes_moved, table.out_elements, table.count,
                      _COMPUTE_INDEX[cls] & (table.flops > 0), _KERNEL_INDEX[cls],
                      _KERNEL_INDEX[cls] & ~_COMPUTE_INDEX[cls],
                      _CONV_INDEX[cls] & ~table.channels_last & _HALF_INDEX[table.dtype],
                      (cls == OP_CLASSES.index("grouped_conv")) & table.channels_last & _HALF_INDEX[table.dtype]
                      & (reduction > GROUPED_NHWC_MIN_K) & cudnn8,
                      ~_HALF_INDEX[table.dtype],
                      table.bytes_moved <= rates.l2_bytes, np.ceil(tiles / rates.sm_count) * rates.sm_count / tiles,
                      rates)


def op_times(table: OpTable | OpFeatures, rates: EntryRates | None, params: SpeedParams) -> OpTimes:
    """The three resource times and the launch cost of every entry in `table` (or its `op_features`)."""
    f = table if isinstance(table, OpFeatures) else op_features(table, rates)
    r = f.rates
    generation = np.array([params.generation_factor(g) for g in GENERATIONS])[f.generation]
    # The generation factor is the tensor cores'; fp32 on the FP32 units has its own efficiency on every GPU.
    simt = f.fp32 & ~r.tf32
    class_e = np.array([params.compute_efficiency.get(name, 0.0) for name in OP_CLASSES])[f.op_class]
    e_max = class_e * np.where(simt, params.e_fp32, generation * np.where(r.tf32, params.e_tf32, 1.0))
    e_max = np.minimum(e_max, np.where(simt & _MATMUL_INDEX[f.op_class], SIMT_GEMM_CEILING, 1.0))  # never above peak
    # A TF32-allowed op may run on the FP32 units instead (cuBLAS and cuDNN choose among both kinds of
    # kernel): its rate is the faster of the two paths.
    simt_e = np.minimum(class_e * params.e_fp32, np.where(_MATMUL_INDEX[f.op_class], SIMT_GEMM_CEILING, 1.0))
    rate = np.where(r.tf32, np.fmax(r.peak * e_max, r.fp32_peak * simt_e), r.peak * e_max)
    rate = np.where(f.grouped_nhwc, r.fp32_peak * params.e_grouped_nhwc, rate)
    sms = r.sm_count
    with np.errstate(invalid="ignore", divide="ignore"):
        # Whole waves multiply the op's FLOPs; the per-SM fill cost is paid once, not once per idle tile.
        tensor = np.where(f.computing, (f.flops * f.wave_cost + sms * params.flops_per_sm_half) / rate, 0.0)
    dram = r.bandwidth * min(params.e_memory, 1.0)
    bandwidth = dram * np.where(f.in_l2, params.l2_speedup, 1.0)
    moved = f.bytes_moved * np.where(f.op_class == _BATCH_NORM, params.batch_norm_bytes, 1.0)
    memory = np.where(f.launched & (f.bytes_moved > 0), (moved + sms * params.bytes_per_sm_half) / bandwidth, 0.0)
    transpose = np.where(f.transposed, f.bytes_moved * params.nchw_half_bytes / dram, 0.0)
    # FP32 lane-cycles per second = the FP32 peak / 2 (one fused multiply-add, two FLOPs, per lane and cycle).
    non_tensor = np.where(f.non_tensor, f.out_elements / (r.fp32_peak / 2 * params.elements_per_lane_cycle), 0.0)
    kernel = np.where(f.launched, params.kernel_us * 1e-6, 0.0)
    return OpTimes(tensor * f.count, memory * f.count, non_tensor * f.count, kernel * f.count, transpose * f.count)


@dataclass(frozen=True)
class StepTime:
    """A predicted step: its time, and what sets it."""

    step_time_s: float
    gpu_s: float
    host_s: float
    compute_s: float
    """Time of the ops whose tensor work takes longest."""
    memory_s: float
    """Time of the ops whose bytes take longest."""
    non_tensor_s: float
    """Time of the ops whose non-tensor work (SMs x clock) takes longest."""
    kernel_overhead_s: float
    bound: Bound


def step_time(table: OpTable, rates: GpuRates, params: SpeedParams) -> StepTime:
    """The predicted time of the step whose ops are `table` on the GPU of `rates`."""
    if np.isnan(rates.peak_flops_per_s[table.dtype[_COMPUTE_INDEX[table.op_class] & (table.flops > 0)]]).any():
        raise NoDatasheetPeak(f"--gpu {rates.gpu}: a compute op's dtype has no datasheet peak in "
                              "bench/data/gpus.csv; no prediction rather than a guess")
    times = op_times(table, EntryRates.of(table, rates), params)
    stacked = np.stack([times.tensor_s, times.memory_s, times.non_tensor_s])
    longest = stacked.argmax(axis=0)
    compute_s, memory_s, non_tensor_s = (float(stacked[i][longest == i].sum()) for i in range(3))
    memory_s += float(times.transpose_s.sum())  # the transposes are memory traffic of their own
    kernel_s = float(times.kernel_s.sum())
    gpu_s = compute_s + memory_s + non_tensor_s + kernel_s
    host_s = float(table.count.sum()) * params.host_us * 1e-6
    if host_s > gpu_s:
        bound: Bound = "overhead"
    else:
        parts = {"compute": compute_s, "memory": memory_s, "non-tensor": non_tensor_s, "overhead": kernel_s}
        bound = max(parts, key=parts.get)
    return StepTime(max(gpu_s, host_s), gpu_s, host_s, compute_s, memory_s, non_tensor_s, kernel_s, bound)
