"""Does a peak fit a GPU? The one rule the estimator, the probe and the cost planner share.

A peak plus headroom (a fraction of it, kept free for what no measurement sees: fragmentation,
the CUDA context, a library's workspace) against the GPU's nominal memory (`bench/data/gpus.csv`).
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.measure.hardware import gpu_keys, gpu_spec
from bench.units import GIB

DEFAULT_HEADROOM = 0.10
"""Memory kept free above the peak, as a fraction of the peak."""


@dataclass(frozen=True)
class MemoryFit:
    """A peak plus headroom against a GPU's nominal memory."""

    required_bytes: float
    capacity_bytes: float

    @property
    def fits(self) -> bool:
        return self.required_bytes <= self.capacity_bytes

    @property
    def spare_gib(self) -> float:
        """Negative when it does not fit."""
        return (self.capacity_bytes - self.required_bytes) / GIB


def memory_fit(peak_bytes: float, headroom: float, memory_gib: float) -> MemoryFit:
    """Does `peak_bytes` plus `headroom` (a fraction of it) fit in `memory_gib` GiB?

    Example: a 37 GiB peak with 10 % headroom needs 40.7 GiB, more than an A100-40GB has:
        >>> memory_fit(37 * 2**30, 0.10, 40).fits
        False
    """
    return MemoryFit(peak_bytes * (1 + headroom), memory_gib * GIB)


def fitting_gpus(peak_bytes: float, headroom: float = DEFAULT_HEADROOM) -> list[str]:
    """Catalog GPUs whose nominal memory holds `peak_bytes` plus headroom.

    >>> fitting_gpus(30 * 2**30, 0.10)
    ['A100-40GB', 'A100-80GB', 'A100-80GB-PCIe', 'H100-80GB', 'H100-PCIe', 'H100-NVL', 'H200', 'B200', 'L40S', 'L40']
    """
    return [key for key in gpu_keys() if memory_fit(peak_bytes, headroom, gpu_spec(key).memory_gib).fits]
