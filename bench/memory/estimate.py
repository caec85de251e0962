"""Predicted peak memory of a cell, without its device: the runner's step under fake tensors.

The model is built on the meta device and materialised as fake tensors
(`FakeTensorMode`): shapes, dtypes and storages without data or compute. The cell's step
(`bench.train.step.train_step`, the runner's) then runs under `bench.measure.memory.trace_step`
(the runner's MemTracker trace), so AMP, checkpointing, the optimizer and accumulation are
all in the number. Fake tensors live on "cpu": a fake "cuda" backward fails here.

On CPU the result is exactly what the runner's tracked-tensor measurement reports. For a
CUDA cell (the grid as written) it adds what the CUDA allocator does that tensors do not
show, as far as it can be read from torch's source (see `CUDA_MODEL`); the rest is listed
in `CUDA_UNMODELLED` and in every row.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, ContextManager, Iterator, Literal, Protocol

import torch
from torch.distributed._tools import mem_tracker

from bench.frames import Tabular
from bench.grid.cell import Cell
from bench.measure.memory import TracedStep, param_bytes, trace_step
from bench.memory.allocator import AllocatorEvent, allocated, reserved_to_run, whole_segments
from bench.memory.cuda_attention import cuda_attention, masks_without_values
from bench.memory.cuda_autocast import cuda_autocast_policy
from bench.memory.fake_models import FakeModels
from bench.memory.untraceable import named_untraceable_op
from bench.train.setup import cell_batch, cell_optimizer
from bench.train.step import PhaseHook, apply_update, configure_precision, grad_scaler_for, train_step
from bench.units import MIB

Target = Literal["cuda", "cpu"]
AttentionKernel = Literal["eager", "flash", "efficient", "math", "cpu"]
"""The attention kernel an estimate assumed: `eager` (timm's explicit softmax: probabilities of
heads x tokens^2 kept for backward), one of CUDA's fused SDPA kernels, or the CPU's SDPA."""


class StepObserver(ContextManager, Protocol):
    """Watches a traced step: entered around it, told of every phase (`bench.measure.ops.OpRecorder`)."""

    def on_phase(self, phase: str, micro_step: int) -> None: ...

# aten/src/ATen/cuda/CublasHandlePool.cpp (torch 2.14): the cuBLAS workspace defaults to ":4096:8" =
# 32 MiB from compute capability 9.0 on (Hopper: H100, H200; Blackwell keeps it) and ":4096:2:16:8"
# = 8 MiB + 128 KiB before; cuBLASLt shares cuBLAS's workspace (no second buffer). It comes from
# the caching allocator, per (handle, stream), and handles are per thread: the main thread runs
# forward and the optimizer, autograd's device thread runs backward.
CUBLAS_THREADS = 2


def cublas_workspace_bytes(capability: tuple[int, int] | None = None) -> int:
    """cuBLAS's default workspace on a device of `capability` (None: not known, the larger size).

    >>> cublas_workspace_bytes((9, 0)) // MIB, cublas_workspace_bytes((10, 0)) // MIB, cublas_workspace_bytes((8, 0))
    (32, 32, 8519680)
    """
    if capability is None or capability >= (9, 0):
        return 32 * MIB
    return 2 * 4096 * 1024 + 8 * 16 * 1024


def workspace_allowance_bytes(capability: tuple[int, int] | None = None) -> int:
    """The estimate's workspace allowance: one cuBLAS workspace per thread that runs kernels."""
    return CUBLAS_THREADS * cublas_workspace_bytes(capability)


WORKSPACE_ALLOWANCE_BYTES = workspace_allowance_bytes()
"""The allowance for a GPU not named (compute capability 9.0 or later: the larger)."""

CUDA_MODEL = (
    "modelled: tensors of the runner's step (MemTracker, fake tensors), each rounded to the "
    "allocator's 512-byte blocks, under CUDA's autocast policy (torch's AutocastCUDA kernels, the weight-cast cache "
    "as its own category), the attention kernel CUDA's SDPA would pick per call (estimate_attention: "
    "the one picked most) and CUDA's fused dropout (a 1-byte mask kept); "
    "the multi-tensor (foreach) optimizer update CUDA gets by default; the input batch; a cuBLAS workspace allowance (cuBLASLt shares it) "
    f"({WORKSPACE_ALLOWANCE_BYTES // MIB} MiB: the default from compute capability 9.0 on, 2 threads); reserved = the "
    "step's allocations and frees, in order, replayed through the caching allocator's rules (bench.memory.allocator: "
    "pools, segment sizes, best fit, splitting, cached blocks released before running out): the least memory they run in"
)
CUDA_UNMODELLED = (
    "not modelled: kernel choices other than attention (convolution saves what the CPU kernel saves), "
    "cuDNN workspaces, "
    "the CUDA context"
)


