"""Comparison charts. Each function takes rows and returns a matplotlib Figure; nothing here writes.

One row of panels per model (no line joins two models), each titled with the model, its image
size and its effective batch. Memory is drawn in GiB or MiB, whichever suits the data; cells that
did not finish (oom, error, timeout, skipped) are drawn as marked gaps with their status, never
left out silently.

One meaning per visual channel, in every chart of the project (these charts, the estimate chart in
`bench.report.estimate_chart`, the speed validation chart in `bench.report.speed_chart`):

- line style = activation checkpointing (`CHECKPOINT_STYLES`: off solid, full dashed);
- marker = activation checkpointing too (`CHECKPOINT_MARKERS`: off circle, full triangle), so
  scatter plots without lines still show it; a black cross marks a cell that was not measured;
- colour = the one thing a panel's series differ in beyond that: precision here
  (`PRECISION_COLORS`), the optimizer in the estimate chart (one panel per precision), the GPU in
  the validation chart (one panel per workload, training apart from inference).

Reference lines (the large batch, the frontier, GPU memory sizes, y = x and its error band) are
dotted or dashed in black or grey and always named in a legend or beside the line.

Legends are built from the plotted artists (never restyled by hand), and each panel's axis limits
come from its own data with a margin, so nothing is clipped.
"""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")  # files only; no display needed or wanted

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from bench.report.rows import (  # noqa: E402
    PRECISION_ORDER,
    ReportContext,
    ordered,
    pair_label,
    reference_optimizer,
)
from bench.units import byte_unit  # noqa: E402

PRECISION_COLORS = {"fp32": "#1f77b4", "bf16": "#ff7f0e", "fp16": "#2ca02c"}
CHECKPOINT_STYLES = {"off": "-", "full": "--"}  # any other (last-N, selective): dotted
CHECKPOINT_MARKERS = {"off": "o", "full": "^"}  # any other: a square
# What the traced peak holds, bottom to top: MemTracker's categories at the peak (they add up to
# the tracked peak) and, on CUDA, what the allocator held beyond the tensors the trace saw.
CATEGORIES = (  # (column, label, colour)
    ("tracked_params_bytes", "parameters", "#4c72b0"),
    ("tracked_grads_bytes", "gradients", "#dd8452"),
    ("tracked_optimizer_state_bytes", "optimizer state", "#55a868"),
    ("tracked_activations_bytes", "activations at the peak", "#c44e52"),
    ("tracked_temporaries_bytes", "temporaries at the peak", "#8172b3"),
    ("untracked_bytes", "allocator beyond tensors (inputs, workspaces)", "#937860"),
)
FAILED_MARK = dict(marker="x", color="black", linestyle="none", markersize=9)
PANEL_HEIGHT = 4.2


def memory_unit(values: pd.Series) -> tuple[float, str]:
    """(bytes per unit, name): GiB for data that reaches a GiB, MiB below.

    >>> memory_unit(pd.Series([3 * 2**20])), memory_unit(pd.Series([2**31]))
    ((1048576, 'MiB'), (1073741824, 'GiB'))
    """
    return byte_unit(pd.to_numeric(values, errors="coerce").max())


def models(rows: pd.DataFrame) -> list[str]:
    """The models in the rows, in the order they first appear."""
    return list(dict.fromkeys(rows.model))


def model_title(rows: pd.DataFrame, model: str) -> str:
    """`resnet50, 224 px, effective batch 128`."""
    cells = rows[rows.model == model]
    sizes = "/".join(str(int(size)) for size in sorted(set(cells.image_size)))
    batches = "/".join(str(int(batch)) for batch in sorted(set(cells.effective_batch)))
    return f"{model}, {sizes} px, effective batch {batches}"


def _figure(title: str, context: ReportContext, rows_of_panels: int, panels: int,
            width: float = 6.0) -> tuple[Figure, list[list]]:
    fig, axes = plt.subplots(rows_of_panels, panels, figsize=(width * panels, PANEL_HEIGHT * rows_of_panels + 0.8),
                             squeeze=False)
    fig.suptitle(f"{title}\n{context.subtitle}", fontsize=11)
    return fig, [list(row) for row in axes]


