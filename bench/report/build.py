"""Write a results folder's report: every chart as PNG, the tables as CSV, and REPORT.md."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from bench.report.charts import CHARTS
from bench.report.input_pipeline import (
    INPUT_CHART,
    has_loader_rows,
    input_chart,
    input_section,
)
from bench.report.rows import ReportContext, at_defaults, context_of, load_rows
from bench.report.tables import (
    accumulation_cost,
    cell_table,
    cpu_profile_banner,
    machine_speed_note,
    data_parallel,
    estimate_vs_measured,
    format_pairs,
    predicted_accumulation_cost,
    run_to_run,
)
from bench.results.markdown import markdown_table
from bench.results.read import read_runs
from bench.results.schema import ESTIMATE_COLUMNS, PREDICTED_COLUMNS, Column
from bench.results.store import ESTIMATE_FOLDER, PREDICTED_FOLDER

# PNGs carry no timestamp; dropping the version stamp too keeps reruns byte-identical.
_PNG_METADATA = {"Software": None}


def build_report(folder: Path) -> list[Path]:
    """Regenerate `folder`'s charts, `accumulation_cost.csv` and `REPORT.md` from its runs.csv.

    Example:
        >>> build_report(Path("results/resnet50/cpu-amd-epyc-f25m17-avx512bf16-2c"))  # doctest: +SKIP
    """
    folder = Path(folder)
    rows = load_rows(folder)
    context = context_of(rows)
    plain = at_defaults(rows)  # what the charts and the accumulation table compare
    written = []
    for name, chart in CHARTS.items():
        figure = chart(plain, context)
        figure.savefig(folder / name, dpi=100, metadata=_PNG_METADATA, bbox_inches="tight")
        plt.close(figure)
        written.append(folder / name)
    if has_loader_rows(rows):  # only folders with loader inputs get the input pipeline's chart
        figure = input_chart(rows, context)
        figure.savefig(folder / INPUT_CHART, dpi=100, metadata=_PNG_METADATA)
        plt.close(figure)
        written.append(folder / INPUT_CHART)
    cost = accumulation_cost(plain)
    written.append(_write(folder / "accumulation_cost.csv", cost.to_csv(index=False)))
    estimates = sibling_estimates(folder)
    accuracy = estimate_vs_measured(rows, estimates) if not estimates.empty else pd.DataFrame()
    if not accuracy.empty:
        written.append(_write(folder / "estimate_vs_measured.csv", accuracy.to_csv(index=False)))
    predicted = predicted_accumulation_cost(estimates) if context.profile == "cpu" else pd.DataFrame()
    predictions = sibling_predictions(folder)
    formats = format_pairs(rows, estimates, _of_measured_gpu(predictions, rows))
    if not formats.empty:
        written.append(_write(folder / "format_pairs.csv", formats.to_csv(index=False)))
    beside = _predicted_beside_measured(predictions, rows) + _formats_section(formats) + _run_to_run(folder)
    written.append(_write(folder / "REPORT.md", _report_text(rows, len(plain), context, cost, accuracy, predicted,
                                                             beside, estimates)))
    return written


def _predicted_beside_measured(predictions: pd.DataFrame, rows: pd.DataFrame) -> list[str]:
    """The report's section setting the throughput model's predictions (`results/<experiment>/predicted/`, the
    same GPU) beside each measured cell (`bench.report.compare`); empty without predictions for this device."""
    from bench.report.compare import compare, entries_from_rows, predicted_beside_measured, prediction_summary
    from bench.results.read import records

    if predictions.empty:
        return []
    comparison = compare(entries_from_rows(records(predictions), "predicted"),
                         entries_from_rows(records(rows), "measured"))
    if not comparison.pairs:
        return []
    return ["## Predicted beside measured", "",
            "The throughput model's and the estimator's prediction for this GPU (`../predicted/runs.csv`, "
            "`bench predict`) beside each measured cell: error = predicted / measured - 1; the band is the "
            "prediction's stated samples/s interval (`samples_per_s_low`..`_high`). `bench compare "
            "../predicted .` gives every figure.", "",
            *(f"- {line}" for line in prediction_summary(comparison)), "",
            markdown_table(pd.DataFrame(predicted_beside_measured(comparison))), ""]


def _formats_section(formats: pd.DataFrame) -> list[str]:
    """The report's section on configurations measured in both memory formats (`format_pairs`); empty without one."""
    if formats.empty:
        return []
    return ["## Memory formats", "",
            "Each configuration measured in both memory formats: channels-last over NCHW, of the measured peak, "
            "reserved peak and samples/s, beside the estimator's ratio (`../estimate/`: it traces each format's "
            "tensors, not the kernels and workspaces cuDNN picks per layout) and the throughput model's for this GPU "
            "(`../predicted/`). Above 1: channels-last needs more memory, or runs faster. Also in "
            "`format_pairs.csv`.", "", markdown_table(formats), ""]


