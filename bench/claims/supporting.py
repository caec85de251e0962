"""Supporting evidence: what the sources that cannot give a verdict still show, labelled as such.

A GPU-speed claim takes its verdict from GPU rows only. Without them the table shows, for the
reader to weigh, what the FLOP counter says (recompute adds work; a split of the batch does not)
and what a CPU measured (a CPU's timing is no verdict on a GPU, and varies with the CPU model and
its load). Each function returns lines; a line that cannot be read raises `Missing`.
"""

from __future__ import annotations

from pathlib import Path

from bench.claims.evidence import Missing, Rows, load_sources
from bench.claims.readings import pair, slower_by, time_change
from bench.measure.flops import flops_per_sample
from bench.units import GFLOP, gflop


def recompute_ratio(model: str, image_size: int, checkpointing: str) -> str:
    """The FLOP counter's hardware over model FLOPs: the work checkpointing's recompute adds."""
    flops = flops_per_sample(model, image_size, checkpointing)
    ratio = flops.hardware / flops.model
    return (f"FLOP counter ({model}, {image_size} px): checkpointing `{checkpointing}` runs {ratio:.2f}× the FLOPs "
            f"of the plain step ({flops.hardware / GFLOP:.1f} against {gflop(flops.model)} per sample); "
            f"if time followed FLOPs, {time_change(ratio - 1)}")


def same_flops(model: str, image_size: int, what: str) -> str:
    """FLOPs per sample do not depend on the split: any speed difference is efficiency, not work."""
    flops = flops_per_sample(model, image_size, "off").model
    return (f"FLOP counter ({model}, {image_size} px): {gflop(flops)} per sample for {what} alike, so a speed "
            "difference comes from kernel efficiency and per-kernel and host overhead, which only a GPU shows")


def cpu_slowdown(results_root: Path, experiment: str, where: dict, *, column: str = "", base: object = None,
                 other: object = None, ends: bool = False) -> list[str]:
    """What the CPU rows of `experiment` measured: `other` against `base` in `column`, or the two
    ends of the batch split (`ends`); labelled as a CPU's timing."""
    rows = load_sources(results_root, experiment).get("cpu")
    if rows is None:
        raise Missing(f"no CPU rows of {experiment}")
    read = Rows(rows.source, rows.folder, rows.frame)
    if ends:
        frame = read.all(**where).sort_values(["accum_steps", "cell_id"])
        fast, slow = frame.iloc[0], frame.iloc[-1]
        compared = f"{pair(slow)} against {pair(fast)}"
    else:
        fast, slow = read.one(**where, **{column: base}), read.one(**where, **{column: other})
        compared = f"{column} {other} against {base}"
    return [f"measured on CPU ({rows.device_name}, {int(fast.image_size)} px, {compared}): "
            f"{time_change(slower_by(fast, slow))} — a CPU's timing, no verdict on a GPU"]
