"""The CUDA caching allocator: what a tensor of n bytes takes, and what a step's allocations reserve. Plain arithmetic.

The rules are c10/cuda/CUDACachingAllocator.cpp's, the same from PyTorch 1.12 to 2.x under the default settings
(no `max_split_size_mb`, no expandable segments, no garbage-collection threshold), on one stream.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Sequence

from bench.units import MIB

# Every block is a multiple of kMinBlockSize = 512 bytes (round_size), and max_memory_allocated counts the
# rounded blocks.
CUDA_BLOCK_BYTES = 512
# Memory is reserved in segments of kSmallBuffer = 2 MiB (small pool) or rounded to kRoundLarge = 2 MiB (large
# pool), so reserved memory is a whole number of 2 MiB.
CUDA_SEGMENT_BYTES = 2 * MIB
SMALL_REQUEST_BYTES = MIB
"""kSmallSize: a request of up to 1 MiB is served from the small pool, whose segments are `CUDA_SEGMENT_BYTES`."""
LARGE_SEGMENT_BYTES = 20 * MIB
"""kLargeBuffer: the segment a request of 1-10 MiB gets (split among later requests of its size class)."""
MIN_LARGE_ALLOC_BYTES = 10 * MIB
"""kMinLargeAlloc: from here a new segment is the request itself, rounded up to `CUDA_SEGMENT_BYTES`."""

AllocatorEvent = tuple[int, int]
"""(key, bytes): bytes > 0 allocates a block for `key`, 0 frees `key`'s block."""


def allocated(nbytes: int, cuda: bool) -> int:
    """`nbytes` as the allocator hands it out: whole 512-byte blocks on CUDA, as asked elsewhere."""
    return _round_up(nbytes, CUDA_BLOCK_BYTES) if cuda else nbytes


def whole_segments(nbytes: float) -> int:
    """`nbytes` as the CUDA allocator reserves it: whole 2 MiB segments (`CUDA_SEGMENT_BYTES`).

    >>> whole_segments(1) // MIB, whole_segments(2 * MIB) // MIB, whole_segments(2 * MIB + 1) // MIB
    (2, 2, 4)
    """
    return _round_up(nbytes, CUDA_SEGMENT_BYTES)


def segment_bytes(nbytes: int) -> int:
    """The segment `cudaMalloc`s for a request of `nbytes` that no cached block can serve (get_allocation_size).

    >>> [segment_bytes(n) // MIB for n in (4096, 3 * MIB, 11 * MIB)]
    [2, 20, 12]
    """
    if nbytes <= SMALL_REQUEST_BYTES:
        return CUDA_SEGMENT_BYTES
    if nbytes < MIN_LARGE_ALLOC_BYTES:
        return LARGE_SEGMENT_BYTES
    return whole_segments(nbytes)


class OutOfMemory(Exception):
    """The replay needed a segment beyond its capacity, with every wholly free cached segment already released."""


@dataclass(eq=False)
class _Block:
    size: int
    address: int
    small: bool
    previous: _Block | None = None
    next: _Block | None = None
    free: bool = True
    requested: int = 0
    """In use: the rounded request it serves (a block not split holds more)."""


