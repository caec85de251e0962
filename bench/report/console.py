"""Terminal output: progress while a grid runs, and the summary table when it ends."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from bench.grid.cell import Cell
from bench.units import gib

# Piped output (make, CI logs) gets wide lines instead of rich's 80-column default.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)


@contextmanager
def grid_progress(title: str) -> Iterator[tuple]:
    """Yields (on_start, on_row) callbacks for `run_grid` that drive a progress bar with ETA."""
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), console=console)
    task = progress.add_task(title, total=None)

    def on_start(cell: Cell, index: int, total: int) -> None:
        progress.update(task, total=total, description=f"{title}: {_short(cell.cell_id)}")

    def on_row(row: dict, index: int, total: int) -> None:
        # markup=False: an error message is the exception's text, whose brackets are not rich markup
        progress.console.print(f"  {row['status']:<8} {_short(row['cell_id'])}  {_headline(row)}", markup=False)
        progress.advance(task)

    with progress:
        yield on_start, on_row


def summary_table(title: str, rows: list[dict]) -> Table:
    """Every cell of the grid: status, peak, samples/s with the spread of its median step time, MFU."""
    table = Table(title=title, title_justify="left")
    for header in ("cell", "status", "peak GiB", "memory source", "samples/s", "±95 %", "MFU %", "note"):
        table.add_column(header, justify="right" if header in ("peak GiB", "samples/s", "±95 %", "MFU %") else "left")
    for row in rows:
        note = row.get("error_message") or "" if row["status"] != "ok" else ""
        table.add_row(_short(row["cell_id"]), row["status"], _gib(row.get("peak_memory_bytes")),
                      row.get("memory_source") or "", _number(row.get("samples_per_s"), 1), _spread(row),
                      _number(row.get("mfu_pct"), 1), Text(note[:60]))
    return table


def predicted_table(title: str, predicted) -> Table:
    """A DataFrame of predicted figures (the 224 px answer beside a CPU profile) as a terminal table."""
    table = Table(title=title, title_justify="left")
    for column in predicted.columns:
        table.add_column(str(column), justify="left" if predicted[column].dtype == object else "right")
    for values in predicted.itertuples(index=False):
        table.add_row(*("" if value is None else str(value) for value in values))
    return table


def _spread(row: dict) -> str:
    """Half the 95 % interval of the median step time, % of it; NOISY above the threshold."""
    rel = row.get("step_time_ci95_rel")
    if row["status"] != "ok" or rel in (None, ""):
        return ""
    noisy = str(row.get("noisy")).lower() == "true"
    busy = str(row.get("loaded")).lower() == "true"  # timed while other processes took the cell's cores
    return f"{50 * float(rel):.1f}" + (" NOISY" if noisy else "") + (" LOADED" if busy else "")


def _headline(row: dict) -> str:
    if row["status"] != "ok":
        return f"{row.get('error_type', '')}: {row.get('error_message', '')}"[:100]
    return (f"peak {_gib(row['peak_memory_bytes'])} GiB, {_number(row['samples_per_s'], 1)} samples/s, "
            f"MFU {_number(row.get('mfu_pct'), 1)} %")


def _short(cell_id: str) -> str:
    return cell_id.rsplit("-", 1)[0]  # the hash suffix only disambiguates; leave it out here


def _gib(value: object) -> str:
    return "" if value in (None, "") else gib(float(value), 3, unit=False)


def _number(value: object, digits: int) -> str:
    return "" if value in (None, "") else f"{float(value):.{digits}f}"


class Steps:
    """What `steps` yields: `say` prints a line (above the bar on a terminal), `advance` counts one step done."""

    def __init__(self, progress: Progress | None = None, task: int | None = None) -> None:
        self._progress, self._task = progress, task

    def say(self, text: str) -> None:
        if self._progress is None:
            print(text, flush=True)
        else:
            self._progress.console.print(text, markup=False, highlight=False)

    def expect(self, more: int) -> None:
        """`more` steps to come, beyond those counted so far (a total learnt as the work is found)."""
        if self._progress is not None:
            (task,) = [task for task in self._progress.tasks if task.id == self._task]
            self._progress.update(self._task, total=(task.total or 0) + more)

    def advance(self, description: str = "") -> None:
        if self._progress is not None:
            self._progress.update(self._task, advance=1, **({"description": description} if description else {}))


@contextmanager
def steps(total: int | None, interactive: bool, title: str = "") -> Iterator[Steps]:
    """A progress bar with ETA over `total` steps when `interactive` (stdout and stderr are terminals);
    otherwise nothing but the lines `say` prints, so piped output stays quiet."""
    if not interactive:
        yield Steps()
        return
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TextColumn("eta"), TimeRemainingColumn(), console=console, transient=True)
    task = progress.add_task(title, total=total)
    with progress:
        yield Steps(progress, task)