def _failed_note(ax, failed: pd.DataFrame) -> None:
    if failed.empty:
        return
    lines = [f"{pair_label(r.micro_batch, r.accum_steps)} {r.precision} ckpt {r.checkpointing} "
             f"{r.optimizer}: {r.status}" for r in failed.itertuples()]
    ax.text(0.01, 0.99, "not measured:\n" + "\n".join(lines[:8]) + ("\n…" if len(lines) > 8 else ""),
            transform=ax.transAxes, va="top", ha="left", fontsize=7,
            bbox=dict(boxstyle="round", facecolor="white", alpha=0.85))


def memory_by_micro_batch(rows: pd.DataFrame, context: ReportContext) -> Figure:
    """Peak memory against micro-batch, stacked by what the peak holds; per model, one panel per
    precision × checkpointing, with the activations one forward saved marked on each bar."""
    optimizer = reference_optimizer(rows)
    subset = rows[rows.optimizer == optimizer]
    layout = {model: [(p, c) for p in ordered(subset[subset.model == model].precision, PRECISION_ORDER)
                      for c in ordered(subset[subset.model == model].checkpointing, ("off", "full"))
                      if not subset[(subset.model == model) & (subset.precision == p)
                                    & (subset.checkpointing == c)].empty]
              for model in models(subset)}
    scale, unit = memory_unit(subset.peak_memory_bytes)
    fig, axes = _figure(f"{context.experiment}: what the peak holds ({optimizer})", context, len(layout),
                        max(len(panels) for panels in layout.values()), width=4.6)
    for axes_row, (model, panels) in zip(axes, layout.items()):
        for ax, (precision, ckpt) in zip(axes_row, panels):
            cells = subset[(subset.model == model) & (subset.precision == precision) & (subset.checkpointing == ckpt)]
            _stacked_memory(ax, cells.sort_values("micro_batch", ascending=False), scale, unit)
            ax.set_title(f"{model_title(rows, model)}\n{precision}, checkpointing {ckpt}", fontsize=9)
        for ax in axes_row[len(panels):]:
            ax.set_visible(False)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), fontsize=8)
    fig.tight_layout(rect=(0, 0.09 / len(layout), 1, 1))
    return fig


def _stacked_memory(ax, cells: pd.DataFrame, scale: float, unit: str) -> None:
    labels = [pair_label(r.micro_batch, r.accum_steps) for r in cells.itertuples()]
    positions = list(range(len(cells)))
    ok = (cells.status == "ok").to_numpy()
    bottom = [0.0] * len(cells)
    for column, label, colour in CATEGORIES:
        values = pd.to_numeric(cells[column], errors="coerce").fillna(0).astype(float)
        if column == "untracked_bytes" and not (values > 0).any():
            continue  # CPU rows: the trace sees every tensor
        heights = [v / scale if good else 0.0 for v, good in zip(values, ok)]
        ax.bar(positions, heights, bottom=bottom, color=colour, label=label, width=0.6)
        bottom = [b + h for b, h in zip(bottom, heights)]
    saved = pd.to_numeric(cells.activations_saved_bytes, errors="coerce")
    if saved.notna().any():
        ax.plot([p - 0.38 for p in positions], saved / scale, marker="_", markersize=12, mew=2.5, linestyle="none",
                color="#c44e52", label="activations one forward saved")
    reserved = pd.to_numeric(cells.peak_reserved_bytes, errors="coerce")
    if reserved.notna().any():
        ax.plot([p + 0.38 for p in positions], reserved / scale, marker="_", markersize=14, mew=2.5,
                linestyle="none", color="black", label="peak reserved")
    for position, row in zip(positions, cells.itertuples()):
        if row.status != "ok":
            ax.plot([position], [0], **FAILED_MARK)
            ax.annotate(row.status, (position, 0), textcoords="offset points", xytext=(0, 8), ha="center", fontsize=8)
    tops = [*bottom, *(saved / scale).dropna(), *(reserved / scale).dropna()]
    ax.set_ylim(0, max(tops, default=1.0) * 1.12 or 1.0)  # this panel's own data, with room above
    ax.set_xticks(positions, labels)
    ax.set_xlabel("micro-batch × accumulation steps")
    ax.set_ylabel(unit)


