"""The throughput model's validation chart: predicted against measured samples/s, log-log.

Training and inference rows sit in panels of their own (their speeds and errors differ); colour is
the group (GPU or model family, one distinct colour each, the same in both panels); the black line
is y = x and the dashed grey lines the ±35 % band, both named in the legend (`bench.report.charts`
states the convention every chart follows).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

# Distinct at a glance (tab10, then two more): tab20 pairs a dark and a light shade of one hue, which
# made neighbouring groups (A100-40GB / A100-80GB) look alike.
GROUP_COLORS = (*plt.get_cmap("tab10").colors, "#000000", "#e6c300")
BAND_FACTOR = 1.35
MODES = {"train": "training", "infer": "inference"}


def validation_figure(rows: list[dict], group: str, title: str, ylabel: str) -> Figure:
    """Scatter of `rows` (`measured_samples_per_s`, `predicted_samples_per_s`, `mode`, coloured by `group`)."""
    modes = [mode for mode in MODES if any(row["mode"] == mode for row in rows)]
    figure, axes = plt.subplots(1, max(len(modes), 1), figsize=(7 * max(len(modes), 1), 7.2), squeeze=False)
    colour_of = {family: GROUP_COLORS[index % len(GROUP_COLORS)]
                 for index, family in enumerate(sorted({row[group] for row in rows}))}
    for axis, mode in zip(axes[0], modes):
        _panel(axis, [row for row in rows if row["mode"] == mode], group, colour_of)
        axis.set(xlabel="measured samples/s (public benchmarks, bench/data/reference/)", ylabel=ylabel,
                 title=f"{MODES[mode]} rows")
    drawn = {label: handle for axis in axes[0] for handle, label in zip(*axis.get_legend_handles_labels())}
    # The groups in colour order, then the reference lines, whichever panel drew each first.
    legend = {label: drawn[label] for label in [*colour_of, *drawn] if label in drawn}
    figure.legend(list(legend.values()), list(legend), loc="lower center", ncol=min(len(legend), 7), fontsize=8,
                  handlelength=3)
    figure.suptitle(title)
    figure.tight_layout(rect=(0, 0.04 + 0.025 * (len(legend) // 7), 1, 1))
    return figure


def _panel(axis, rows: list[dict], group: str, colour_of: dict[str, tuple]) -> None:
    for family, colour in colour_of.items():
        members = [row for row in rows if row[group] == family]
        if members:
            axis.scatter([r["measured_samples_per_s"] for r in members],
                         [r["predicted_samples_per_s"] for r in members], s=18, color=colour, label=family, alpha=0.85)
    values = [r["measured_samples_per_s"] for r in rows] + [r["predicted_samples_per_s"] for r in rows]
    low, high = min(values) / 1.5, max(values) * 1.5
    axis.plot([low, high], [low, high], color="black", linewidth=0.8, label="y = x (prediction exact)")
    for factor, label in ((BAND_FACTOR, f"±{(BAND_FACTOR - 1) * 100:.0f} % (predicted / measured {BAND_FACTOR:g} or "
                                        f"1/{BAND_FACTOR:g})"), (1 / BAND_FACTOR, None)):
        axis.plot([low, high], [low * factor, high * factor], color="grey", linewidth=0.8, linestyle="--",
                  label=label)
    axis.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high))
    axis.grid(True, which="both", linewidth=0.3)


def write_validation_chart(rows: list[dict], group: str, title: str, ylabel: str, path: Path) -> Path:
    """Draw `validation_figure` into `path`."""
    figure = validation_figure(rows, group, title, ylabel)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
