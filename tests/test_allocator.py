"""The caching allocator's replay (bench.memory.allocator): what a step's allocations reserve on a CUDA device."""

import pytest

from bench.memory.allocator import CachingAllocator, OutOfMemory, replay, reserved_to_run
from bench.units import MIB


def test_requests_of_one_to_ten_mib_share_a_20_mib_segment():
    allocator = replay([(key, 3 * MIB) for key in range(6)])
    assert allocator.reserved_bytes == 20 * MIB  # six 3 MiB tensors, one segment
    assert replay([(0, 12 * MIB + 1)]).reserved_bytes == 14 * MIB  # from 10 MiB on: the request, in 2 MiB


def test_small_tensors_come_from_their_own_pool():
    allocator = replay([(0, 3 * MIB), (1, 4096)])
    assert allocator.reserved_bytes == 22 * MIB  # the 4 KiB tensor does not use the large segment's 17 MiB


def test_fragmented_segments_make_a_step_need_more_than_it_holds():
    # Six 3 MiB tensors fill a 20 MiB segment; freeing every other one leaves 9 MiB free but no hole of 8 MiB.
    events = [(key, 3 * MIB) for key in range(6)] + [(key, 0) for key in (0, 2, 4)] + [(9, 8 * MIB)]
    assert reserved_to_run(events) == 40 * MIB  # 17 MiB in use at the peak
    with pytest.raises(OutOfMemory):
        replay(events, 38 * MIB)


def test_freed_neighbours_merge_and_serve_a_larger_request():
    events = [(key, 3 * MIB) for key in range(6)] + [(key, 0) for key in (1, 2)] + [(9, 6 * MIB)]
    assert reserved_to_run(events) == 20 * MIB  # two adjacent 3 MiB blocks make the 6 MiB one


def test_unused_cached_segments_are_released_before_running_out():
    events = [(0, 12 * MIB), (1, 12 * MIB), (0, 0), (2, 14 * MIB)]
    assert replay(events).peak_reserved_bytes == 38 * MIB  # unbounded, the free 12 MiB segment stays cached
    assert replay(events, 26 * MIB).reserved_bytes == 26 * MIB  # at 26 MiB it is released for the 14 MiB one
    assert reserved_to_run(events) == 26 * MIB


def test_a_block_in_use_pins_its_whole_segment():
    allocator = CachingAllocator(capacity_bytes=24 * MIB)
    allocator.malloc(0, 2 * MIB)  # a 20 MiB segment
    allocator.malloc(1, 2 * MIB)  # same segment
    allocator.free(0)
    allocator.malloc(2, 12 * MIB)  # from the segment's free 16 MiB
    allocator.malloc(3, 4 * MIB)  # its last 4 MiB
    assert allocator.reserved_bytes == 20 * MIB
    with pytest.raises(OutOfMemory):  # 2 MiB of it are free; a 6 MiB request needs a new 20 MiB segment, and
        allocator.malloc(4, 6 * MIB)  # the segment in use cannot be released
