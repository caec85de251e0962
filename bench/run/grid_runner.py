"""Run a grid: every cell in its own process, each row written the moment its cell ends.

Isolation: an OOM, a fragmented allocator or a leaked graph in one cell cannot change
the next (`bench.run.cell_process`: a fork from a server that has torch and timm imported for one
process, torchrun for several). Where the cells run is the executor's business
(`bench.run.executors`: here, or as SLURM jobs); the rows and the resume are the same.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

from bench.grid.cell import Cell
from bench.grid.model_ref import ModelSpec
from bench.grid.spec import Grid, with_world_size
from bench.measure.device import DeviceInfo
from bench.measure.failure import first_line
from bench.measure.flops import FlopsPerSample, flops_per_sample
from bench.measure.host import QuietPolicy
from bench.measure.timing import TimingPolicy
from bench.results.peaks import ensure_peak
from bench.results.provenance import new_run_id, provenance
from bench.results.rows import cell_row
from bench.results.store import RowNotWritten, RunsFile, preflight, results_folder
from bench.run.cell_measurement import CellTask
from bench.run.executors import ExecutorName, SlurmOptions, make_executor
from bench.train.data import ImageData, open_data

FAILED_STATUSES = ("error", "timeout")


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
    nproc: int | None = None
    """Runs every cell on this many processes, overriding the grid's world_size."""
    executor: ExecutorName = "local"
    """`local`: cells one after another here; `slurm`: each cell a SLURM job (submitit)."""
    slurm: SlurmOptions = field(default_factory=SlurmOptions)
    """The jobs' parameters when `executor` is `slurm`."""
    data: ImageData | None = None
    """The data set loader cells read (`bench run --data-dir`, resolved and checked before any cell
    runs); None: the generated ImageNet-like set, made on first use."""
    threads: int | None = None
    """Intra-op threads per cell on a CPU (`--threads`), over the grid's run.threads and the thread budget."""
    require_quiet: bool = False
    """`--require-quiet`: a cell timed under foreign load is measured again, then recorded as a failure."""
    quiet_wait_s: float | None = None
    """Overrides the grid's run.quiet_wait_s."""


def cell_device(grid: Grid, device: DeviceInfo, options: RunOptions) -> DeviceInfo:
    """The device as the grid's cells use it: on a CPU, with the threads `--threads` or the grid asks for."""
    threads = options.threads or grid.run.threads
    return replace(device, threads=threads) if device.type == "cpu" and threads else device


def timing_policy(grid: Grid, cell: Cell) -> TimingPolicy:
    """How the cell is warmed up and timed: the grid's minimum counts, its interval target and budget."""
    if not grid.run.adaptive_timing:
        return TimingPolicy(min_steps=cell.measured_steps, target_ci95_rel=None, min_warmup_steps=cell.warmup_steps,
                            max_extra_warmup_steps=0)
    return TimingPolicy(min_steps=cell.measured_steps, target_ci95_rel=grid.run.target_ci95_rel,
                        budget_s=grid.run.timing_budget_s, min_warmup_steps=cell.warmup_steps)


def results_dir(grid: Grid, device: DeviceInfo, results_root: Path) -> Path:
    """`<results_root>/<experiment>/<device tag>`, checked to lie inside the root."""
    return results_folder(results_root, grid.name, device.tag)


@dataclass(frozen=True)
class MeasurePlan:
    """What a run of a grid will do with the rows already in its folder."""

    todo: tuple[Cell, ...]
    """Cells to measure now."""
    kept: dict[str, int]
    """Cells left alone because they have a row, by that row's status."""
    again: int = 0
    """Cells to measure that already have a row (`--force`, `--retry-failed`): their rows stay, the new ones are
    appended."""

    def describe(self, runs: Path) -> str:
        """One line for the user, e.g. `28 to measure; 0 already have rows in <runs>`.

        >>> print(MeasurePlan((), {"ok": 22, "timeout": 6}).describe(Path("r/runs.csv")))
        0 to measure: 28 already have rows in r/runs.csv (22 ok, 6 timeout): --retry-failed measures the 6 failed \
again, --force every cell
        >>> print(MeasurePlan((None,) * 20, {}, again=20).describe(Path("r/runs.csv")))
        20 to measure; all 20 again: their rows in r/runs.csv stay, the new ones are appended (REPORT.md's "Run to \
run" sets them side by side)
        """
        kept = sum(self.kept.values())
        line = f"{len(self.todo)} to measure"
        if self.again:
            which = f"all {self.again}" if self.again == len(self.todo) else f"{self.again} of them"
            line += (f"; {which} again: their rows in {runs} stay, the new ones are appended (REPORT.md's \"Run to "
                     "run\" sets them side by side)")
            return line if not kept else line + f"; {kept} others already have rows and are left alone"
        if not kept:
            return f"{line}; none has a row in {runs} yet"
        statuses = ", ".join(f"{count} {status}" for status, count in sorted(self.kept.items(), key=lambda kv: -kv[1]))
        line += f"{':' if not self.todo else ';'} {kept} already have rows in {runs} ({statuses})"
        failed = sum(self.kept.get(status, 0) for status in FAILED_STATUSES)
        if failed:
            line += f": --retry-failed measures the {failed} failed again, --force every cell"
        else:
            line += ": --force measures them again"
        return line