def _run_to_run(folder: Path) -> list[str]:
    """The report's section on cells measured more than once: the spread between measurements beside each one's own
    (`run_to_run`); empty when every cell was measured once."""
    table = run_to_run(read_runs(Path(folder) / "runs.csv", every_row=True))
    if table.empty:
        return []
    disagree = table[table["runs disagree"].str.startswith("yes")].cell.nunique()
    return ["## Run to run", "",
            f"{table.cell.nunique()} cells were measured more than once in this folder (every measurement stays in "
            f"runs.csv; the other tables show the last); in {disagree} of them the measurements disagree beyond "
            "their own 95 % intervals, so their figures vary from run to run by more than one run's spread shows.",
            "", markdown_table(table), ""]


def sibling_estimates(folder: Path) -> pd.DataFrame:
    """The estimate rows of the same experiment (`results/<experiment>/estimate/`), empty when there are none."""
    return _sibling_rows(folder, ESTIMATE_FOLDER, ESTIMATE_COLUMNS)


def sibling_predictions(folder: Path) -> pd.DataFrame:
    """The throughput model's rows of the same experiment (`results/<experiment>/predicted/`, every catalog GPU),
    empty when there are none."""
    return _sibling_rows(folder, PREDICTED_FOLDER, PREDICTED_COLUMNS)


def _sibling_rows(folder: Path, kind: str, columns: dict[str, Column]) -> pd.DataFrame:
    """The rows of the folder `kind` beside `folder` (none when `folder` is that kind itself)."""
    path = Path(folder).parent / kind / "runs.csv"
    if Path(folder).name == kind or not path.is_file():
        return pd.DataFrame()
    return read_runs(path, columns)