def throughput_and_mfu(rows: pd.DataFrame, context: ReportContext) -> Figure:
    """Samples/s (with the spread of the timed steps) and MFU against micro-batch, one row per model,
    one line per precision × checkpointing."""
    optimizer = reference_optimizer(rows)
    subset = rows[rows.optimizer == optimizer]
    names = models(subset)
    fig, axes = _figure(f"{context.experiment}: throughput and MFU against micro-batch ({optimizer})", context,
                        len(names), 2)
    kinds = sorted({source.split(":")[0] for source in subset.peak_flops_source if source})
    for (rate_ax, mfu_ax), model in zip(axes, names):
        cells_of_model = subset[subset.model == model]
        for precision in ordered(cells_of_model.precision, PRECISION_ORDER):
            for ckpt in ordered(cells_of_model.checkpointing, ("off", "full")):
                cells = cells_of_model[(cells_of_model.precision == precision)
                                       & (cells_of_model.checkpointing == ckpt)].sort_values("micro_batch")
                if cells.empty:
                    continue
                ok, failed = cells[cells.status == "ok"], cells[cells.status != "ok"]
                style = dict(color=PRECISION_COLORS.get(precision), linestyle=CHECKPOINT_STYLES.get(ckpt, ":"),
                             marker=CHECKPOINT_MARKERS.get(ckpt, "s"), label=f"{precision}, ckpt {ckpt}")
                rate_ax.plot(ok.micro_batch, ok.samples_per_s, **style)
                _spread(rate_ax, ok, PRECISION_COLORS.get(precision))
                mfu_ax.plot(ok.micro_batch, ok.mfu_pct, **style)
                for ax in (rate_ax, mfu_ax):
                    ax.plot(failed.micro_batch, [0] * len(failed), **FAILED_MARK)
        large_batch = cells_of_model.micro_batch.max()
        micro_batches = sorted(int(m) for m in set(cells_of_model.micro_batch))
        for ax, label in ((rate_ax, "samples/s"), (mfu_ax, "MFU (%)")):
            ax.axvline(large_batch, color="grey", linestyle=":", label=f"large batch ({int(large_batch)}×1)")
            ax.set_xscale("log", base=2)
            ax.set_xticks(micro_batches, [str(m) for m in micro_batches])
            ax.minorticks_off()
            ax.set_xlabel("micro-batch (effective batch fixed)")
            ax.set_ylabel(label)
            ax.set_ylim(bottom=0)
        rate_ax.set_title(f"{model_title(rows, model)}: samples/s (bars: p10-p90 of the timed steps)", fontsize=9)
        mfu_ax.set_title(f"MFU against the {' / '.join(kinds) or 'no known'} peak per precision", fontsize=9)
        rate_ax.legend(fontsize=7, handlelength=4)  # long enough to show the dashes between markers
        _failed_note(mfu_ax, cells_of_model[cells_of_model.status != "ok"])
    fig.tight_layout()
    return fig


def _spread(ax, ok: pd.DataFrame, colour: str | None) -> None:
    """Vertical bars from the samples/s of the p90 step time to that of the p10 one."""
    low = ok.effective_batch / (ok.step_time_p90_ms / 1e3)
    high = ok.effective_batch / (ok.step_time_p10_ms / 1e3)
    ax.vlines(ok.micro_batch, low, high, color=colour, linewidth=3, alpha=0.35)


def memory_sawtooth(rows: pd.DataFrame, context: ReportContext) -> Figure:
    """Memory after each forward, backward and the update inside one optimizer step: both ends, per model."""
    optimizer = reference_optimizer(rows)
    names = models(rows)
    fig, axes = _figure(f"{context.experiment}: memory inside one optimizer step ({optimizer})", context,
                        len(names), 1, width=9)
    for (ax,), model in zip(axes, names):
        cells = rows[(rows.model == model) & (rows.optimizer == optimizer)]
        precision = ordered(cells.precision, PRECISION_ORDER)[0] if len(cells) else ""
        subset = cells[(cells.precision == precision) & (cells.checkpointing == "off")]
        if subset.empty:
            subset = cells[cells.precision == precision]
        _sawtooth(ax, subset)
        ax.set_title(f"{model_title(rows, model)}, {precision}", fontsize=9)
    fig.tight_layout()
    return fig


