"""The error of reading a cell off the line through two traced micro-batches, on the shipped grids.

`bench plan` (and the probe's first guess) trace a configuration at two micro-batches and read every other
size off the straight line through them: peak memory and every op's FLOPs and bytes. Here each accumulated
cell (K >= 2) of the shipped grids' CUDA profile is traced in full and compared with that line: the peak's
relative error, and whether the op table has the same ops (count and classes) with the same FLOPs and bytes.
Writes one CSV row per cell and prints the summary.

    python scripts/trace_shortcut_error.py --out docs/latency/shortcut_error.csv
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench.grid.spec import load_grid
from bench.memory.fake_models import FakeModels
from bench.memory.traces import traced

REPO = Path(__file__).resolve().parent.parent
LINE_MICRO_BATCHES = (8, 16)
"""The sizes `bench plan` traces (`bench.speed.predict.TRACED_MICRO_BATCHES`)."""
COLUMNS = ["model", "precision", "checkpointing", "optimizer", "micro_batch", "peak_full_bytes", "peak_line_bytes",
           "peak_error_pct", "ops_full", "ops_line", "same_ops", "flops_error_pct", "bytes_error_pct", "seconds"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grids", nargs="+", default=["experiments/resnet50.toml", "experiments/vit_b16.toml",
                                                       "experiments/vit_l16.toml"])
    parser.add_argument("--only", action="append", default=[], metavar="AXIS=VALUE",
                        help="keep only cells with this axis value (repeatable)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    conditions = [tuple(item.split("=", 1)) for item in args.only]
    done = set()
    if args.out.exists():  # resumable: cells already written are skipped
        with args.out.open() as handle:
            done = {(r["model"], r["precision"], r["checkpointing"], r["optimizer"], int(r["micro_batch"]))
                    for r in csv.DictReader(handle)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    new_file = not args.out.exists()
    models = FakeModels()
    with args.out.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, COLUMNS)
        if new_file:
            writer.writeheader()
        for path in args.grids:
            cells = [c for c in load_grid(REPO / path, "cuda").cells if c.accum_steps >= 2
                     and all(str(getattr(c, axis)).lower() == value.lower() for axis, value in conditions)]
            configs = {}
            for cell in cells:
                configs.setdefault((cell.model, cell.precision, cell.checkpointing, cell.optimizer), []).append(cell)
            for (model, precision, checkpointing, optimizer), group in configs.items():
                todo = [c for c in group if (model, precision, checkpointing, optimizer, c.micro_batch) not in done]
                if not todo:
                    continue
                base = replace(group[0], accum_steps=2)
                line = [_trace(replace(base, micro_batch=m), models) for m in LINE_MICRO_BATCHES]
                (m1, m2), (p1, p2) = LINE_MICRO_BATCHES, [e.peak_reserved_bytes for e, _ in line]
                for cell in todo:
                    began = time.monotonic()
                    estimate, ops = _trace(replace(cell, accum_steps=2), models)
                    full, read = ops.for_step(2), line[0][1].at_micro_batch(line[1][1], cell.micro_batch).for_step(2)
                    peak_line = p1 + (p2 - p1) * (cell.micro_batch - m1) / (m2 - m1)
                    same = len(full.count) == len(read.count) and bool((full.op_class == read.op_class).all())
                    row = {"model": model, "precision": precision, "checkpointing": checkpointing,
                           "optimizer": optimizer, "micro_batch": cell.micro_batch,
                           "peak_full_bytes": estimate.peak_reserved_bytes, "peak_line_bytes": round(peak_line),
                           "peak_error_pct": round(100 * (peak_line / estimate.peak_reserved_bytes - 1), 3),
                           "ops_full": int(full.count.sum()), "ops_line": int(read.count.sum()), "same_ops": same,
                           "flops_error_pct": _error(read.flops, full.flops, read.count, full.count),
                           "bytes_error_pct": _error(read.bytes_moved, full.bytes_moved, read.count, full.count),
                           "seconds": round(time.monotonic() - began, 1)}
                    writer.writerow(row)
                    handle.flush()
                    print(f"{model} {precision} ckpt-{checkpointing} {optimizer} {cell.micro_batch}: peak "
                          f"{row['peak_error_pct']:+.3f} %, ops {row['ops_line']} vs {row['ops_full']}, FLOPs "
                          f"{row['flops_error_pct']:+.3f} %, bytes {row['bytes_error_pct']:+.3f} %", flush=True)
    with args.out.open() as handle:
        rows = list(csv.DictReader(handle))
    peaks = np.array([abs(float(r["peak_error_pct"])) for r in rows])
    print(f"{len(rows)} cells: peak |error| median {np.median(peaks):.3f} %, max {peaks.max():.3f} %; "
          f"same ops in {sum(r['same_ops'] == 'True' for r in rows)} of {len(rows)}")
    return 0


def _trace(cell, models: FakeModels) -> tuple:
    """(estimate, ops) of one full trace (the shared cache's, `bench.memory.traces`)."""
    trace = traced(cell, "cuda", models)[0]
    return trace.estimate, trace.ops


def _error(read: np.ndarray, full: np.ndarray, read_count: np.ndarray, full_count: np.ndarray) -> float:
    total = float((full * full_count).sum())
    return round(100 * (float((read * read_count).sum()) / total - 1), 3) if total else 0.0


if __name__ == "__main__":
    sys.exit(main())
