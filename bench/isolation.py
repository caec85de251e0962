"""Fresh processes for isolated work, forked from a server that has torch imported.

A cell forked from the server costs a fork, not a multi-second `import torch`, and starts
with no CUDA context, no allocator history and no leaked graph from anything before it.
"""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable

SIGNAL_CHECK_S = 0.2
"""The longest a wait on a child blocks at once. A Ctrl-C the kernel hands to another thread of this process
(torch's intra-op pool) reaches Python only when the main thread next wakes: a wait of a cell's whole length
in one call held Ctrl-C back for as long (9-10 s seen under load)."""


def fork_server() -> multiprocessing.context.BaseContext:
    """A process context whose children start with torch, timm and the worker imported."""
    context = multiprocessing.get_context("forkserver")
    # bench.cli too: each child re-imports the main module (the `bench` script) before it starts.
    context.set_forkserver_preload(["bench.run.cell_measurement", "bench.cli"])
    return context


def call_in_child(function: Callable[..., Any], *args: Any) -> Any:
    """`function(*args)` in a fresh child process, e.g. to query CUDA without a context here."""
    with ProcessPoolExecutor(max_workers=1, mp_context=fork_server()) as pool:
        return pool.submit(function, *args).result()


def wait_in_slices(ready: Callable[[float], bool], timeout_s: float) -> bool:
    """Call `ready(slice_s)` (blocks at most `slice_s`; true once what is awaited happened) in slices of at
    most `SIGNAL_CHECK_S` until it is true or `timeout_s` has passed, so a signal is handled within a slice.

    >>> wait_in_slices(lambda slice_s: True, 5.0), wait_in_slices(lambda slice_s: False, 0.0)
    (True, False)
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if ready(max(0.0, min(SIGNAL_CHECK_S, deadline - time.monotonic()))):
            return True
        if time.monotonic() >= deadline:
            return False
