"""Fresh processes for isolated work, forked from a server that has torch imported.

A cell forked from the server costs a fork, not a multi-second `import torch`, and starts
with no CUDA context, no allocator history and no leaked graph from anything before it.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable


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
