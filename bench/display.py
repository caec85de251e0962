"""Terminal output: progress while a grid runs, and the summary table when it ends."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)
from rich.table import Table

from bench.cell import Cell
from bench.equivalence import VARIANTS, Comparison
from bench.units import GIB

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
        progress.console.print(f"  {row['status']:<8} {_short(row['cell_id'])}  {_headline(row)}")
        progress.advance(task)

    with progress:
        yield on_start, on_row


def summary_table(title: str, rows: list[dict]) -> Table:
    table = Table(title=title, title_justify="left")
    for header in ("cell", "status", "peak GiB", "memory source", "samples/s", "MFU %", "note"):
        table.add_column(header, justify="right" if header in ("peak GiB", "samples/s", "MFU %") else "left")
    for row in rows:
        note = row.get("error_message") or "" if row["status"] != "ok" else ""
        table.add_row(_short(row["cell_id"]), row["status"], _gib(row.get("peak_memory_bytes")),
                      row.get("memory_source") or "", _number(row.get("samples_per_s"), 1),
                      _number(row.get("mfu_pct"), 1), note[:60])
    return table


def comparison_table(comparison: Comparison) -> Table:
    """One accumulated step against the large batch: what each side gave, and the difference."""
    c, s = comparison, comparison.settings
    table = Table(title=f"{s.model}, {s.image_size} px, {s.dtype} on {s.device}, {s.optimizer}; variant {c.variant}: "
                        f"{VARIANTS[c.variant].summary}", title_justify="left")
    for header in ("quantity", "large batch", f"K = {c.accum_steps}", "difference"):
        table.add_column(header, justify="left" if header == "quantity" else "right")
    table.add_row("samples per micro-batch", str(s.effective_batch), ", ".join(map(str, c.micro_batch_sizes)), "")
    table.add_row("loss, cross-entropy (nats)", f"{c.loss_large_batch:.6f}", f"{c.loss_accumulated:.6f}",
                  f"{c.loss_accumulated - c.loss_large_batch:+.2e}")
    table.add_row("gradient L2 norm", f"{c.grad_norm_large_batch:.4e}", f"{c.grad_norm_accumulated:.4e}",
                  f"ratio {c.grad_norm_ratio:.4f}")
    table.add_row("gradients, all parameters", "", "", f"relative L2 {c.grad_rel_l2:.2e}")
    for name, value in c.worst_parameters:
        table.add_row(f"  {name}", "", "", f"relative L2 {value:.2e}")
    if c.bn_stats_rel_l2 is not None:
        table.add_row("BatchNorm updates (most of any layer)", str(c.bn_updates_large_batch),
                      str(c.bn_updates_accumulated), "")
        table.add_row("BatchNorm running mean and variance, change", "", "",
                      f"relative L2 {c.bn_stats_rel_l2:.2e}")
    table.add_row("weights after the step, change", "", "", f"relative L2 {c.weights_rel_l2:.2e}")
    table.add_row("weights after the step", "", "", f"max abs {c.weights_max_abs_diff:.2e}")
    return table


def _headline(row: dict) -> str:
    if row["status"] != "ok":
        return f"{row.get('error_type', '')}: {row.get('error_message', '')}"[:100]
    return (f"peak {_gib(row['peak_memory_bytes'])} GiB, {_number(row['samples_per_s'], 1)} samples/s, "
            f"MFU {_number(row.get('mfu_pct'), 1)} %")


def _short(cell_id: str) -> str:
    return cell_id.rsplit("-", 1)[0]  # the hash suffix only disambiguates; leave it out here


def _gib(value: object) -> str:
    return "" if value in (None, "") else f"{float(value) / GIB:.3f}"


def _number(value: object, digits: int) -> str:
    return "" if value in (None, "") else f"{float(value):.{digits}f}"
