"""The CUDA caching allocator's rounding: what a tensor of n bytes takes, and what a peak reserves. Plain arithmetic."""

from __future__ import annotations

import math

from bench.units import MIB

# c10/cuda/CUDACachingAllocator.cpp: every block is a multiple of kMinBlockSize = 512 bytes
# (round_size), and max_memory_allocated counts the rounded blocks.
CUDA_BLOCK_BYTES = 512
# Same file: memory is reserved in segments of kSmallBuffer = 2 MiB (small pool) or rounded
# to kRoundLarge = 2 MiB (large pool), so reserved memory is a whole number of 2 MiB.
CUDA_SEGMENT_BYTES = 2 * MIB


def allocated(nbytes: int, cuda: bool) -> int:
    """`nbytes` as the allocator hands it out: whole 512-byte blocks on CUDA, as asked elsewhere."""
    return _round_up(nbytes, CUDA_BLOCK_BYTES) if cuda else nbytes


def whole_segments(nbytes: float) -> int:
    """`nbytes` as the CUDA allocator reserves it: whole 2 MiB segments (`CUDA_SEGMENT_BYTES`).

    >>> whole_segments(1) // MIB, whole_segments(2 * MIB) // MIB, whole_segments(2 * MIB + 1) // MIB
    (2, 2, 4)
    """
    return _round_up(nbytes, CUDA_SEGMENT_BYTES)


def _round_up(nbytes: float, unit: int) -> int:
    return math.ceil(nbytes / unit) * unit
