"""FLOPs per sample from torch.utils.flop_counter, counted on the meta device: the one FLOP counter.
A count is kept in the disk cache; torch is imported only to count.

Counting on meta costs no compute and no memory, and attention is counted: on meta,
scaled-dot-product attention decomposes into matmuls, whereas a real CPU run dispatches
`_scaled_dot_product_flash_attention_for_cpu`, which FlopCounterMode does not count.

torch's formula for a convolution's backward ignores the groups in the weight gradient (a
depthwise convolution's is counted channels times over); `conv_backward_flops` divides that term
by the groups. The throughput model's op recorder (`bench.measure.ops`) counts with it too, so the
MFU's numerator and the recorder's total agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from bench.cache import DiskCache, byte_count_problem
from bench.grid.model_ref import ModelSpec

if TYPE_CHECKING:
    from torch.utils.flop_counter import FlopCounterMode

_COUNT_BATCH = 2  # every op here is linear in the batch; 2 keeps BatchNorm in training form


@dataclass(frozen=True)
class FlopsPerSample:
    model: float
    """Forward + backward, no recompute (the MFU numerator, PaLM's definition)."""
    hardware: float
    """What the hardware executes, activation-checkpoint recompute included (HFU)."""


def flops_per_sample(model: str | ModelSpec, image_size: int, checkpointing: str) -> FlopsPerSample:
    """Training FLOPs per sample (2 per multiply-accumulate, forward + backward).

    Example:
        >>> f = flops_per_sample("test_vit", 32, "full")
        >>> f.hardware > f.model
        True
    """
    spec = model if isinstance(model, ModelSpec) else ModelSpec(model, image_size)
    model_flops = _count(spec, "off")
    hardware_flops = model_flops if checkpointing == "off" else _count(spec, checkpointing)
    return FlopsPerSample(model=model_flops, hardware=hardware_flops)


def forward_flops_per_sample(model: str | ModelSpec, image_size: int) -> float:
    """One forward pass's FLOPs per sample (no backward, no recompute).

    Training is about three forward passes (the backward twice the forward; the first layer needs no input
    gradient, so a little less):
        >>> round(flops_per_sample("test_vit", 32, "off").model / forward_flops_per_sample("test_vit", 32), 1)
        2.9
    """
    spec = model if isinstance(model, ModelSpec) else ModelSpec(model, image_size)
    return _count(spec, "off", backward=False)


def counter() -> FlopCounterMode:
    """torch's FLOP counter with the grouped-convolution correction (`conv_backward_flops`)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    return FlopCounterMode(display=False, custom_mapping={torch.ops.aten.convolution_backward: conv_backward_flops})


def conv_backward_flops(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                        _output_padding, groups, output_mask, out_shape, **kwargs) -> int:
    """torch's `conv_backward_flop` (on shapes), its weight-gradient term divided by the groups."""
    from torch.utils.flop_counter import conv_flop_count

    def t(shape):
        return [shape[1], shape[0], *shape[2:]]
    flops = 0
    if output_mask[0]:
        flops += conv_flop_count(grad_out_shape, w_shape, out_shape[0], not transposed)
    if output_mask[1]:
        first, second = (grad_out_shape, x_shape) if transposed else (x_shape, grad_out_shape)
        flops += conv_flop_count(t(first), t(second), t(out_shape[1]), transposed=False) // max(int(groups), 1)
    return flops


@lru_cache(maxsize=None)
def _count(spec: ModelSpec, checkpointing: str, backward: bool = True) -> float:
    """FLOPs per sample, from the disk cache where an earlier command counted the same model (`bench.cache`)."""
    key = {**spec.cache_key(), "checkpointing": checkpointing, "backward": backward}
    stored = _COUNTS.get(key)
    if stored is not None:
        return float(stored)
    flops = _count_on_meta(spec, checkpointing, backward)
    _COUNTS.put(key, flops)
    return flops


def _count_on_meta(spec: ModelSpec, checkpointing: str, backward: bool) -> float:
    import torch
    import torch.nn.functional as F

    from bench.train.models import build_model

    model = build_model(spec, checkpointing=checkpointing, device="meta")
    images = torch.empty(_COUNT_BATCH, *spec.input_shape, device="meta")
    labels = torch.zeros(_COUNT_BATCH, dtype=torch.long, device="meta")
    counting = counter()
    with counting:
        if backward:
            F.cross_entropy(model(images), labels % spec.num_classes).backward()
        else:
            with torch.no_grad():
                model(images)
    return counting.get_total_flops() / _COUNT_BATCH


def _count_problem(value: object) -> str | None:
    """What makes a cached value no FLOP count, or None (as for a peak: a finite number above 0)."""
    problem = byte_count_problem(value)
    return problem and problem.replace("number of bytes", "FLOP count")


_COUNTS = DiskCache("flop-counts", sources=("measure/flops.py", "train", "grid/model_ref.py"), check=_count_problem)
