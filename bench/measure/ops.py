"""Every aten op a step dispatches, as the throughput model needs it: class, FLOPs, bytes, dtype.

`OpRecorder` is a `TorchDispatchMode`: entered inside `FakeTensorMode`, it sees each op before
the fake mode answers it, so a whole training step (forward, backward, optimizer) is recorded
without data or compute. FLOPs come from torch's own formulas (`torch.utils.flop_counter`'s
registry), plus the same attention formula for the CPU flash-attention kernel a fake CPU step
dispatches (the registry knows only the CUDA ones), and one correction: the registry's
grouped-convolution backward ignores the groups in the weight gradient (a depthwise
convolution's is counted channels times over), so that term is divided by the groups here. Bytes are every tensor read plus every tensor
written, each once; output elements are counted too (tiles and per-SM work). Views and allocations launch no kernel: they are recorded (the host still
dispatches them) with class `view`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

from bench.measure.flops import conv_backward_flops
from bench.measure.op_table import OpClass, OpRecord, OpTable, StepOps

aten = torch.ops.aten
_NO_KERNEL = {aten.detach, aten.alias, aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty,
              aten.new_empty_strided, aten.lift_fresh, aten._local_scalar_dense, aten.sym_size,
              aten.sym_stride, aten.sym_numel, aten.is_same_size, aten.set_, aten._unsafe_view}
_NORM = {aten._native_batch_norm_legit_no_training, aten.native_layer_norm, aten.native_layer_norm_backward,
         aten.native_group_norm, aten.native_group_norm_backward}
_BATCH_NORM_TRAINING = {aten.native_batch_norm, aten._native_batch_norm_legit, aten._native_batch_norm_legit_functional}
"""Batch norms whose `training` argument says which statistics they normalise by: the batch's or the running ones."""
_BATCH_NORM_ALWAYS = {aten._batch_norm_with_update, aten.native_batch_norm_backward, aten.batch_norm_backward}
_REDUCTION = {aten.sum, aten.mean, aten.amax, aten.amin, aten.max, aten.min, aten.var_mean, aten.var,
              aten.std, aten.norm, aten.linalg_vector_norm, aten._softmax, aten._log_softmax,
              aten._softmax_backward_data, aten._log_softmax_backward_data, aten.nll_loss_forward,
              aten.nll_loss_backward, aten.argmax, aten.logsumexp}
_MATMUL = {aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten._addmm_activation}
_CONV = {aten.convolution, aten.convolution_backward, aten._convolution}
_CPU_SDPA = {aten._scaled_dot_product_flash_attention_for_cpu: sdpa_flop_count,
             aten._scaled_dot_product_flash_attention_for_cpu_backward: sdpa_backward_flop_count}


class OpRecorder(TorchDispatchMode):
    """Records each aten op dispatched inside it (`records`), then lets it run.

    Example:
        >>> with OpRecorder() as recorder:
        ...     _ = torch.ones(4, 8) @ torch.ones(8, 2)
        >>> [(r.op_class, r.flops) for r in recorder.records if r.op_class == "matmul"]
        [('matmul', 128.0)]
    """

    def __init__(self) -> None:
        super().__init__()
        self.records: list[OpRecord] = []
        self.marks: dict[tuple[str, int], int] = {}
        """(phase, micro-step) -> ops recorded when the step reached it (`on_phase`)."""

    def on_phase(self, phase: str, micro_step: int) -> None:
        """A step's phase hook (`bench.train.step.PhaseHook`): where each phase ends in `records`."""
        self.marks[(phase, micro_step)] = len(self.records)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.namespace != "prim":  # metadata queries (`prim.device`) that only fake tensors dispatch
            self.records.append(record_op(func, args, kwargs, out))
        return out


