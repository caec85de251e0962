"""One cell's process(es): forked from the server for one process, torchrun for several.

Whatever happens inside, the caller gets one outcome dict (status, measured columns or the
failure, when it started and how long it took), so an executor can run a cell here or on a
cluster node and write the same row.
"""

from __future__ import annotations

import multiprocessing
import signal
import time

from bench.isolation import fork_server
from bench.results.provenance import utc_now
from bench.results.schema import failure
from bench.run.cell_measurement import CellTask, child_main
from bench.run.ddp_launch import run_distributed, single_process_columns

_KILL_GRACE_S = 10.0


def run_cell(task: CellTask, timeout_s: float) -> dict:
    """One cell under a time limit: its outcome, stamped with its start (UTC) and duration."""
    started = utc_now()
    began = time.monotonic()
    if task.cell.world_size == 1:
        outcome = single_process_columns(run_isolated(task, timeout_s, fork_server()))
    else:
        outcome = run_distributed(task, timeout_s)
    return {**outcome, "started_utc": started, "duration_s": round(time.monotonic() - began, 3)}


def run_isolated(task: CellTask, timeout_s: float, context: multiprocessing.context.BaseContext) -> dict:
    """One cell in a child process: its outcome, or a timeout/crash outcome if it never reports."""
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=child_main, args=(task, sender), name=task.cell.cell_id)
    process.start()
    sender.close()  # only the child holds the sending end: its death reads as EOF here
    try:
        if not receiver.poll(timeout_s):
            return failure("timeout", "Timeout", f"no result within {timeout_s:g} s; the process was killed")
        try:
            return receiver.recv()
        except EOFError:
            process.join(_KILL_GRACE_S)
            return _crash_outcome(process.exitcode)
    finally:
        receiver.close()
        process.join(_KILL_GRACE_S)
        if process.is_alive():
            process.kill()
            process.join()


def _crash_outcome(exitcode: int | None) -> dict:
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        hint = " (the host may have run out of memory)" if name == "SIGKILL" else ""
        return failure("error", "WorkerCrashed", f"the cell's process died from {name}{hint}")
    return failure("error", "WorkerCrashed", f"the cell's process exited with code {exitcode} without a result")
