"""Run a grid: every cell in its own process, each row written the moment its cell ends.

Isolation: an OOM, a fragmented allocator or a leaked graph in one cell cannot change
the next. Cells are forked from a server that has torch and timm imported already, so a
fresh process costs a fork rather than a multi-second import.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from bench.cell import Cell
from bench.device import DeviceInfo
from bench.isolation import fork_server
from bench.measure.flops import FlopsPerSample, flops_per_sample
from bench.measure.peak import device_peak
from bench.provenance import git_state, library_versions
from bench.results import RunsFile
from bench.spec import Grid
from bench.worker import CellTask, child_main, first_line

FAILED_STATUSES = ("error", "timeout")
_KILL_GRACE_S = 10.0


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    results_root: Path = Path("results")
    force: bool = False
    """Re-measure every cell, replacing earlier rows."""
    retry_failed: bool = False
    """Re-measure cells whose earlier row is an error or a timeout."""
    timeout_s: float | None = None
    """Overrides the grid's run.timeout_s."""
    memory_limit_gib: float | None = None


def results_dir(grid: Grid, device: DeviceInfo, results_root: Path) -> Path:
    return Path(results_root) / grid.name / device.tag


def cells_to_run(grid: Grid, existing: dict[str, dict], options: RunOptions) -> list[Cell]:
    """Cells without a row yet, plus those `--force` or `--retry-failed` asks for again."""
    def wanted(cell: Cell) -> bool:
        row = existing.get(cell.cell_id)
        return options.force or row is None or (options.retry_failed and row["status"] in FAILED_STATUSES)
    return [cell for cell in grid.cells if wanted(cell)]


def run_grid(grid: Grid, device: DeviceInfo, options: RunOptions,
             on_row: Callable[[dict, int, int], None] | None = None,
             on_start: Callable[[Cell, int, int], None] | None = None) -> list[dict]:
    """Measure the grid's missing cells; returns every row of the grid's cells, old and new."""
    runs = RunsFile(results_dir(grid, device, options.results_root) / "runs.csv")
    existing = {row["cell_id"]: row for row in runs.rows()}
    todo = cells_to_run(grid, existing, options)
    peaks = {precision: device_peak(device, precision) for precision in sorted({c.precision for c in todo})}
    provenance = _provenance()
    timeout_s = options.timeout_s or grid.run.timeout_s
    context = fork_server()
    for index, cell in enumerate(todo):
        if on_start:
            on_start(cell, index, len(todo))
        task = CellTask(cell, device, peaks[cell.precision], _flops_or_none(cell), options.memory_limit_gib,
                        runner_pid=os.getpid())
        started = datetime.now(timezone.utc)
        began = time.monotonic()
        outcome = run_isolated(task, timeout_s, context)
        row = {**describe_cell(cell, device), **provenance, **outcome,
               "started_utc": started.isoformat(timespec="seconds"),
               "duration_s": round(time.monotonic() - began, 3)}
        runs.write(row)
        if on_row:
            on_row(row, index, len(todo))
    by_id = {row["cell_id"]: row for row in runs.rows()}
    return [by_id[cell.cell_id] for cell in grid.cells if cell.cell_id in by_id]


def run_isolated(task: CellTask, timeout_s: float, context: multiprocessing.context.BaseContext) -> dict:
    """One cell in a child process: its outcome, or a timeout/crash outcome if it never reports."""
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=child_main, args=(task, sender), name=task.cell.cell_id)
    process.start()
    sender.close()  # only the child holds the sending end: its death reads as EOF here
    try:
        if not receiver.poll(timeout_s):
            return {"status": "timeout", "error_type": "Timeout",
                    "error_message": f"no result within {timeout_s:g} s; the process was killed"}
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


def describe_cell(cell: Cell, device: DeviceInfo) -> dict:
    """The configuration and device columns every row carries, whatever its outcome."""
    return {"cell_id": cell.cell_id, **cell.to_dict(), "effective_batch": cell.effective_batch,
            "device_type": device.type, "device_name": device.name, "device_tag": device.tag,
            "cpu_threads": device.threads}


def _crash_outcome(exitcode: int | None) -> dict:
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        hint = " (the host may have run out of memory)" if name == "SIGKILL" else ""
        return {"status": "error", "error_type": "WorkerCrashed",
                "error_message": f"the cell's process died from {name}{hint}"}
    return {"status": "error", "error_type": "WorkerCrashed",
            "error_message": f"the cell's process exited with code {exitcode} without a result"}


def _flops_or_none(cell: Cell) -> FlopsPerSample | None:
    try:
        return flops_per_sample(cell.model, cell.image_size, cell.checkpointing)
    except Exception as exc:  # noqa: BLE001 - FLOPs are one column; the cell still runs
        print(f"warning: FLOPs of {cell.model} could not be counted ({first_line(exc)}); MFU left empty")
        return None


def _provenance() -> dict:
    commit, dirty = git_state()
    return {"git_commit": commit, "git_dirty": dirty, **library_versions()}