@dataclass(frozen=True)
class Estimate(Tabular):
    """What the fake step showed, and the CUDA allocator's share on top of it."""

    target: Target
    traced: TracedStep
    params_bytes: int
    param_count: int
    inputs_bytes: int
    """The micro-batch's images and labels: on the device, but created before the trace."""
    workspace_bytes: int
    """cuBLAS/cuBLASLt workspace allowance (CUDA only)."""
    attention: AttentionKernel = "cpu"
    """The attention kernel the trace assumed (see `attention_kernel`)."""
    reserved_bytes: int | None = None
    """CUDA only: the least reserved memory the step's allocations run in (`bench.memory.allocator.reserved_to_run`,
    the inputs and cuBLAS workspaces allocated first)."""
    tracked_peak_bytes: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tracked_peak_bytes", self.traced.tracked_peak_bytes["total"])

    @property
    def autocast_cache_bytes(self) -> int:
        """Autocast's low-precision weight copies alive at the peak (their own category, not activations)."""
        return self.traced.tracked_peak_bytes.get("autocast_cache", 0)

    @property
    def peak_allocated_bytes(self) -> int | None:
        """Predicted `max_memory_allocated` (CUDA); None for a CPU estimate."""
        if self.target != "cuda":
            return None
        return self.tracked_peak_bytes + self.inputs_bytes + self.workspace_bytes

    @property
    def peak_reserved_bytes(self) -> int | None:
        """Predicted `max_memory_reserved` on a device with just enough memory (`reserved_bytes`), never below the
        allocated peak in whole 2 MiB segments."""
        allocated = self.peak_allocated_bytes
        return None if allocated is None else max(whole_segments(allocated), self.reserved_bytes or 0)

    @property
    def peak_bytes(self) -> int:
        """What the runner's `peak_memory_bytes` would be: allocated on CUDA, tracked on CPU."""
        allocated = self.peak_allocated_bytes
        return self.tracked_peak_bytes if allocated is None else allocated

    def frame_rows(self) -> list[dict]:
        """One row: the predicted peaks and their parts, in bytes (None where the target has none)."""
        return [{"target": self.target, "peak_bytes": self.peak_bytes,
                 "peak_allocated_bytes": self.peak_allocated_bytes, "peak_reserved_bytes": self.peak_reserved_bytes, "tracked_peak_bytes": self.tracked_peak_bytes,
                 "params_bytes": self.params_bytes, "param_count": self.param_count,
                 "inputs_bytes": self.inputs_bytes, "workspace_bytes": self.workspace_bytes}]


def attention_kernel(cell: Cell, target: Target, capability: tuple[int, int] | None = None) -> AttentionKernel:
    """The attention kernel `cell` gets on `target`: what `F.scaled_dot_product_attention` picks on CUDA.

    torch's SDPA (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp) tries flash, then
    memory-efficient, then math: flash needs compute capability 8.0 or later and fp16/bf16;
    memory-efficient runs from 5.0 on in fp32 and fp16 (bf16 from 8.0). Both keep only the output,
    a per-row log-sum-exp and the dropout RNG state for backward; math keeps the probabilities and
    a dropout mask. `capability` None: a current GPU (8.0 or later). This is what timm's heads (64 or
    fewer dimensions) without a mask get; the trace picks per call, from each call's arguments
    (`bench.memory.cuda_attention`), and the row names the kernel it picked most.

    >>> cell = Cell(experiment="e", profile="cuda", model="test_vit", image_size=32, micro_batch=4, accum_steps=1,
    ...             precision="fp16", checkpointing="off", optimizer="sgd", channels_last=False,
    ...             warmup_steps=1, measured_steps=1)
    >>> attention_kernel(cell, "cuda"), attention_kernel(cell, "cuda", (7, 0)), attention_kernel(cell, "cuda", (3, 7))
    ('flash', 'efficient', 'math')
    """
    if cell.attention == "eager":
        return "eager"
    if target != "cuda":
        return "cpu"
    capability = capability or (8, 0)
    low_precision = cell.precision in ("fp16", "bf16")
    if low_precision and capability >= (8, 0):
        return "flash"
    if capability >= (5, 0) and (cell.precision != "bf16" or capability >= (8, 0)):
        return "efficient"
    return "math"


