"""The input pipeline's part of a report: synthetic against loader input, pair by pair.

Only for folders whose rows include loader inputs (`input` other than synthetic); the charts
and tables of every other folder are untouched.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from bench.report.rows import ReportContext, pair_label, timing_flags  # noqa: E402
from bench.units import GIB, MIB, mb  # noqa: E402

INPUT_CHART = "input_pipeline.png"
INPUT_ORDER = ("synthetic", "loader", "loader_gpu_decode")
_INPUT_COLOURS = {"synthetic": ("#7f7f7f",), "loader": ("#9ecae1", "#4292c6", "#08519c", "#08306b"),
                  "loader_gpu_decode": ("#fdae6b", "#e6550d", "#a63603", "#7f2704")}
_WAIT_COLOUR = "#d62728"


def has_loader_rows(rows: pd.DataFrame) -> bool:
    return "input" in rows and (rows.input != "synthetic").any()


def _variants(rows: pd.DataFrame) -> list[tuple[str, int]]:
    """(input, workers) in drawing order: synthetic, then each loader by worker count."""
    present = {(str(i), int(w)) for i, w in zip(rows.input, rows.loader_workers)}
    return sorted(present, key=lambda v: (INPUT_ORDER.index(v[0]) if v[0] in INPUT_ORDER else 9, v[1]))


def _label(variant: tuple[str, int]) -> str:
    kind, workers = variant
    return "synthetic" if kind == "synthetic" else f"{kind.replace('_', ' ')}, {workers} worker{'s' * (workers != 1)}"


def _colour(variant: tuple[str, int], variants: list[tuple[str, int]]) -> str:
    kind = variant[0]
    same = [v for v in variants if v[0] == kind]
    palette = _INPUT_COLOURS.get(kind, ("#2ca02c",))
    return palette[min(same.index(variant), len(palette) - 1)]


def input_chart(rows: pd.DataFrame, context: ReportContext) -> Figure:
    """Per model: samples/s against the micro-batch split, synthetic and each loader side by side (left),
    and the median step split into the time not waiting and the input wait, stacked (right)."""
    models = sorted(set(rows.model))
    fig, axes = plt.subplots(len(models), 2, figsize=(13, 4.6 * len(models)), squeeze=False)
    fig.suptitle(f"{context.experiment}: synthetic input against a JPEG DataLoader, by micro-batch split\n"
                 f"{context.subtitle}", fontsize=11)
    for (rate_ax, time_ax), model in zip(axes, models):
        cells = rows[rows.model == model]
        pairs = sorted({(int(m), int(k)) for m, k in zip(cells.micro_batch, cells.accum_steps)}, reverse=True)
        variants = _variants(cells)
        width = 0.8 / max(len(variants), 1)
        for offset, variant in enumerate(variants):
            colour = _colour(variant, variants)
            for position, (micro, accum) in enumerate(pairs):
                match = cells[(cells.micro_batch == micro) & (cells.accum_steps == accum)
                              & (cells.input == variant[0]) & (cells.loader_workers == variant[1])]
                if match.empty:
                    continue
                row = match.iloc[0]
                x = position + (offset - (len(variants) - 1) / 2) * width
                if row.status != "ok":
                    for ax in (rate_ax, time_ax):
                        ax.plot([x], [0], marker="x", color="black", linestyle="none", markersize=8)
                        ax.annotate(row.status, (x, 0), textcoords="offset points", xytext=(0, 6), ha="center",
                                    fontsize=7, rotation=90)
                    continue
                label = _label(variant) if position == 0 else None
                rate_ax.bar(x, row.samples_per_s, width, color=colour, label=label)
                if variant[0] != "synthetic" and pd.notna(row.synthetic_samples_per_s):
                    change = 100 * (row.samples_per_s / row.synthetic_samples_per_s - 1)
                    rate_ax.annotate(f"{change:+.0f}%", (x, row.samples_per_s), textcoords="offset points",
                                     xytext=(0, 2), ha="center", fontsize=7)
                wait = 0.0 if pd.isna(row.input_wait_median_ms) else float(row.input_wait_median_ms)
                step = float(row.step_time_median_ms)
                time_ax.bar(x, max(step - wait, 0.0), width, color=colour, label=label)
                time_ax.bar(x, wait, width, bottom=max(step - wait, 0.0), color=_WAIT_COLOUR, hatch="//",
                            edgecolor="white", linewidth=0.0,
                            label="input wait (median)" if wait and not _has_label(time_ax, "input wait") else None)
        for ax in (rate_ax, time_ax):
            ax.set_xticks(range(len(pairs)), [pair_label(m, k) for m, k in pairs])
            ax.set_xlabel("micro-batch × accumulation steps (effective batch fixed)")
        rate_ax.set_ylabel("samples/s")
        rate_ax.set_title(f"{model}: throughput", fontsize=10)
        time_ax.set_ylabel("median optimizer step (ms)")
        time_ax.set_title(f"{model}: step time, the input wait stacked on top", fontsize=10)
        rate_ax.legend(fontsize=7, title="% against synthetic above the bars", title_fontsize=7)
        handles, labels = time_ax.get_legend_handles_labels()
        order = sorted(range(len(labels)), key=lambda i: labels[i].startswith("input wait"))  # the wait last
        time_ax.legend([handles[i] for i in order], [labels[i] for i in order], fontsize=7)
    threads = sorted({int(t) for t in rows.cpu_threads.dropna()}) if "cpu_threads" in rows else []
    note = (f"CPU threads of the training step: {', '.join(map(str, threads))} (on a CPU the step gives up a thread "
            "per worker)" if rows.device_type.iloc[0] == "cpu" else "")
    fig.text(0.01, 0.005, note, fontsize=7)
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    return fig


def _has_label(ax, prefix: str) -> bool:
    return any(text.startswith(prefix) for text in ax.get_legend_handles_labels()[1])


def input_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per loader cell: its speed against the synthetic cell of its configuration, its wait, the
    loader alone, CPU cost per sample and host memory."""
    loader = rows[rows.input != "synthetic"]
    lost = 100 * (loader.synthetic_samples_per_s - loader.samples_per_s) / loader.synthetic_samples_per_s
    return pd.DataFrame({
        "model": loader.model,
        "micro×K": [pair_label(m, k) for m, k in zip(loader.micro_batch, loader.accum_steps)],
        "input": loader.input,
        "workers": loader.loader_workers,
        "threads": loader.cpu_threads,
        "status": loader.status,
        "samples/s": loader.samples_per_s.round(2),
        "synthetic samples/s": loader.synthetic_samples_per_s.round(2),
        "lost to input (%)": lost.round(1),
        "wait median / p90 (ms)": [_pair(a, b) for a, b in zip(loader.input_wait_median_ms, loader.input_wait_p90_ms)],
        "wait (% of step)": loader.input_wait_pct.round(1),
        "input-bound": loader.input_bound,
        "loader alone (samples/s)": loader.loader_samples_per_s.round(1),
        "CPU ms/sample": loader.loader_cpu_ms_per_sample.round(2),
        "RSS main / workers (GiB)": [_pair(a / GIB, b / GIB, 2) if pd.notna(a) else ""
                                     for a, b in zip(loader.host_rss_main_bytes, loader.host_rss_workers_bytes)],
        "pinned (MiB)": (loader.pinned_peak_bytes / MIB).round(1),
        "flags": [timing_flags(row) for _, row in loader.iterrows()],
    })


