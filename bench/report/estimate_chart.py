"""The estimate chart: predicted peak memory against micro-batch, with GPU memory sizes drawn across.

One panel per model and precision, one line per configuration (checkpointing × optimizer, and any
other axis the panel's cells differ in, such as the memory format),
so no series hides under another (bf16 and fp16 predict the same bytes); which GPU holds
which configuration reads off the horizontal lines, the catalog's memory sizes. The y axis is
linear and spans the panel's predictions only (GPU sizes above them are named under the axis, not drawn
far above the curves); line style and marker say checkpointing, colour the optimizer (the
project-wide convention, `bench.report.charts`).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from bench.measure.hardware import gpu_keys, gpu_spec  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from bench.report.charts import CHECKPOINT_MARKERS, CHECKPOINT_STYLES, model_title, models  # noqa: E402
from bench.report.rows import PRECISION_ORDER, ordered  # noqa: E402
from bench.results.keys import SPLIT, configuration_key, key_columns, varying  # noqa: E402
from bench.results.read import read_runs  # noqa: E402
from bench.results.schema import ESTIMATE_COLUMNS  # noqa: E402
from bench.units import GIB  # noqa: E402

CHART_NAME = "memory_estimate.png"
OPTIMIZER_COLORS = {"adamw": "#1f77b4", "adamw8bit": "#9467bd", "sgd": "#2ca02c"}


def gpu_memory_lines() -> dict[float, str]:
    """Each distinct GPU memory size in the catalog, with the GPUs that have it.

    >>> gpu_memory_lines()[24.0]
    'L4, A10, A10G, RTX-3090, RTX-4090'
    """
    sizes: dict[float, list[str]] = {}
    for key in gpu_keys():
        sizes.setdefault(gpu_spec(key).memory_gib, []).append(key)
    return {size: ", ".join(names) for size, names in sorted(sizes.items())}


def write_estimate_chart(folder: Path) -> Path:
    """Draw `folder/runs.csv`'s estimated rows of one profile (CUDA when present) into `folder/memory_estimate.png`."""
    fig = estimate_figure(read_runs(Path(folder) / "runs.csv", ESTIMATE_COLUMNS))
    path = Path(folder) / CHART_NAME
    fig.savefig(path, dpi=100, metadata={"Software": None}, bbox_inches="tight")
    plt.close(fig)
    return path


def estimate_figure(rows: pd.DataFrame) -> Figure:
    """The estimate chart of `rows` (an estimate folder's runs): one panel per model and precision."""
    estimated = rows[rows.status == "estimated"]
    profile = "cuda" if (estimated.profile == "cuda").any() else "cpu"
    failed = rows[(rows.status != "estimated") & (rows.profile == profile)]
    estimated = estimated[estimated.profile == profile]
    # The CUDA prediction of reserved memory is what a GPU must hold; CPU estimates have tracked tensors.
    column = "peak_reserved_bytes" if profile == "cuda" else "peak_memory_bytes"
    panels = [(model, precision) for model in models(estimated)
              for precision in ordered(estimated[estimated.model == model].precision, PRECISION_ORDER)]
    columns = max(1, min(3, len(panels)))
    grid_rows = max(1, -(-len(panels) // columns))
    fig, axes = plt.subplots(grid_rows, columns, figsize=(5.2 * columns, 4.2 * grid_rows + 1.2), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax, (model, precision) in zip(flat, panels):
        _panel(ax, estimated[(estimated.model == model) & (estimated.precision == precision)], column, profile)
        ax.set_title(f"{model_title(estimated, model)}, {precision}", fontsize=9)
    for ax in flat[len(panels):]:
        ax.set_visible(False)
    experiment = estimated.experiment.iloc[0] if len(estimated) else ""
    fig.suptitle(f"{experiment}: estimated peak memory (profile {profile}, no device run)\n"
                 "dotted lines: GPU memory sizes of the catalog (the fits_gpus column adds the cost planner's "
                 "headroom)", fontsize=10)
    if len(failed):  # never silently missing
        reasons = "; ".join(f"{optimizer}: {error}" for optimizer, error in
                            sorted(set(zip(failed.optimizer, failed.error_type))))
        fig.text(0.01, 0.005, f"not estimated: {len(failed)} cells ({reasons})", fontsize=8)
    legend = {label: handle for ax in flat[:len(panels)] for handle, label in zip(*ax.get_legend_handles_labels())}
    handles, labels = list(legend.values()), list(legend)
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), fontsize=7, handlelength=4,
               bbox_to_anchor=(0.5, -0.02))
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


NAMED = ("model", "precision", "checkpointing", "optimizer", "micro_batch", "accum_steps")
"""What a line's panel, style and x axis already show."""


def _word(axis: str, value: object) -> str:
    """How a line's label names an axis that tells it from the panel's other lines ("" for a false flag)."""
    if axis == "channels_last":
        return "channels-last" if value else ""
    if isinstance(value, bool):
        return axis if value else ""
    return f"{axis} {value}"


def _panel(ax, cells: pd.DataFrame, column: str, profile: str) -> None:
    lines_of: dict[tuple, list] = {}  # one line per configuration (`bench.results.keys`), in order of appearance
    for label, row in zip(cells.index, cells.to_dict("records")):
        lines_of.setdefault(configuration_key(row, ignore=SPLIT), []).append(label)
    told = {*varying(lines_of), "channels_last"}  # channels-last is named wherever it is on
    apart = [name for name in key_columns() if name in told and name not in NAMED]
    for key, labels in lines_of.items():
        lines = cells.loc[labels].sort_values("micro_batch")
        config = dict(key)
        ckpt, optimizer = config["checkpointing"], config["optimizer"]
        words = filter(None, (_word(name, config[name]) for name in apart))
        ax.plot(lines.micro_batch, lines[column].astype(float) / GIB, color=OPTIMIZER_COLORS.get(optimizer, "black"),
                linestyle=CHECKPOINT_STYLES.get(ckpt, ":"), marker=CHECKPOINT_MARKERS.get(ckpt, "s"),
                label=", ".join([f"ckpt {ckpt}", optimizer, *words]))
    top_gib = float(cells[column].astype(float).max()) / GIB * 1.15
    ax.set_ylim(0, top_gib)
    if profile == "cuda":
        sizes = gpu_memory_lines()
        for gib in (gib for gib in sizes if gib <= top_gib):
            ax.axhline(gib, color="grey", linewidth=0.8, linestyle=":")
            ax.annotate(f"{gib:g} GiB", (1.0, gib), xycoords=("axes fraction", "data"), fontsize=7,
                        xytext=(3, 0), textcoords="offset points", va="center", color="grey")
        above = [gib for gib in sizes if gib > top_gib]
    else:
        above = []
    micro_batches = sorted(int(m) for m in set(cells.micro_batch))
    ax.set_xscale("log", base=2)
    ax.set_xticks(micro_batches, [str(m) for m in micro_batches])
    ax.minorticks_off()
    # Named under the axis, where no curve or GPU line can sit on the note.
    ax.set_xlabel("micro-batch" + (f"\nGPU sizes above this range: {', '.join(f'{gib:g}' for gib in above)} GiB"
                                   if above else ""))
    ax.set_ylabel("predicted peak reserved (GiB)" if profile == "cuda" else "predicted tracked peak (GiB)")
