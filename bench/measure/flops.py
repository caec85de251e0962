"""FLOPs per sample from torch.utils.flop_counter, counted on the meta device.

Counting on meta costs no compute and no memory, and attention is counted: on meta,
scaled-dot-product attention decomposes into matmuls, whereas a real CPU run dispatches
`_scaled_dot_product_flash_attention_for_cpu`, which FlopCounterMode does not count.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from bench.grid.model_ref import ModelSpec
from bench.train.models import build_model

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


@lru_cache(maxsize=None)
def _count(spec: ModelSpec, checkpointing: str) -> float:
    model = build_model(spec, checkpointing=checkpointing, device="meta")
    images = torch.empty(_COUNT_BATCH, *spec.input_shape, device="meta")
    labels = torch.zeros(_COUNT_BATCH, dtype=torch.long, device="meta")
    counter = FlopCounterMode(display=False)
    with counter:
        F.cross_entropy(model(images), labels % spec.num_classes).backward()
    return counter.get_total_flops() / _COUNT_BATCH