def measure_plan(grid: Grid, existing: dict[str, dict], options: RunOptions) -> MeasurePlan:
    """The cells `run_grid` will measure, and what the folder's rows already hold for the others."""
    todo = cells_to_run(grid, existing, options)
    measuring = {cell.cell_id for cell in todo}
    kept: dict[str, int] = {}
    for cell in grid.cells:
        if cell.cell_id not in measuring:
            status = existing[cell.cell_id]["status"]
            kept[status] = kept.get(status, 0) + 1
    return MeasurePlan(tuple(todo), kept, again=len(measuring & set(existing)))


def cells_to_run(grid: Grid, existing: dict[str, dict], options: RunOptions) -> list[Cell]:
    """Cells without a row yet, plus those `--force` or `--retry-failed` asks for again."""
    def wanted(cell: Cell) -> bool:
        row = existing.get(cell.cell_id)
        return options.force or row is None or (options.retry_failed and row["status"] in FAILED_STATUSES)
    return [cell for cell in grid.cells if wanted(cell)]


def existing_rows(grid: Grid, device: DeviceInfo, options: RunOptions) -> dict[str, dict]:
    """The rows the grid's runs file holds now, by cell id (none when there is no file yet)."""
    runs = RunsFile(results_dir(grid, device, options.results_root) / "runs.csv")
    return {row["cell_id"]: row for row in runs.rows()}


def run_grid(grid: Grid, device: DeviceInfo, options: RunOptions,
             on_row: Callable[[dict, int, int], None] | None = None,
             on_start: Callable[[Cell, int, int], None] | None = None) -> list[dict]:
    """Measure the grid's missing cells under the results root's lock (re-entrant: `bench run` already holds
    it); returns every row of the grid's cells, old and new."""
    from bench.results.lock import runner_lock

    with runner_lock(options.results_root, within=True):  # one runner per results root, library or CLI
        return _run_grid(grid, device, options, on_row, on_start)


def _run_grid(grid: Grid, device: DeviceInfo, options: RunOptions, on_row: Callable[[dict, int, int], None] | None,
              on_start: Callable[[Cell, int, int], None] | None) -> list[dict]:
    if options.nproc is not None:
        grid = with_world_size(grid, options.nproc)
    device = cell_device(grid, device, options)
    quiet = QuietPolicy(wait_s=grid.run.quiet_wait_s if options.quiet_wait_s is None else options.quiet_wait_s,
                        require=options.require_quiet)
    folder = results_dir(grid, device, options.results_root)
    runs = RunsFile(folder / "runs.csv")
    todo = cells_to_run(grid, existing_rows(grid, device, options), options)  # a corrupt file stops the grid here
    if todo:
        runs.refuse_links()
        preflight(folder)  # a folder that cannot take rows fails before anything is measured
        for note in (runs.repair_torn_tail(), runs.upgrade_older_header()):  # an earlier version's header:
            if note:                                                          # rewritten once, before measuring
                print(note, file=sys.stderr)
    peaks = {precision: ensure_peak(device, precision, options.results_root)
             for precision in sorted({c.precision for c in todo})}
    stamp = {**provenance(), "run_id": new_run_id()}
    data = options.data
    if data is None and any(cell.input != "synthetic" for cell in todo):
        data = open_data(None)
    flops = flops_by_cell(todo)
    tasks = [CellTask(cell, device, peaks[cell.precision], flops[cell.cell_id], options.memory_limit_gib,
                      runner_pid=os.getpid(), data=None if cell.input == "synthetic" else data,
                      timing=timing_policy(grid, cell), quiet=quiet) for cell in todo]
    executor = make_executor(options.executor, options.slurm)
    finished = executor.run(tasks, options.timeout_s or grid.run.timeout_s, on_start)
    with contextlib.closing(finished):  # an interrupted grid stops (or cancels) what still runs
        for index, (task, outcome) in enumerate(finished):
            row = cell_row("measured", task.cell, device, stamp, outcome)
            write_or_show(runs, row)
            if on_row:
                on_row(row, index, len(todo))
    by_id = {row["cell_id"]: row for row in runs.rows()}
    return [by_id[cell.cell_id] for cell in grid.cells if cell.cell_id in by_id]


def write_or_show(runs: RunsFile, row: dict) -> None:
    """Write `row`; when the disk refuses, print it (so the measurement is not lost) and stop the grid."""
    try:
        runs.write(row)
    except RowNotWritten as exc:
        sys.stdout.write(f"# row of {row['cell_id']}, not written to {runs.path}:\n{exc.row_text}")
        sys.stdout.flush()
        raise


def flops_by_cell(cells: Sequence[Cell]) -> dict[str, FlopsPerSample | None]:
    """Each cell's FLOPs per sample, counted once per configuration; a model whose FLOPs cannot be
    counted is one warning, however many cells it has (MFU left empty)."""
    counted: dict[tuple, FlopsPerSample | None] = {}
    failed: set[str] = set()
    by_cell = {}
    for cell in cells:
        key = (ModelSpec.of(cell), cell.image_size, cell.checkpointing)
        if key not in counted:
            counted[key] = None
            if cell.model not in failed:
                try:
                    counted[key] = flops_per_sample(*key)
                except Exception as exc:  # noqa: BLE001 - FLOPs are one column; the cell still runs
                    failed.add(cell.model)
                    print(f"warning: FLOPs of {cell.model} could not be counted ({first_line(exc)}); MFU left empty")
        by_cell[cell.cell_id] = counted[key]
    return by_cell