def record_op(func: torch._ops.OpOverload, args: tuple, kwargs: dict, out: Any) -> OpRecord:
    """The `OpRecord` of one call of `func` (its inputs and its output)."""
    packet = func.overloadpacket
    inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    op_class = classify(func, args)
    flops = _flops(packet, args, kwargs, out)
    moved = 0 if op_class == "view" else _bytes(inputs, outputs, func._schema.is_mutable)
    floating = [t for t in inputs if t.is_floating_point()]
    dtype = str((floating or inputs or outputs or [torch.empty(0)])[0].dtype).removeprefix("torch.")
    cl = op_class in ("conv", "grouped_conv") and inputs[0].dim() == 4 and \
        inputs[0].is_contiguous(memory_format=torch.channels_last) and not inputs[0].is_contiguous()
    elements = 0 if op_class == "view" else sum(t.numel() for t in outputs)
    return OpRecord(str(func), op_class, float(flops), moved, dtype, cl, elements)


def classify(func: torch._ops.OpOverload, args: tuple) -> OpClass:
    """The op's class, by what kind of kernel runs it.

    >>> classify(torch.ops.aten.mm.default, ())
    'matmul'
    """
    packet = func.overloadpacket
    if func.is_view or packet in _NO_KERNEL:
        return "view"
    if packet in _MATMUL:
        return "matmul"
    if packet in _CONV:
        groups = _groups(packet, args)
        return "grouped_conv" if isinstance(groups, int) and groups > 1 else "conv"
    if "scaled_dot_product" in packet.__name__:
        return "attention"
    if packet in _BATCH_NORM_ALWAYS:
        return "batch_norm"
    if packet in _BATCH_NORM_TRAINING:
        position = [argument.name for argument in func._schema.arguments].index("training")  # overloads differ
        return "batch_norm" if len(args) > position and args[position] else "norm"
    if packet in _NORM:
        return "norm"
    if packet in _REDUCTION:
        return "reduction"
    if packet.__name__.startswith(("_foreach", "_fused")):
        return "optimizer"
    return "elementwise"


def _groups(packet, args: tuple) -> int:
    """A convolution's groups argument (1 when absent)."""
    position = {aten.convolution: 8, aten._convolution: 8, aten.convolution_backward: 9}[packet]
    return args[position] if len(args) > position and isinstance(args[position], int) else 1


def _flops(packet, args: tuple, kwargs: dict, out: Any) -> float:
    if packet is aten.convolution_backward and _groups(packet, args) > 1:
        return _grouped_conv_backward_flops(args, out)
    if packet in flop_registry:
        return flop_registry[packet](*args, **kwargs, out_val=out)
    if packet in _CPU_SDPA:  # the registry's formula, on the shapes of the CPU kernel's arguments
        if packet is aten._scaled_dot_product_flash_attention_for_cpu:
            query, key, value = args[:3]
            return sdpa_flop_count(query.shape, key.shape, value.shape)
        grad_out, query, key, value = args[:4]
        return sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)
    return 0


def _grouped_conv_backward_flops(args: tuple, out: Any) -> float:
    """The FLOP counter's (`bench.measure.flops.conv_backward_flops`), on the recorded op's arguments."""
    return conv_backward_flops(*(arg.shape if isinstance(arg, torch.Tensor) else arg for arg in args),
                               out_shape=[None if tensor is None else tensor.shape for tensor in out])


def _bytes(inputs: list[torch.Tensor], outputs: list[torch.Tensor], mutable: bool) -> int:
    """Each distinct tensor once: an in-place op's output is its input, read and written."""
    seen: dict[int, int] = {}
    for tensor in inputs + outputs:
        seen[id(tensor)] = _tensor_bytes(tensor)
    written = sum(_tensor_bytes(t) for t in outputs) if mutable else 0
    return sum(seen.values()) + written


def _tensor_bytes(tensor: torch.Tensor) -> int:
    # An expanded view reads its storage, not its numel: never more than the storage holds.
    return min(tensor.numel() * tensor.element_size(), tensor.untyped_storage().nbytes())


def step_ops(recorder: OpRecorder, micro_batch: int) -> StepOps:
    """The recorded ops split at the end of each micro-step's backward."""
    records = recorder.records
    first = recorder.marks[("backward", 0)]
    second = recorder.marks.get(("backward", 1), first)
    return StepOps({"first_micro": OpTable.of(records[:first]), "next_micro": OpTable.of(records[first:second]),
                    "update": OpTable.of(records[second:])}, micro_batch)
