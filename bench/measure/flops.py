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

from bench.train.models import NUM_CLASSES, build_model

_COUNT_BATCH = 2  # every op here is linear in the batch; 2 keeps BatchNorm in training form


@dataclass(frozen=True)
class FlopsPerSample:
    model: float
    """Forward + backward, no recompute (the MFU numerator, PaLM's definition)."""
    hardware: float
    """What the hardware executes, activation-checkpoint recompute included (HFU)."""


def flops_per_sample(model_name: str, image_size: int, checkpointing: str) -> FlopsPerSample:
    """Training FLOPs per sample (2 per multiply-accumulate, forward + backward).

    Example:
        >>> f = flops_per_sample("test_vit", 32, "full")
        >>> f.hardware > f.model
        True
    """
    model_flops = _count(model_name, image_size, "off")
    hardware_flops = model_flops if checkpointing == "off" else _count(model_name, image_size, checkpointing)
    return FlopsPerSample(model=model_flops, hardware=hardware_flops)


@lru_cache(maxsize=None)
def _count(model_name: str, image_size: int, checkpointing: str) -> float:
    model = build_model(model_name, image_size, checkpointing=checkpointing, device="meta")
    images = torch.empty(_COUNT_BATCH, 3, image_size, image_size, device="meta")
    labels = torch.zeros(_COUNT_BATCH, dtype=torch.long, device="meta")
    counter = FlopCounterMode(display=False)
    with counter:
        F.cross_entropy(model(images), labels % NUM_CLASSES).backward()
    return counter.get_total_flops() / _COUNT_BATCH