@dataclass(frozen=True)
class FakeStep:
    """A cell's step, ready to run on fake tensors: `run(on_phase)` is the runner's step."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    batch: tuple[torch.Tensor, torch.Tensor]
    run: Callable[..., object]
    attention_kernels: Counter[str]
    """SDPA calls so far per CUDA kernel picked (`bench.memory.cuda_attention`); none for a CPU target."""


@contextlib.contextmanager
def fake_step(cell: Cell, target: Target = "cuda", models: FakeModels | None = None,
              accum_steps: int | None = None, observe: PhaseHook | None = None, *,
              capability: tuple[int, int] | None = None,
              autocast_uncast: frozenset[str] = frozenset()) -> Iterator[FakeStep]:
    """Inside fake mode, `cell`'s step after one warm-up step, as the runner's warm-up leaves it.

    For a CUDA target the step casts as CUDA's autocast does (`bench.memory.cuda_autocast`) and
    attention and dropout run the kernels CUDA would pick on a GPU of `capability`
    (`bench.memory.cuda_attention`). An op fake tensors cannot run is refused in one line
    (`bench.memory.untraceable`).

    The one path from a cell to its step on fake tensors, shared by the memory estimator and the
    throughput model (`bench.speed`). `accum_steps` overrides the cell's K (the throughput model
    traces two micro-steps and scales); `observe` is called at every phase of the step, before
    the caller's own hook. Optimizer state exists; gradients are None. `autocast_uncast`: ops CUDA's autocast
    leaves uncast in the step (`bench.memory.cuda_autocast.cuda_autocast_policy`), for rows of an older PyTorch.
    """
    if cell.compile == "on":
        raise NotImplementedError("compile on: torch.compile is not modelled (the fake step runs eagerly)")
    models = models or FakeModels()
    configure_precision(cell.precision)
    model = models.get(cell)
    for parameter in model.parameters():  # a shared model: the previous cell may have kept zeroed gradients
        parameter.grad = None
    # Built outside fake mode: bitsandbytes fills its quantisation maps through host reads
    # (`.tolist()`), which fake tensors cannot answer. Its state is still created, fake, in the step.
    optimizer = cell_optimizer(cell, model)
    cuda = target == "cuda"
    with (named_untraceable_op(cell.model), models.mode, _allocator_rounding(cuda), masks_without_values(),
          (cuda_attention(capability or (8, 0)) if cuda else contextlib.nullcontext(Counter())) as kernels,
          cuda_autocast_policy(autocast_uncast) if cuda else contextlib.nullcontext()):
        if cuda:
            _multi_tensor_updates(optimizer)
        scaler = _StepAlwaysScaler("cpu") if grad_scaler_for(cell.precision, "cpu") else None
        batch = cell_batch(cell, "cpu")
        micro_batches = [batch] * (accum_steps or cell.accum_steps)

        def run_step(on_phase: PhaseHook | None = None):
            def hooks(phase: str, micro_step: int) -> None:
                for hook in (observe, on_phase):
                    if hook:
                        hook(phase, micro_step)
            return train_step(model, optimizer, micro_batches, cell.precision, scaler, hooks,
                              **cell.step_options)

        # The runner's warm-up leaves optimizer state, and gradients None (or zeros, with zero_grad="zeros"). The
        # state depends on the parameters alone, so one update on zero gradients makes it, without the forward and
        # backward the warm-up runs (a third of a trace's ops; the estimates are the same, `tests/test_estimate.py`).
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.grad = torch.zeros_like(parameter)
        if scaler:
            scaler.scale(torch.zeros(()))  # its scale and growth tracker, as a warm-up's backward makes them
        apply_update(optimizer, scaler, zero_grad=cell.step_options.get("zero_grad", "none"))
        yield FakeStep(model, optimizer, batch, run_step, kernels)


def estimate_cell(cell: Cell, target: Target = "cuda", models: FakeModels | None = None, *,
                  accum_steps: int | None = None, observer: StepObserver | None = None,
                  capability: tuple[int, int] | None = None,
                  autocast_uncast: frozenset[str] = frozenset()) -> Estimate:
    """Run `cell`'s step on fake tensors and predict its peak memory on `target`.

    `capability`: the CUDA GPU's compute capability, for its attention kernel and cuBLAS
    workspace (None: a GPU of 8.0 or later for attention, the larger workspace). `autocast_uncast`: as
    `fake_step`'s.

    `observer` (the throughput model's op recorder) watches the same traced step: one trace
    answers both. `accum_steps` traces that K instead of the cell's (from 2 on, the peak is the
    same: every later micro-step repeats the second's memory).

    Example:
        >>> cell = Cell(experiment="e", profile="cpu", model="test_vit", image_size=32, micro_batch=4,
        ...             accum_steps=2, precision="bf16", checkpointing="full", optimizer="adamw",
        ...             channels_last=False, warmup_steps=1, measured_steps=1)
        >>> estimate_cell(cell, "cpu").peak_bytes > 0  # slow: traces a model under FakeTensorMode
        True
    """
    observe = observer.on_phase if observer else None
    cuda = target == "cuda"
    with (fake_step(cell, target, models, accum_steps, observe, capability=capability,
                    autocast_uncast=autocast_uncast) as step,
          observer or contextlib.nullcontext(), _allocation_events(cuda) as events):
        # Fake tensors have no values: no gradient norm, and the host's memory says nothing of a device.
        traced = trace_step(step.run, step.model, step.optimizer, torch.device("cpu"), values=False)
    inputs_bytes = sum(allocated(t.untyped_storage().nbytes(), cuda) for t in step.batch)
    workspace = cublas_workspace_bytes(capability)
    # The batch and the cuBLAS workspaces (one per thread, created by the warm-up's first matmul) stay allocated.
    first = [(-1, inputs_bytes)] + [(-2 - thread, workspace) for thread in range(CUBLAS_THREADS)]
    return Estimate(
        target=target, traced=traced, params_bytes=param_bytes(step.model),
        param_count=sum(p.numel() for p in step.model.parameters()),
        inputs_bytes=inputs_bytes,
        workspace_bytes=workspace_allowance_bytes(capability) if cuda else 0,
        attention=_traced_attention(cell, target, capability, step.attention_kernels),
        reserved_bytes=reserved_to_run(first + events) if cuda else None,
    )


def _traced_attention(cell: Cell, target: Target, capability: tuple[int, int] | None,
                      kernels: Counter[str]) -> AttentionKernel:
    """The row's attention kernel: the one CUDA picked for most of the trace's SDPA calls (a mask or a head
    size can move a model off flash), else what `attention_kernel` expects; timm's eager attention stays eager."""
    expected = attention_kernel(cell, target, capability)
    return kernels.most_common(1)[0][0] if kernels and expected != "eager" else expected


class _StepAlwaysScaler(torch.amp.GradScaler):
    """fp16's GradScaler, taking every step as a healthy run does.

    Its overflow check reads a value back to the host (`.item()`), which a fake tensor does
    not have; the check's tensors and the in-place unscale still run, so memory is the same.
    """

    def _maybe_opt_step(self, optimizer, optimizer_state, *args, **kwargs):
        return optimizer.step(*args, **kwargs)


def _multi_tensor_updates(optimizer: torch.optim.Optimizer) -> None:
    """The update CUDA parameters get: the multi-tensor (foreach) path, not the per-parameter loop.

    torch picks foreach by default when every parameter is on CUDA
    (`torch.optim.optimizer._default_to_fused_or_foreach`); its temporaries span all
    parameters at once. The fake parameters are on "cpu", whose default is the loop.
    """
    for group in optimizer.param_groups:
        if "foreach" in group and group["foreach"] is None:  # bitsandbytes' optimizers have no foreach
            group["foreach"] = True


@contextlib.contextmanager
def _allocation_events(enabled: bool) -> Iterator[list[AllocatorEvent]]:
    """Every storage MemTracker sees allocated, resized or freed, in order (`AllocatorEvent`s keyed by its record):
    what the caching allocator would be asked for."""
    events: list[AllocatorEvent] = []
    if not enabled:
        yield events
        return
    tracker = mem_tracker.MemTracker
    original = tracker._update_snap
    update = mem_tracker._UpdateType

    def recorded(self, u_type, winfo, old_mem_consumed=None, old_reftype=None):
        if u_type in (update.DEL, update.SIZE):
            events.append((id(winfo), 0))
        if u_type in (update.ADD, update.SIZE):
            events.append((id(winfo), winfo.mem_consumed))
        return original(self, u_type, winfo, old_mem_consumed, old_reftype)

    tracker._update_snap = recorded
    try:
        yield events
    finally:
        tracker._update_snap = original


@contextlib.contextmanager
def _allocator_rounding(enabled: bool) -> Iterator[None]:
    """MemTracker rounds storages to 512 bytes only on real CUDA devices; ours are fake "cpu"."""
    if not enabled:
        yield
        return
    info = mem_tracker._WeakRefInfo
    original = info._calculate_mem_consumed

    def rounded(self) -> int:
        return allocated(self.size * self.element_size, True)

    info._calculate_mem_consumed = rounded
    try:
        yield
    finally:
        info._calculate_mem_consumed = original
