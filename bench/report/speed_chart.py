"""The throughput model's validation chart: predicted vs measured samples/s, log-log, one colour per group."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def write_validation_chart(rows: list[dict], group: str, title: str, ylabel: str, path: Path) -> Path:
    """Scatter of `rows` (`measured_samples_per_s`, `predicted_samples_per_s`, coloured by `group`) with y = x."""
    figure, axes = plt.subplots(figsize=(7.5, 7))
    families = sorted({row[group] for row in rows})
    colours = plt.get_cmap("tab20")
    for index, family in enumerate(families):
        members = [row for row in rows if row[group] == family]
        axes.scatter([r["measured_samples_per_s"] for r in members], [r["predicted_samples_per_s"] for r in members],
                     s=18, color=colours(index % 20), label=family, alpha=0.85)
    values = [r["measured_samples_per_s"] for r in rows] + [r["predicted_samples_per_s"] for r in rows]
    low, high = min(values) / 1.5, max(values) * 1.5
    axes.plot([low, high], [low, high], color="black", linewidth=0.8)
    for factor in (1.35, 1 / 1.35):
        axes.plot([low, high], [low * factor, high * factor], color="grey", linewidth=0.6, linestyle="--")
    axes.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high),
             xlabel="measured samples/s (public benchmarks, bench/data/reference/)", ylabel=ylabel, title=title)
    axes.legend(fontsize=7, ncol=2, loc="upper left")
    axes.grid(True, which="both", linewidth=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