@dataclass
class CachingAllocator:
    """The caching allocator's bookkeeping, replayed without a device.

    A request is rounded to 512 bytes and served by the smallest cached free block of its pool (small: up to 1 MiB)
    that holds it (best fit); the block is split when the remainder is worth keeping (512 bytes in the small pool,
    over 1 MiB in the large). With none, a new segment (`segment_bytes`); when that would pass `capacity_bytes`,
    every cached segment with no block in use is released first (what a failed `cudaMalloc` triggers), and the
    request fails only if it still does not fit. A freed block merges with its free neighbours in its segment.
    """

    capacity_bytes: float = math.inf
    reserved_bytes: int = 0
    peak_reserved_bytes: int = 0
    peak_allocated_bytes: int = 0
    """The most requested bytes in use at once (in 512-byte blocks): no capacity below it runs the same requests."""
    _allocated_bytes: int = 0
    _free: dict[bool, list[tuple[int, int]]] = field(default_factory=lambda: {True: [], False: []})
    _blocks: dict[int, _Block] = field(default_factory=dict)
    """Free blocks by address (the sorted `_free` lists hold (size, address))."""
    _live: dict[int, _Block] = field(default_factory=dict)
    _next_address: int = 0

    def malloc(self, key: int, nbytes: int) -> None:
        size = max(_round_up(nbytes, CUDA_BLOCK_BYTES), CUDA_BLOCK_BYTES)
        small = size <= SMALL_REQUEST_BYTES
        pool = self._free[small]
        index = bisect.bisect_left(pool, (size, -1))
        if index < len(pool):
            block = self._blocks.pop(pool.pop(index)[1])
        else:
            block = self._new_segment(segment_bytes(size), small)
        remainder = block.size - size
        if remainder >= CUDA_BLOCK_BYTES if small else remainder > SMALL_REQUEST_BYTES:
            rest = _Block(remainder, block.address + size, small, block, block.next)
            if block.next is not None:
                block.next.previous = rest
            block.next, block.size = rest, size
            self._cache(rest)
        block.free, block.requested = False, size
        self._live[key] = block
        self._allocated_bytes += size
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self._allocated_bytes)

    def free(self, key: int) -> None:
        block = self._live.pop(key)
        block.free = True
        self._allocated_bytes -= block.requested
        for neighbour in (block.previous, block.next):
            if neighbour is not None and neighbour.free:
                self._uncache(neighbour)
                first, second = (neighbour, block) if neighbour is block.previous else (block, neighbour)
                first.size += second.size
                first.next = second.next
                if second.next is not None:
                    second.next.previous = first
                block = first
        self._cache(block)

    def _new_segment(self, size: int, small: bool) -> _Block:
        if self.reserved_bytes + size > self.capacity_bytes:
            self._release_cached()
            if self.reserved_bytes + size > self.capacity_bytes:
                raise OutOfMemory
        block = _Block(size, self._next_address, small)
        self._next_address += size
        self.reserved_bytes += size
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)
        return block

    def _release_cached(self) -> None:
        for small, pool in self._free.items():
            kept = []
            for size, address in pool:
                block = self._blocks[address]
                if block.previous is None and block.next is None:  # a whole segment, unused
                    del self._blocks[address]
                    self.reserved_bytes -= size
                else:
                    kept.append((size, address))
            self._free[small] = kept

    def _cache(self, block: _Block) -> None:
        bisect.insort(self._free[block.small], (block.size, block.address))
        self._blocks[block.address] = block

    def _uncache(self, block: _Block) -> None:
        pool = self._free[block.small]
        del pool[bisect.bisect_left(pool, (block.size, block.address))]
        del self._blocks[block.address]


def replay(events: Sequence[AllocatorEvent], capacity_bytes: float = math.inf) -> CachingAllocator:
    """`events` through a `CachingAllocator` of `capacity_bytes`; raises `OutOfMemory` where they do not run."""
    allocator = CachingAllocator(capacity_bytes)
    for key, nbytes in events:
        if nbytes:
            allocator.malloc(key, nbytes)
        else:
            allocator.free(key)
    return allocator


def reserved_to_run(events: Sequence[AllocatorEvent]) -> int:
    """The least reserved memory, in whole 2 MiB segments, with which `events` run: a device with this much free
    runs them, one with a segment less runs out of memory (the fragmentation of the cached segments counted).

    >>> mib = lambda n: n * MIB
    >>> reserved_to_run([(1, mib(12)), (2, mib(12)), (1, 0), (3, mib(14))]) // MIB  # 12 MiB free, 14 asked
    26
    >>> reserved_to_run([(1, mib(12)), (1, 0), (2, mib(14))]) // MIB  # the free 12 MiB segment is released
    14
    """
    unbounded = replay(events)
    low = whole_segments(unbounded.peak_allocated_bytes) // CUDA_SEGMENT_BYTES
    high = unbounded.peak_reserved_bytes // CUDA_SEGMENT_BYTES
    while low < high:
        middle = (low + high) // 2
        try:
            replay(events, middle * CUDA_SEGMENT_BYTES)
            high = middle
        except OutOfMemory:
            low = middle + 1
    return high * CUDA_SEGMENT_BYTES


def _round_up(nbytes: float, unit: int) -> int:
    return math.ceil(nbytes / unit) * unit