def _of_measured_gpu(predictions: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """The predictions for the catalog GPU `rows` were measured on; none for a CPU's rows or an unknown GPU."""
    from bench.measure.hardware import find_gpu

    specs = [find_gpu(name) for name in set(rows.device_name[rows.device_type == "cuda"])]
    gpus = {spec.gpu for spec in specs if spec}
    return predictions[predictions.gpu.isin(gpus)] if gpus and not predictions.empty else pd.DataFrame()


def _report_text(rows: pd.DataFrame, plain_count: int, context: ReportContext, cost: pd.DataFrame,
                 accuracy: pd.DataFrame, predicted: pd.DataFrame, beside: list[str], estimates: pd.DataFrame) -> str:
    counts = ", ".join(f"{n} {status}" for status, n in rows.status.value_counts().sort_index().items())
    peak_sources = "; ".join(sorted(set(rows.peak_flops_source) - {""}))
    commits = ", ".join(sorted({commit[:10] for commit in rows.git_commit if commit}))
    lines = [
        f"# {context.experiment} on {context.device_name} (profile {context.profile})",
        "",
        f"Regenerated by `bench report` from `runs.csv` ({len(rows)} cells: {counts}). "
        "Every figure here comes from those rows.",
        "",
        f"- Memory: {context.subtitle.split(' · memory: ')[-1]}.",
        f"- MFU/HFU peak: {peak_sources or 'none known (MFU left empty)'}.",
        f"- Harness commit(s): {commits or 'unknown'}.",
        "",
        *_cpu_scope(rows, context, predicted, estimates),
        "## What accumulation costs" + (" on this CPU, at the profile's size" if context.profile == "cpu" else ""),
        "",
        "Large-batch end against the most-accumulated end at the same effective batch "
        "(checkpointing off, same optimizer). Memory saved and throughput lost are relative to the large batch.",
        "",
        markdown_table(cost) if not cost.empty else "_Only one micro-batch split was measured._",
        "",
    ]
    if plain_count < len(rows):
        lines += [f"The table above and the charts compare the {plain_count} cells with every later axis at its "
                  "default (one process, the plain step); the others are in \"Every cell\" with their variant.", ""]
    parallel = data_parallel(rows)
    if not parallel.empty:
        lines += ["## Data parallel", "",
                  "Scaling efficiency: global samples/s over (processes x the 1-process cell's samples/s). "
                  "All-reduces per step: DDP's bucket all-reduces per optimizer step: one with no_sync, "
                  "K with every_step when the model is one bucket.", "", markdown_table(parallel), ""]
    if not accuracy.empty:
        lines += ["## The estimator against the measurement", "",
                  f"Predicted peak (`bench estimate`, no device) over measured, per cell: "
                  f"{int(accuracy.within_10pct.sum())} of {len(accuracy)} within 10 %.", "",
                  markdown_table(_estimate_table(accuracy)), ""]
    lines += beside
    charts = list(CHARTS)
    if has_loader_rows(rows):
        lines += input_section(rows)
        charts.insert(0, INPUT_CHART)
    lines += ["## Charts", ""]
    lines += [f"![{name.removesuffix('.png')}]({name})" for name in charts]
    lines += ["", "## Every cell", "", markdown_table(cell_table(rows)), ""]
    return "\n".join(lines)


def _estimate_table(accuracy: pd.DataFrame) -> pd.DataFrame:
    """The estimator against the measurement per cell: both peaks, not only their ratio."""
    from bench.units import GIB

    return pd.DataFrame({"cell_id": accuracy.cell_id,
                         "estimated peak (GiB)": (accuracy.peak_memory_bytes_estimated / GIB).round(3),
                         "measured peak (GiB)": (accuracy.peak_memory_bytes_measured / GIB).round(3),
                         "peak_ratio": accuracy.peak_ratio.round(3), "reserved_ratio": accuracy.reserved_ratio.round(3),
                         "within_10pct": accuracy.within_10pct})


def _no_prediction_note(estimates: pd.DataFrame) -> str:
    """Why the grid as written has no predicted table: no estimate at all, estimates of the CPU profile only (those
    the section against the measurement uses), or one split only. Each case says so, so no section contradicts
    another."""
    if estimates.empty:
        return ("_No estimate of the grid as written yet: `bench estimate <grid file>` predicts its peak memory "
                "without a device._")
    if not (estimates.profile == "cuda").any():
        return ("_The estimates beside these rows are of the CPU profile (set against the measurement below); none of "
                "the grid as written yet: `bench estimate <grid file>` (profile cuda) predicts its peak memory without "
                "a device._")
    return ("_The estimate of the grid as written (`../estimate/runs.csv`) holds no large batch and accumulated split "
            "of one configuration (checkpointing off, same optimizer and effective batch): no accumulation cost to "
            "predict._")


def _cpu_scope(rows: pd.DataFrame, context: ReportContext, predicted: pd.DataFrame,
               estimates: pd.DataFrame) -> list[str]:
    """A CPU-profile report opens with what it can and cannot show, and the 224 px answer beside it."""
    if context.profile != "cpu":
        return []
    lines = [cpu_profile_banner(rows), ""]
    drift = machine_speed_note(rows)
    if drift:
        lines += [drift, ""]
    if predicted.empty:
        return lines + [_no_prediction_note(estimates), ""]
    return lines + ["### The grid as written, predicted (memory estimator, no device)", "",
                    "Predicted `max_memory_allocated` at the large-batch end and the most-accumulated end (checkpointing "
                    "off, same optimizer), from `../estimate/runs.csv`. Memory only: an estimate has no time.", "",
                    markdown_table(predicted), ""]


def _write(path: Path, text: str) -> Path:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
    return path