def _sawtooth(ax, subset: pd.DataFrame) -> None:
    if subset.empty:
        ax.set_visible(False)
        return
    ends = subset.sort_values("micro_batch", ascending=False)
    ends = [ends.iloc[0], ends.iloc[-1]] if len(ends) > 1 else [ends.iloc[0]]
    scale, unit = memory_unit(subset.peak_memory_bytes)
    # Both series share one axis: micro-step events at their own index, the optimizer step
    # and zero_grad at the end, so the large batch's update lines up with the accumulated one's.
    slots = 2 * max(int(row.accum_steps) for row in ends) + 2
    ticks = [f"{kind}{i + 1}" for i in range(slots // 2 - 1) for kind in "fb"] + ["opt", "zero"]
    for row, colour in zip(ends, ("#1f77b4", "#d62728")):
        label = pair_label(row.micro_batch, row.accum_steps)
        if row.status != "ok" or not row.phase_memory:
            ax.plot([], [], **FAILED_MARK, label=f"{label}: {row.status}")
            continue
        phases = json.loads(row.phase_memory)
        ax.step([_event_slot(phase, step, slots) for phase, step, _ in phases], [p[2] / scale for p in phases],
                where="post", marker="o", color=colour, label=f"{label} ({len(phases)} events)")
    ax.set_xticks(range(slots), ticks, fontsize=7 if slots <= 20 else 5)
    ax.set_xlabel("after: f = forward, b = backward of micro-step n; opt = optimizer step; zero = zero_grad")
    ax.set_ylabel(f"{unit} allocated")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)


def _event_slot(phase: str, micro_step: int, slots: int) -> int:
    """x position of a traced event: f/b of micro-step i at 2i/2i+1; optimizer, zero_grad last."""
    return {"forward": 2 * micro_step, "backward": 2 * micro_step + 1,
            "optimizer": slots - 2, "zero_grad": slots - 1}[phase]


def optimizers_side_by_side(rows: pd.DataFrame, context: ReportContext) -> Figure:
    """Optimizer state and peak memory for each optimizer, bars grouped by precision, per model.

    Drawn at the split where most optimizers were measured (the larger micro-batch on a tie),
    checkpointing off when measured.
    """
    names = models(rows)
    fig, axes = _figure(f"{context.experiment}: optimizers side by side", context, len(names), 2)
    for axes_row, model in zip(axes, names):
        _optimizers(axes_row, rows[rows.model == model], model_title(rows, model))
    fig.tight_layout()
    return fig


def _optimizers(axes_row: list, cells: pd.DataFrame, title: str) -> None:
    ckpt = "off" if (cells.checkpointing == "off").any() else cells.checkpointing.iloc[0]
    candidates = cells[cells.checkpointing == ckpt]
    measured = candidates[candidates.status == "ok"].groupby("micro_batch").optimizer.nunique()
    micro = max(measured.index, key=lambda m: (measured[m], m)) if len(measured) else candidates.micro_batch.max()
    large = candidates[candidates.micro_batch == micro]
    optimizers = ordered(large.optimizer, ("adamw", "adamw8bit", "sgd"))
    precisions = ordered(large.precision, PRECISION_ORDER)
    width = 0.8 / max(len(precisions), 1)
    for ax, column, label in ((axes_row[0], "optimizer_state_bytes", "optimizer state"),
                              (axes_row[1], "peak_memory_bytes", "peak memory")):
        scale, unit = memory_unit(large[column])
        for offset, precision in enumerate(precisions):
            for position, optimizer in enumerate(optimizers):
                cell = large[(large.optimizer == optimizer) & (large.precision == precision)]
                x = position + (offset - (len(precisions) - 1) / 2) * width
                if cell.empty:
                    continue
                if cell.status.iloc[0] != "ok":
                    ax.plot([x], [0], **FAILED_MARK)
                    continue
                ax.bar(x, cell[column].iloc[0] / scale, width=width, color=PRECISION_COLORS.get(precision),
                       label=precision if position == 0 else None)
        ax.set_xticks(range(len(optimizers)), optimizers)
        ax.set_ylabel(f"{label} ({unit})")
        ax.set_title(f"{title}\n{pair_label(large.micro_batch.iloc[0], large.accum_steps.iloc[0])}, "
                     f"checkpointing {ckpt}: {label}", fontsize=9)
    axes_row[0].legend(fontsize=8)


def pareto_frontier(points: pd.DataFrame) -> pd.DataFrame:
    """Cells no other cell beats on both lower peak memory and higher samples/s.

    >>> pts = pd.DataFrame({"peak_gib": [1.0, 2.0, 3.0], "samples_per_s": [10.0, 5.0, 20.0]})
    >>> pareto_frontier(pts).peak_gib.tolist()
    [1.0, 3.0]
    """
    best, keep = float("-inf"), []
    for index, row in points.sort_values(["peak_gib", "samples_per_s"], ascending=[True, False]).iterrows():
        if row.samples_per_s > best:
            best = row.samples_per_s
            keep.append(index)
    return points.loc[keep]


def memory_throughput_tradeoff(rows: pd.DataFrame, context: ReportContext) -> Figure:
    """Every measured cell: peak memory against samples/s, with the frontier; one panel per model.

    Each point carries a number, and a key beside the panel says which cell each number is (a
    frontier cell is starred), so every point can be told apart however closely they pile up.
    """
    names = models(rows)
    most = max((int((rows[rows.model == model].status == "ok").sum()) for model in names), default=0)
    fig, axes = plt.subplots(len(names), 1, figsize=(12, max(PANEL_HEIGHT, 0.17 * most + 1.6) * len(names) + 0.8),
                             squeeze=False)
    fig.suptitle(f"{context.experiment}: memory against throughput, every cell\n{context.subtitle}", fontsize=11,
                 x=0.4)  # over the panels, not over the panels and their keys
    for (ax,), model in zip(axes, names):
        _tradeoff(ax, rows[rows.model == model])
        ax.set_title(model_title(rows, model), fontsize=9)
    fig.tight_layout(rect=(0, 0, 0.7, 1))  # the right 30 % holds each panel's key
    return fig


def _tradeoff(ax, cells: pd.DataFrame) -> None:
    scale, unit = memory_unit(cells.peak_memory_bytes)
    ok = cells[cells.status == "ok"].assign(peak_gib=lambda r: r.peak_memory_bytes.astype(float) / scale)
    ok = ok.sort_values(["peak_gib", "samples_per_s"])
    for precision in ordered(ok.precision, PRECISION_ORDER):
        for ckpt in ordered(ok.checkpointing, ("off", "full")):
            chosen = ok[(ok.precision == precision) & (ok.checkpointing == ckpt)]
            if not chosen.empty:
                ax.scatter(chosen.peak_gib, chosen.samples_per_s, color=PRECISION_COLORS.get(precision),
                           marker=CHECKPOINT_MARKERS.get(ckpt, "s"), label=f"{precision}, ckpt {ckpt}", alpha=0.8)
    frontier = pareto_frontier(ok) if not ok.empty else ok
    if not ok.empty:
        ax.plot(frontier.peak_gib, frontier.samples_per_s, color="black", linestyle=":", linewidth=1,
                label="frontier")
    key = []
    for number, row in enumerate(ok.itertuples(), start=1):
        # Alternate the offsets so the numbers of neighbouring points do not sit on one another.
        ax.annotate(str(number), (row.peak_gib, row.samples_per_s), fontsize=8, textcoords="offset points",
                    xytext=(5, 4) if number % 2 else (5, -11))
        star = "*" if row.Index in frontier.index else " "
        key.append(f"{number:>2}{star} {pair_label(row.micro_batch, row.accum_steps)} {row.precision} "
                   f"ckpt {row.checkpointing} {row.optimizer}")
    if key:
        ax.text(1.02, 1.0, "cells (* on the frontier)\n" + "\n".join(key), transform=ax.transAxes, va="top",
                ha="left", fontsize=8, family="monospace")
        _margins(ax, ok.peak_gib, ok.samples_per_s)
    ax.set_xlabel(f"peak memory ({unit})")
    ax.set_ylabel("samples/s")
    # Beside the panel, under the key: inside, it would hide points.
    ax.legend(fontsize=8, loc="lower left", bbox_to_anchor=(1.02, 0.0), handlelength=3)
    _failed_note(ax, cells[cells.status != "ok"])


def _margins(ax, x: pd.Series, y: pd.Series, fraction: float = 0.08) -> None:
    """Axis limits from the data with `fraction` of its span (or of its value, for a single point) each side."""
    for values, set_limits in ((x, ax.set_xlim), (y, ax.set_ylim)):
        low, high = float(values.min()), float(values.max())
        pad = (high - low) * fraction or abs(high) * fraction or 1.0
        set_limits(low - pad, high + pad)


CHARTS = {
    "memory_by_micro_batch.png": memory_by_micro_batch,
    "throughput_mfu.png": throughput_and_mfu,
    "memory_inside_step.png": memory_sawtooth,
    "optimizers.png": optimizers_side_by_side,
    "memory_vs_throughput.png": memory_throughput_tradeoff,
}
