"""The estimate chart: predicted peak memory against micro-batch, with GPU memory sizes drawn across.

One line per configuration (model, image size, precision, checkpointing, optimizer,
channels-last); which GPU holds which configuration reads off the horizontal lines.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only

import matplotlib.pyplot as plt  # noqa: E402

from bench.memory.estimate_grid import ESTIMATE_COLUMNS  # noqa: E402
from bench.report.charts import CHECKPOINT_STYLES, PRECISION_COLORS  # noqa: E402
from bench.results.read import read_runs  # noqa: E402
from bench.units import GIB  # noqa: E402

CHART_NAME = "memory_estimate.png"
GPU_MEMORY_LINES_GIB = (16, 24, 40, 80, 141)
"""T4/V100; L4/A10G/RTX 3090/4090; A100-40GB; A100/H100-80GB; H200 (bench/data/gpus.csv)."""
OPTIMIZER_MARKERS = {"adamw": "o", "adamw8bit": "s", "sgd": "^"}
_CONFIGURATION = ["model", "image_size", "precision", "checkpointing", "optimizer", "channels_last"]


def write_estimate_chart(folder: Path) -> Path:
    """Draw `folder/runs.csv`'s estimated rows of one profile (CUDA when present) into `folder/memory_estimate.png`."""
    rows = read_runs(Path(folder) / "runs.csv", ESTIMATE_COLUMNS)
    estimated = rows[rows.status == "estimated"]
    profile = "cuda" if (estimated.profile == "cuda").any() else "cpu"
    failed = rows[(rows.status != "estimated") & (rows.profile == profile)]
    estimated = estimated[estimated.profile == profile]
    # The CUDA prediction of reserved memory is what a GPU must hold; CPU estimates have tracked tensors.
    column = "peak_reserved_bytes" if profile == "cuda" else "peak_memory_bytes"
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for key, cells in estimated.groupby(_CONFIGURATION, sort=False):
        model, size, precision, ckpt, optimizer, channels_last = key
        cells = cells.sort_values("micro_batch")
        ax.plot(cells.micro_batch, cells[column] / GIB, color=PRECISION_COLORS.get(precision),
                linestyle=CHECKPOINT_STYLES.get(ckpt, "-"), marker=OPTIMIZER_MARKERS.get(optimizer, "x"),
                label=f"{model} {size}px {precision} ckpt {ckpt} {optimizer}{' cl' if channels_last else ''}")
    for gib in GPU_MEMORY_LINES_GIB:
        ax.axhline(gib, color="grey", linewidth=0.8, linestyle=":")
        ax.annotate(f"{gib} GiB", (1.0, gib), xycoords=("axes fraction", "data"), fontsize=8,
                    xytext=(3, 0), textcoords="offset points", va="center", color="grey")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("micro-batch (samples per forward/backward; accumulation makes up the effective batch)")
    ax.set_ylabel("predicted peak reserved (GiB)" if profile == "cuda" else "predicted tracked peak (GiB)")
    experiment = estimated.experiment.iloc[0] if len(estimated) else ""
    ax.set_title(f"{experiment}: estimated peak memory (profile {profile}, no device run)\n"
                 "dotted lines: GPU memory sizes (the fits_gpus column adds the cost planner's headroom)", fontsize=10)
    if len(failed):  # never silently missing
        reasons = "; ".join(f"{optimizer}: {error}" for optimizer, error in
                            sorted(set(zip(failed.optimizer, failed.error_type))))
        ax.text(0.01, 0.99, f"not estimated: {len(failed)} cells ({reasons})", transform=ax.transAxes,
                va="top", fontsize=8, bbox=dict(boxstyle="round", facecolor="white", alpha=0.85))
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=labels.__getitem__)
    ax.legend([handles[i] for i in order], [labels[i] for i in order], fontsize=6, ncol=2,
              loc="upper left", bbox_to_anchor=(0, -0.14))
    fig.tight_layout()
    path = Path(folder) / CHART_NAME
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return path