def _pair(a: float, b: float, digits: int = 1) -> str:
    return "" if pd.isna(a) else f"{a:.{digits}f} / {b:.{digits}f}"


def input_section(rows: pd.DataFrame) -> list[str]:
    """REPORT.md's "Input pipeline" section: how it was measured, then the table."""
    from bench.results.markdown import markdown_table

    loader = rows[(rows.input != "synthetic") & (rows.status == "ok")]
    data = "; ".join(sorted({f"{s} ({int(n):,} images, {mb(b)}, seed {'' if pd.isna(seed) else int(seed)})"
                             for s, n, b, seed in zip(loader.data_set, loader.data_images, loader.data_bytes,
                                                      loader.data_seed)})) or "none (no loader cell finished)"
    hosts = ", ".join(sorted({f"{cpu} ({int(n)} cores)" for cpu, n in zip(loader.host_cpu_model, loader.host_cpus)}))
    return [
        "## Input pipeline",
        "",
        "Each loader cell trains from JPEG files read, decoded (`torchvision.io.decode_jpeg`) and augmented "
        "(`transforms.v2`: RandomResizedCrop, flip, normalise) by a DataLoader, each micro-batch fetched as the step "
        "reaches it. *Wait*: host time per optimizer step spent getting its K micro-batches onto the device. "
        "*Lost to input*: samples/s against the synthetic-input cell of the same configuration. *Loader alone*: the "
        "same loader and workers after training, no model. *CPU ms/sample*: CPU time of the training process and its "
        "workers per sample, the loader alone (what feeding a GPU costs; `bench plan --loader-rows`). "
        "*Input-bound*: the median step waits at least 5 % of its time, or the loader alone is slower than the step "
        "would be without waiting.",
        "",
        f"- Data: {data}.",
        f"- Decoded on: {hosts or 'n/a'}.",
        "",
        markdown_table(input_table(rows)),
        "",
    ]
