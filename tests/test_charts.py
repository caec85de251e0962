"""Every chart, drawn from fixture rows, reads true: each legend entry looks like the series it names,
and no data point falls outside its panel."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgba
from matplotlib.lines import Line2D
from test_report import PAIRS, _row

from bench.report.charts import CHARTS
from bench.report.estimate_chart import estimate_figure
from bench.report.rows import context_of, load_rows
from bench.results.read import read_runs
from bench.results.schema import ESTIMATE_COLUMNS
from bench.results.store import RunsFile
from bench.report.speed_chart import validation_figure


def _measured_rows(folder: Path) -> pd.DataFrame:
    rows = [_row(micro, accum, precision, ckpt) for precision in ("fp32", "bf16") for ckpt in ("off", "full")
            for micro, accum in PAIRS]
    rows += [_row(8, 1, optimizer=optimizer) for optimizer in ("adamw8bit", "sgd")]
    rows += [_row(16, 1, status="oom") | {"effective_batch": 8}]
    # No reserved peak (as on CPU) and no temporaries: the stack's empty top bar once pinned the axis to the
    # tallest bar's top, cutting the bf16 / checkpointing-full panel off there.
    rows = [row | {"peak_reserved_bytes": None} for row in rows]
    runs = RunsFile(folder / "runs.csv")
    for row in rows:
        runs.write(row)
    return load_rows(folder)


def _estimated_rows(folder: Path) -> pd.DataFrame:
    runs = RunsFile(folder / "runs.csv", ESTIMATE_COLUMNS)
    for row in (_row(micro, accum, precision, ckpt, optimizer) for precision in ("fp32", "bf16")
                for ckpt in ("off", "full") for optimizer in ("adamw", "sgd") for micro, accum in PAIRS):
        runs.write(row | {"status": "estimated"})
    return read_runs(folder / "runs.csv", ESTIMATE_COLUMNS)


def _validation_rows() -> list[dict]:
    return [{"gpu": gpu, "mode": mode, "measured_samples_per_s": rate, "predicted_samples_per_s": rate * ratio}
            for gpu in ("A100-40GB", "A100-80GB", "RTX-3090", "RTX-4090") for mode in ("train", "infer")
            for rate, ratio in ((10.0, 1.2), (300.0, 0.8), (5000.0, 1.0))]


NAMES = [*CHARTS, "memory_estimate.png", "validation.png"]


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> pd.DataFrame:
    return _measured_rows(tmp_path_factory.mktemp("fixture") / "nvidia-h200")


@pytest.fixture(params=NAMES)
def chart(request, measured, tmp_path):
    """(name, figure) of every chart the project draws, from fixture rows."""
    name = request.param
    if name in CHARTS:
        figure = CHARTS[name](measured, context_of(measured))
    elif name == "memory_estimate.png":
        figure = estimate_figure(_estimated_rows(tmp_path / "fixture" / "estimate"))
    else:
        figure = validation_figure(_validation_rows(), "gpu", "fixture", "predicted samples/s")
    yield name, figure
    plt.close(figure)


def _style(artist) -> tuple:
    """(line style, marker, colour) as a legend handle and its series both report them."""
    if isinstance(artist, Line2D):
        line = artist.get_linestyle() if artist.get_linestyle() not in ("None", "") else "none"
        marker = artist.get_marker() if artist.get_marker() not in ("None", "", None) else "none"
        colour = artist.get_color() if line != "none" else artist.get_markerfacecolor()
        return line, marker, to_rgba(colour)[:3]
    if hasattr(artist, "get_paths") and hasattr(artist, "get_offsets"):  # a scatter (PathCollection)
        return "none", _marker_of(artist), tuple(artist.get_facecolor()[0][:3])
    return "patch", "none", tuple(artist.get_facecolor()[:3])  # a bar


def _shows_its_dashes(legend, handle) -> bool:
    """Whether the legend's sample line is long enough for a full dash cycle on each side of its marker
    (a dashed line two points long with a marker in the middle reads as solid)."""
    if not isinstance(handle, Line2D) or handle.get_linestyle() in ("-", "None", "", " "):
        return True
    _, dashes = handle._dash_pattern  # (offset, on/off lengths in points, already scaled by the line width)
    marker = handle.get_markersize() if handle.get_marker() not in ("None", "", None) else 0.0
    length_pt = legend.handlelength * legend.get_texts()[0].get_fontsize()
    return length_pt >= marker + 2 * sum(dashes or (0.0,))


def _marker_of(collection) -> str:
    """The scatter marker whose path the collection draws."""
    from matplotlib.markers import MarkerStyle
    drawn = collection.get_paths()[0].vertices
    for marker in ("o", "^", "s", "x", "v", "D"):
        path = MarkerStyle(marker).get_path().transformed(MarkerStyle(marker).get_transform())
        if path.vertices.shape == drawn.shape and np.allclose(path.vertices, drawn):
            return marker
    return "?"


def _plotted(axes: list) -> dict[str, list]:
    """Every series drawn in `axes` by its label: lines, scatters, and the first bar of each bar group."""
    by_label: dict[str, list] = {}
    for ax in axes:
        for artist in [*ax.lines, *ax.collections]:
            by_label.setdefault(artist.get_label(), []).append(artist)
        for container in ax.containers:
            by_label.setdefault(container.get_label(), []).append(container.patches[0])
    return by_label


def test_every_legend_entry_looks_like_the_series_it_names(chart):
    name, figure = chart
    legends = [(ax.get_legend(), [ax]) for ax in figure.axes if ax.get_legend()]
    legends += [(legend, figure.axes) for legend in figure.legends]
    assert legends, f"{name} has no legend"
    for legend, axes in legends:
        plotted = _plotted(axes)
        for handle, text in zip(legend.legend_handles, legend.get_texts()):
            label = text.get_text()
            assert label in plotted, f"{name}: legend entry {label!r} names no plotted series"
            styles = {_style(artist) for artist in plotted[label]}
            assert _style(handle) in styles, f"{name}: legend {label!r} drawn {_style(handle)}, series {styles}"
            assert _shows_its_dashes(legend, handle), f"{name}: legend {label!r} too short to show it is dashed"


def test_no_data_point_lies_outside_its_panel(chart):
    name, figure = chart
    for ax in figure.axes:
        if not ax.get_visible():
            continue
        (x_low, x_high), (y_low, y_high) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
        # Data are drawn with markers; reference lines (y = x, GPU sizes, the large batch) have none.
        points = [line.get_xydata() for line in ax.lines
                  if line.get_transform() == ax.transData and line.get_marker() not in ("None", "", None)]
        points += [collection.get_offsets() for collection in ax.collections
                   if collection.get_offset_transform() == ax.transData and len(collection.get_offsets())]
        points += [[[bar.get_x() + bar.get_width() / 2, bar.get_y() + bar.get_height()]]
                   for container in ax.containers for bar in container]
        for xy in points:
            xy = np.asarray(xy, dtype=float)
            xy = xy[~np.isnan(xy).any(axis=1)]
            # Strictly below the top: a bar or point that touches the upper edge reads as cut off.
            inside = (xy[:, 0] > x_low) & (xy[:, 0] < x_high) & (xy[:, 1] >= y_low) & (xy[:, 1] < y_high)
            assert inside.all(), f"{name}, {ax.get_title()!r}: points {xy[~inside].tolist()} outside the axes"


def test_tradeoff_chart_numbers_every_measured_point(measured):
    rows = measured
    figure = CHARTS["memory_vs_throughput.png"](rows, context_of(rows))
    ax = figure.axes[0]
    numbers = sorted(int(t.get_text()) for t in ax.texts if t.get_text().isdigit())
    assert numbers == list(range(1, int((rows.status == "ok").sum()) + 1))
    assert all(t.get_fontsize() >= 8 for t in ax.texts if t.get_text().isdigit())
    plt.close(figure)


def test_estimate_chart_tells_checkpointing_apart_on_a_linear_axis_of_its_own_data(tmp_path):
    figure = estimate_figure(_estimated_rows(tmp_path / "fixture" / "estimate"))
    ax = figure.axes[0]
    marker_of = {line.get_label().split(",")[0]: line.get_marker() for line in ax.lines if line.get_label()[0] != "_"}
    assert marker_of["ckpt off"] != marker_of["ckpt full"]
    top_gib = max(max(line.get_ydata()) for line in ax.lines if line.get_marker() not in ("None", "", None))
    assert ax.get_yscale() == "linear" and ax.get_ylim()[1] < 1.5 * top_gib  # no empty decades above the curves
    plt.close(figure)


def test_validation_chart_keeps_training_apart_from_inference_and_names_its_dashed_lines():
    figure = validation_figure(_validation_rows(), "gpu", "fixture", "predicted samples/s")
    assert [ax.get_title() for ax in figure.axes] == ["training rows", "inference rows"]
    legend = [text.get_text() for text in figure.legends[0].get_texts()]
    assert any(label.startswith("±35 %") for label in legend)
    colours = {tuple(c.get_facecolor()[0][:3]) for c in figure.axes[0].collections}
    assert len(colours) == 4  # one colour per GPU, A100-40GB and A100-80GB included
    plt.close(figure)
