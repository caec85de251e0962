"""Fresh processes for isolated work, forked from a server that has torch imported.

A cell forked from the server costs a fork, not a multi-second `import torch`, and starts
with no CUDA context, no allocator history and no leaked graph from anything before it.

No bench process imports from the working directory: a `timm.py` or `torch.py` lying where a user runs `bench`
must not run. Python puts that directory first on the path of `python -c` (the fork server) and `python -m`
(torchrun, `python -m bench`): the command takes it off its own path, every child started here gets
PYTHONSAFEPATH, and a cell's process takes it off the path it inherits. A model reference the user opted into
(`package.module:factory`) is looked up there after everything installed (`bench.grid.model_ref`).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver as forkserver
import os
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable, Mapping

SIGNAL_CHECK_S = 0.2
"""The longest a wait on a child blocks at once. A Ctrl-C the kernel hands to another thread of this process
(torch's intra-op pool) reaches Python only when the main thread next wakes: a wait of a cell's whole length
in one call held Ctrl-C back for as long (9-10 s seen under load)."""


def drop_working_directory() -> None:
    """Take the working directory (`''`, `.` or its path) off this process's `sys.path`."""
    here = os.getcwd()
    sys.path[:] = [entry for entry in sys.path if entry not in ("", ".") and os.path.abspath(entry) != here]


def safe_child_environment(environment: Mapping[str, str] = os.environ) -> dict[str, str]:
    """`environment` for an interpreter this process starts: PYTHONSAFEPATH stops `python -c`/`-m` putting the
    working directory first on its path, and PYTHONPATH names the folder this `bench` was imported from, so the
    child imports the same `bench` however this one was started (installed, or from a checkout)."""
    home = str(Path(__file__).resolve().parent.parent)
    paths = [entry for entry in environment.get("PYTHONPATH", "").split(os.pathsep)
             if entry not in ("", ".", home)]  # an empty entry would mean the working directory
    return {**environment, "PYTHONPATH": os.pathsep.join([home, *paths]), "PYTHONSAFEPATH": "1"}


_SAFE_PATH_VARIABLES = ("PYTHONPATH", "PYTHONSAFEPATH")

_PRELOAD: list[str] = []
"""What the fork server imports before it forks, in the order the modules registered (`preload_in_children`)."""


def preload_in_children(module: str) -> None:
    """Have the fork server import `module` when it starts, so every child it forks has it already. The modules
    register themselves when imported (the measurement module, the command line), so this one names none of them."""
    if module not in _PRELOAD:
        _PRELOAD.append(module)


def keep_working_directory_off_import_path() -> None:
    """For the `bench` command: nothing it imports, nor any interpreter it starts, comes from the working
    directory."""
    drop_working_directory()
    os.environ.update(safe_child_environment())


def fork_server() -> multiprocessing.context.BaseContext:
    """A process context whose children start with torch, timm and the worker imported."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(_PRELOAD))
    # Started here, not at the first child, so that it starts with the safe environment (it imports torch and
    # timm, and its children inherit it) without changing the environment of a program that calls the API.
    saved = {name: os.environ.get(name) for name in _SAFE_PATH_VARIABLES}
    os.environ.update({name: safe_child_environment()[name] for name in _SAFE_PATH_VARIABLES})
    try:
        forkserver.ensure_running()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return context


def start_fork_server_early(*modules: str) -> None:
    """Start the fork server now, importing `modules` besides those registered: for a command that will fork
    children, called before it imports torch itself, so that the server's imports run beside its own on another core
    instead of after them (the server would otherwise start at the first child)."""
    for module in modules:
        preload_in_children(module)
    # The server starts ignoring Ctrl-C (inherited across its exec): Python's forkserver ignores SIGINT only once
    # its preload is imported, and a Ctrl-C to the process group during those seconds, which now overlap this
    # process's own start, printed the server's KeyboardInterrupt traceback. Its children are cells, which ignore
    # Ctrl-C anyway: the runner decides what stops and kills them itself.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        fork_server()
    finally:
        signal.signal(signal.SIGINT, previous)


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
