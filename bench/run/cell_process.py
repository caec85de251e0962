"""One cell's process(es): forked from the server for one process, torchrun for several.

Whatever happens inside, the caller gets one outcome dict (status, measured columns or the
failure, when it started and how long it took, how loaded the host was; each column computed by
`bench.results.rows` from what the cell's process sent back), so an executor can run
a cell here or on a cluster node and write the same row. Before a cell, the runner waits (bounded)
for other work to leave the cell's cores free; a measurement timed under foreign load says so
(`loaded`), and under `--require-quiet` is taken again and, still loaded, recorded as a failure. A
measurement whose median step time has a wide interval (`noisy`) is taken once more in a fresh
process and the narrower kept.
"""

from __future__ import annotations

import multiprocessing
import signal
import sys
import time

from bench.isolation import fork_server, wait_in_slices
from bench.measure.host import cpu_times, load_average_1m, machine_cpus, steal_pct, wait_for_quiet
from bench.results.provenance import utc_now
from bench.results.rows import (
    ProcessMeasurement,
    attempt_columns,
    failure,
    keep_narrower,
    measured_once,
    one_process_columns,
)
from bench.run.cell_measurement import CellTask, child_main, host_threads
from bench.run.ddp_launch import run_distributed

_KILL_GRACE_S = 10.0


def run_cell(task: CellTask, timeout_s: float) -> dict:
    """One cell under a time limit: its outcome, stamped with its start (UTC), duration and host load;
    measured again when it was timed under load (`--require-quiet`) or, once, when it is noisy and was timed to an
    interval target (a grid of exactly its steps, `adaptive_timing = false`, is measured once: its row says noisy)."""
    started, load = utc_now(), load_average_1m()
    began, times = time.monotonic(), cpu_times()
    waited_s = _wait_for_quiet(task)
    outcome = _measure(task, timeout_s)
    attempts = 1
    while task.quiet.require and outcome["status"] == "ok" and outcome.get("loaded") and attempts <= task.quiet.retries:
        waited_s += _wait_for_quiet(task)
        outcome, attempts = _measure(task, timeout_s), attempts + 1
    if task.quiet.require and outcome["status"] == "ok" and outcome.get("loaded"):
        outcome = machine_busy(task, outcome, attempts)
    elif outcome["status"] == "ok" and outcome.get("noisy") and task.timing_policy.target_ci95_rel is not None:
        outcome = keep_narrower(outcome, _measure(task, timeout_s))  # exactly N steps (no target): once, flagged
    elif outcome["status"] == "ok":
        outcome = measured_once(outcome)
    return {**outcome, **attempt_columns(started_utc=started, duration_s=time.monotonic() - began, load_avg_1m=load,
                                         load_avg_1m_after=load_average_1m(), quiet_wait_s=waited_s,
                                         cpu_steal_pct=steal_pct(times, cpu_times()))}


def _wait_for_quiet(task: CellTask) -> float:
    """Seconds waited for other work to leave the cell's cores free (bounded by the quiet policy)."""
    needed = host_threads(task)

    def tell(foreign: float | None) -> None:
        print(f"{task.cell.cell_id}: waiting up to {task.quiet.wait_s:g} s for the machine to quieten: other "
              f"processes keep {foreign:.2f} of {machine_cpus()} cores busy, the cell needs {needed}",
              file=sys.stderr, flush=True)
    waited_s, _ = wait_for_quiet(needed, task.quiet.wait_s, tell)
    return waited_s


def machine_busy(task: CellTask, outcome: dict, attempts: int) -> dict:
    """A cell that was timed under foreign load every time it ran, as the failure `--require-quiet` records."""
    return failure("error", "MachineBusy",
                   f"other processes kept {outcome['foreign_load_cores']:.2f} cores busy while the steps were timed "
                   f"(the cell needs {host_threads(task)} of {machine_cpus()}); {attempts} measurements, none quiet: "
                   "`bench run --retry-failed` measures it again")


def _measure(task: CellTask, timeout_s: float) -> dict:
    if task.cell.world_size == 1:
        return run_isolated(task, timeout_s, fork_server())
    return run_distributed(task, timeout_s)


def run_isolated(task: CellTask, timeout_s: float, context: multiprocessing.context.BaseContext) -> dict:
    """One cell in a child process: its outcome (the measured columns, `bench.results.rows.one_process_columns`, or
    the failure's), or a timeout/crash outcome if it never reports."""
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=child_main, args=(task, sender), name=task.cell.cell_id)
    process.start()
    sender.close()  # only the child holds the sending end: its death reads as EOF here

    def exited(slice_s: float) -> bool:
        process.join(slice_s)
        return not process.is_alive()
    try:
        if not wait_in_slices(receiver.poll, timeout_s):
            return failure("timeout", "Timeout", f"no result within {timeout_s:g} s; the process was killed")
        try:
            outcome = receiver.recv()
        except EOFError:
            wait_in_slices(exited, _KILL_GRACE_S)
            return _crash_outcome(process.exitcode)
        wait_in_slices(exited, _KILL_GRACE_S)  # it has reported and is exiting
        if isinstance(outcome, ProcessMeasurement):
            return one_process_columns(outcome, task.cell, task.flops, task.peak)
        return outcome
    finally:
        receiver.close()
        if process.is_alive():  # timed out, interrupted (Ctrl-C, SIGTERM) or stuck: no grace, a timeout costs
            process.kill()      # its limit and an interrupt stops now
            process.join()


def _crash_outcome(exitcode: int | None) -> dict:
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        hint = " (the host may have run out of memory)" if name == "SIGKILL" else ""
        return failure("error", "WorkerCrashed", f"the cell's process died from {name}{hint}")
    return failure("error", "WorkerCrashed", f"the cell's process exited with code {exitcode} without a result")
