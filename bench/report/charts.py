"""Comparison charts. Each function takes rows and returns a matplotlib Figure; nothing here writes.

Colours stay fixed per precision across every chart; cells that did not finish (oom, error,
timeout, skipped) are drawn as marked gaps with their status, never left out silently.
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
from bench.units import GIB  # noqa: E402

PRECISION_COLORS = {"fp32": "#1f77b4", "bf16": "#ff7f0e", "fp16": "#2ca02c"}
CHECKPOINT_STYLES = {"off": "-", "full": "--"}
CATEGORIES = (  # (column, label, colour) stacked bottom to top
    ("params_bytes", "parameters", "#4c72b0"),
    ("grads_bytes", "gradients", "#dd8452"),
    ("optimizer_state_bytes", "optimizer state", "#55a868"),
    ("activations_peak_bytes", "activations + temporaries", "#c44e52"),
)
FAILED_MARK = dict(marker="x", color="black", linestyle="none", markersize=9)


def _figure(title: str, context: ReportContext, panels: int = 1, width: float = 6.0) -> tuple[Figure, list]:
    fig, axes = plt.subplots(1, panels, figsize=(width * panels, 4.6), squeeze=False)
    fig.suptitle(f"{title}\n{context.subtitle}", fontsize=11)
    return fig, list(axes[0])


def _failed_note(ax, failed: pd.DataFrame) -> None:
    if failed.empty:
        return
    lines = [f"{pair_label(r.micro_batch, r.accum_steps)} {r.precision} ckpt {r.checkpointing} "
             f"{r.optimizer}: {r.status}" for r in failed.itertuples()]
    ax.text(0.01, 0.99, "not measured:\n" + "\n".join(lines[:8]) + ("\n…" if len(lines) > 8 else ""),
            transform=ax.transAxes, va="top", ha="left", fontsize=7,
            bbox=dict(boxstyle="round", facecolor="white", alpha=0.85))


def memory_by_micro_batch(rows: pd.DataFrame, context: ReportContext) -> Figure:
    """Peak memory against micro-batch, stacked by category; one panel per precision × checkpointing."""
    optimizer = reference_optimizer(rows)
    subset = rows[rows.optimizer == optimizer]
    panels = [(p, c) for p in ordered(subset.precision, PRECISION_ORDER)
              for c in ordered(subset.checkpointing, ("off", "full"))
              if not subset[(subset.precision == p) & (subset.checkpointing == c)].empty]
    fig, axes = _figure(f"{context.experiment}: peak memory by category ({optimizer}, effective batch "
                        f"{int(rows.effective_batch.iloc[0])})", context, len(panels), width=4.6)
    for ax, (precision, ckpt) in zip(axes, panels):
        cells = subset[(subset.precision == precision) & (subset.checkpointing == ckpt)]
        cells = cells.sort_values("micro_batch", ascending=False)
        labels = [pair_label(r.micro_batch, r.accum_steps) for r in cells.itertuples()]
        positions = range(len(cells))
        ok = (cells.status == "ok").to_numpy()
        bottom = [0.0] * len(cells)
        for column, label, colour in CATEGORIES:
            heights = [v / GIB if good else 0.0 for v, good in zip(cells[column].fillna(0), ok)]
            ax.bar(positions, heights, bottom=bottom, color=colour, label=label, width=0.6)
            bottom = [b + h for b, h in zip(bottom, heights)]
        reserved = cells.peak_reserved_bytes
        if reserved.notna().any():
            ax.plot([p + 0.38 for p in positions], reserved / GIB, marker="_", markersize=14, mew=2.5,
                    linestyle="none", color="black", label="peak reserved")
        for position, row in zip(positions, cells.itertuples()):
            if row.status != "ok":
                ax.plot([position], [0], **FAILED_MARK)
                ax.annotate(row.status, (position, 0), textcoords="offset points", xytext=(0, 8),
                            ha="center", fontsize=8)
        ax.set_xticks(list(positions), labels)
        ax.set_xlabel("micro-batch × accumulation steps")
        ax.set_ylabel("GiB")
        ax.set_title(f"{precision}, checkpointing {ckpt}", fontsize=10)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def throughput_and_mfu(rows: pd.DataFrame, context: ReportContext) -> Figure:
    """Samples/s and MFU against micro-batch, one line per precision × checkpointing."""
    optimizer = reference_optimizer(rows)
    subset = rows[rows.optimizer == optimizer]
    fig, (rate_ax, mfu_ax) = _figure(f"{context.experiment}: throughput and MFU against micro-batch "
                                     f"({optimizer})", context, 2)
    for precision in ordered(subset.precision, PRECISION_ORDER):
        for ckpt in ordered(subset.checkpointing, ("off", "full")):
            cells = subset[(subset.precision == precision) & (subset.checkpointing == ckpt)]
            if cells.empty:
                continue
            cells = cells.sort_values("micro_batch")
            ok, failed = cells[cells.status == "ok"], cells[cells.status != "ok"]
            style = dict(color=PRECISION_COLORS.get(precision), linestyle=CHECKPOINT_STYLES.get(ckpt, ":"),
                         marker="o", label=f"{precision}, ckpt {ckpt}")
            rate_ax.plot(ok.micro_batch, ok.samples_per_s, **style)
            mfu_ax.plot(ok.micro_batch, ok.mfu_pct, **style)
            for ax in (rate_ax, mfu_ax):
                ax.plot(failed.micro_batch, [0] * len(failed), **FAILED_MARK)
    large_batch = rows.micro_batch.max()
    for ax, label in ((rate_ax, "samples/s"), (mfu_ax, "MFU (%)")):
        ax.axvline(large_batch, color="grey", linestyle=":", label=f"large batch ({int(large_batch)}×1)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("micro-batch (effective batch fixed)")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
    kinds = sorted({source.split(":")[0] for source in subset.peak_flops_source if source})
    mfu_ax.set_title(f"MFU against the {' / '.join(kinds) or 'no known'} peak per precision (see REPORT.md)",
                     fontsize=8)
    rate_ax.legend(fontsize=7)
    _failed_note(mfu_ax, subset[subset.status != "ok"])
    fig.tight_layout()
    return fig


def memory_sawtooth(rows: pd.DataFrame, context: ReportContext) -> Figure:
    """Memory after each forward, backward and the update inside one optimizer step: both ends."""
    optimizer = reference_optimizer(rows)
    precision = ordered(rows.precision, PRECISION_ORDER)[0]
    subset = rows[(rows.optimizer == optimizer) & (rows.precision == precision) & (rows.checkpointing == "off")]
    if subset.empty:
        subset = rows[(rows.optimizer == optimizer) & (rows.precision == precision)]
    fig, (ax,) = _figure(f"{context.experiment}: memory inside one optimizer step ({precision}, {optimizer})",
                         context, 1, width=9)
    ends = subset.sort_values("micro_batch", ascending=False)
    ends = [ends.iloc[0], ends.iloc[-1]] if len(ends) > 1 else [ends.iloc[0]]
    # Both series share one axis: micro-step events at their own index, the optimizer step
    # and zero_grad at the end, so the large batch's update lines up with the accumulated one's.
    slots = 2 * max(int(row.accum_steps) for row in ends) + 2
    ticks = [f"{kind}{i + 1}" for i in range(slots // 2 - 1) for kind in "fb"] + ["opt", "zero"]
    for row, colour in zip(ends, ("#1f77b4", "#d62728")):
        label = pair_label(row.micro_batch, row.accum_steps)
        if row.status != "ok" or not isinstance(row.phase_memory, str):
            ax.plot([], [], **FAILED_MARK, label=f"{label}: {row.status}")
            continue
        phases = json.loads(row.phase_memory)
        ax.step([_event_slot(phase, step, slots) for phase, step, _ in phases], [p[2] / GIB for p in phases],
                where="post", marker="o", color=colour, label=f"{label} ({len(phases)} events)")
    ax.set_xticks(range(slots), ticks, fontsize=7 if slots <= 20 else 5)
    ax.set_xlabel("after: f = forward, b = backward of micro-step n; opt = optimizer step; zero = zero_grad")
    ax.set_ylabel("GiB allocated")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _event_slot(phase: str, micro_step: int, slots: int) -> int:
    """x position of a traced event: f/b of micro-step i at 2i/2i+1; optimizer, zero_grad last."""
    return {"forward": 2 * micro_step, "backward": 2 * micro_step + 1,
            "optimizer": slots - 2, "zero_grad": slots - 1}[phase]


def optimizers_side_by_side(rows: pd.DataFrame, context: ReportContext) -> Figure:
    """Optimizer state and peak memory for each optimizer, bars grouped by precision.

    Drawn at the split where most optimizers were measured (the larger micro-batch on a tie),
    checkpointing off when measured.
    """
    ckpt = "off" if (rows.checkpointing == "off").any() else rows.checkpointing.iloc[0]
    candidates = rows[rows.checkpointing == ckpt]
    measured = candidates[candidates.status == "ok"].groupby("micro_batch").optimizer.nunique()
    micro = max(measured.index, key=lambda m: (measured[m], m)) if len(measured) else candidates.micro_batch.max()
    large = candidates[candidates.micro_batch == micro]
    optimizers = ordered(large.optimizer, ("adamw", "adamw8bit", "sgd"))
    precisions = ordered(large.precision, PRECISION_ORDER)
    fig, axes = _figure(f"{context.experiment}: optimizers side by side "
                        f"({pair_label(large.micro_batch.iloc[0], large.accum_steps.iloc[0])}, "
                        f"checkpointing {large.checkpointing.iloc[0]})", context, 2)
    width = 0.8 / max(len(precisions), 1)
    for ax, column, label in ((axes[0], "optimizer_state_bytes", "optimizer state (GiB)"),
                              (axes[1], "peak_memory_bytes", "peak memory (GiB)")):
        for offset, precision in enumerate(precisions):
            for position, optimizer in enumerate(optimizers):
                cell = large[(large.optimizer == optimizer) & (large.precision == precision)]
                x = position + (offset - (len(precisions) - 1) / 2) * width
                if cell.empty:
                    continue
                if cell.status.iloc[0] != "ok":
                    ax.plot([x], [0], **FAILED_MARK)
                    continue
                ax.bar(x, cell[column].iloc[0] / GIB, width=width, color=PRECISION_COLORS.get(precision),
                       label=precision if position == 0 else None)
        ax.set_xticks(range(len(optimizers)), optimizers)
        ax.set_ylabel(label)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


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
    """Every measured cell: peak memory against samples/s, with the frontier."""
    ok = rows[rows.status == "ok"].assign(peak_gib=lambda r: r.peak_memory_bytes / GIB)
    fig, (ax,) = _figure(f"{context.experiment}: memory against throughput, every cell", context, 1, width=8)
    for precision in ordered(ok.precision, PRECISION_ORDER):
        for ckpt, marker in (("off", "o"), ("full", "^")):
            cells = ok[(ok.precision == precision) & (ok.checkpointing == ckpt)]
            if not cells.empty:
                ax.scatter(cells.peak_gib, cells.samples_per_s, color=PRECISION_COLORS.get(precision),
                           marker=marker, label=f"{precision}, ckpt {ckpt}", alpha=0.8)
    if not ok.empty:
        frontier = pareto_frontier(ok)
        ax.plot(frontier.peak_gib, frontier.samples_per_s, color="black", linestyle="--", linewidth=1,
                label="frontier")
        for row in frontier.itertuples():
            ax.annotate(f"{pair_label(row.micro_batch, row.accum_steps)} {row.optimizer}",
                        (row.peak_gib, row.samples_per_s), fontsize=6, xytext=(4, 2), textcoords="offset points")
    ax.set_xlabel("peak memory (GiB)")
    ax.set_ylabel("samples/s")
    ax.legend(fontsize=7, loc="lower right")
    _failed_note(ax, rows[rows.status != "ok"])
    fig.tight_layout()
    return fig


CHARTS = {
    "memory_by_micro_batch.png": memory_by_micro_batch,
    "throughput_mfu.png": throughput_and_mfu,
    "memory_inside_step.png": memory_sawtooth,
    "optimizers.png": optimizers_side_by_side,
    "memory_vs_throughput.png": memory_throughput_tradeoff,
}
