"""Reports built from rows: the files, the series each chart carries, failures shown, bad input."""

from __future__ import annotations

import json

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from conftest import REPO

from bench.cli import main
from bench.errors import ResultsFileError
from bench.grid.cell import extra_axis_defaults
from bench.report import build_report
from bench.report.charts import (
    CHARTS,
    memory_by_micro_batch,
    memory_sawtooth,
    memory_throughput_tradeoff,
    optimizers_side_by_side,
    pareto_frontier,
    throughput_and_mfu,
)
from bench.report.rows import context_of, load_rows
from bench.report.input_pipeline import input_table
from bench.report.tables import accumulation_cost, data_parallel, run_to_run
from bench.results.read import read_runs
from bench.results.store import RunsFile
from bench.units import GIB

PAIRS = [(8, 1), (4, 2), (2, 4)]


def _row(micro, accum, precision="fp32", ckpt="off", optimizer="adamw", status="ok") -> dict:
    """A made-up but internally consistent row: activations scale with the micro-batch."""
    params = 1 * GIB
    state = {"adamw": 2 * params, "adamw8bit": params // 4, "sgd": params}[optimizer]
    activations = micro * GIB // (2 if precision == "bf16" else 1) // (3 if ckpt == "full" else 1)
    rate = 100.0 * (1 + micro / 8) * (1.5 if precision == "bf16" else 1)
    row = {**extra_axis_defaults(), "cell_id": f"m-{micro}x{accum}-{precision}-{ckpt}-{optimizer}", "experiment": "fixture",
           "profile": "cuda", "model": "m", "image_size": 224, "micro_batch": micro, "accum_steps": accum,
           "effective_batch": micro * accum, "precision": precision, "checkpointing": ckpt,
           "optimizer": optimizer, "device_type": "cuda", "device_name": "NVIDIA H200", "status": status}
    if status != "ok":
        return row | {"error_type": "OutOfMemoryError" if status == "oom" else "RuntimeError",
                      "error_message": "made up"}
    phases = []
    for step in range(accum):
        phases += [["forward", step, params + state + activations], ["backward", step, 2 * params + state]]
    phases += [["optimizer", accum - 1, 2 * params + state], ["zero_grad", accum - 1, params + state]]
    step_ms = 1e3 * micro * accum / rate
    return row | {
        "memory_source": "cuda_allocator", "peak_memory_bytes": 2 * params + state + activations,
        "peak_allocated_bytes": 2 * params + state + activations,
        "peak_reserved_bytes": 2 * params + state + activations + GIB // 2,
        "peak_tracked_bytes": 2 * params + state + activations,
        "params_bytes": params, "grads_bytes": params, "optimizer_state_bytes": state,
        "tracked_params_bytes": params, "tracked_grads_bytes": params, "tracked_optimizer_state_bytes": state,
        "tracked_activations_bytes": activations, "tracked_temporaries_bytes": 0, "untracked_bytes": 0,
        "activations_peak_bytes": activations, "activations_saved_bytes": activations, "phase_memory": json.dumps(phases),
        "step_times_ms": json.dumps([step_ms * (1 + 0.01 * (i % 3 - 1)) for i in range(8)]),
        "step_time_ci95_rel": 0.02, "noisy": False, "remeasured": False,
        "samples_per_s": rate, "step_time_median_ms": step_ms,
        "mfu_pct": rate / 10, "hfu_pct": rate / 10 * (1.3 if ckpt == "full" else 1),
        "peak_flops_source": "datasheet: H200 bf16_tflops (made up)", "git_commit": "abc",
    }


@pytest.fixture
def results_folder(tmp_path):
    folder = tmp_path / "fixture" / "nvidia-h200"
    runs = RunsFile(folder / "runs.csv")
    for precision in ("fp32", "bf16"):
        for ckpt in ("off", "full"):
            for micro, accum in PAIRS:
                runs.write(_row(micro, accum, precision, ckpt))
    for optimizer in ("adamw8bit", "sgd"):
        runs.write(_row(8, 1, optimizer=optimizer))
    runs.write(_row(16, 1, "fp32", "off", "adamw", status="oom") | {"effective_batch": 8})
    runs.write(_row(1, 8, "fp32", "off", "adamw", status="error"))
    return folder


@pytest.mark.slow
def test_report_writes_every_chart_and_the_tables(results_folder):
    written = {path.name for path in build_report(results_folder)}
    assert written == set(CHARTS) | {"REPORT.md", "accumulation_cost.csv"}
    report = (results_folder / "REPORT.md").read_text()
    assert "NVIDIA H200" in report and "## What accumulation costs" in report
    assert all(f"({name})" in report for name in CHARTS)
    assert "| oom |" in report and "| error |" in report  # failed cells are in the table, not dropped


def test_accumulation_cost_compares_the_two_ends(results_folder):
    cost = accumulation_cost(load_rows(results_folder)).set_index("precision")
    # fp32: the error row (1x8) is the most-accumulated cell, so it is reported as such.
    assert cost.loc["fp32", "accumulated"] == "1×8" and cost.loc["fp32", "MFU accumulated (%)"] == "error"
    bf16 = cost.loc["bf16"]
    large, accumulated = _row(8, 1, "bf16"), _row(2, 4, "bf16")
    saved = 100 * (large["peak_memory_bytes"] - accumulated["peak_memory_bytes"]) / large["peak_memory_bytes"]
    lost = 100 * (large["samples_per_s"] - accumulated["samples_per_s"]) / large["samples_per_s"]
    assert bf16["memory saved (%)"] == pytest.approx(saved, abs=0.05)
    assert bf16["throughput lost (%)"] == pytest.approx(lost, abs=0.05)


@pytest.mark.slow
def test_rerun_on_unchanged_rows_gives_identical_files(results_folder):
    first = {p.name: p.read_bytes() for p in build_report(results_folder)}
    second = {p.name: p.read_bytes() for p in build_report(results_folder)}
    assert first == second


def _labels(ax) -> list[str]:
    return [text.get_text() for text in ax.get_legend().get_texts()]


def test_memory_chart_stacks_categories_per_precision_and_checkpointing(results_folder):
    rows = load_rows(results_folder)
    fig = memory_by_micro_batch(rows, context_of(rows))
    assert [ax.get_title() for ax in fig.axes] == [f"m, 224 px, effective batch 8\n{title}" for title in (
        "fp32, checkpointing off", "fp32, checkpointing full", "bf16, checkpointing off", "bf16, checkpointing full")]
    ax = fig.axes[0]
    legend = [text.get_text() for text in fig.legends[0].get_texts()]
    markers = {"activations one forward saved", "peak reserved"}
    assert [label for label in legend if label not in markers] == [
        "parameters", "gradients", "optimizer state", "activations at the peak", "temporaries at the peak"]
    assert markers <= set(legend)
    bars = ax.containers[0]  # parameters, in GiB
    assert [round(b.get_height(), 3) for b in bars] == [0.0, 1.0, 1.0, 1.0, 0.0]  # oom and error cells empty
    assert {t.get_text() for t in ax.texts} >= {"oom", "error"}
    plt.close(fig)


@pytest.mark.slow
def test_throughput_chart_has_a_line_per_precision_and_checkpointing(results_folder):
    rows = load_rows(results_folder)
    fig = throughput_and_mfu(rows, context_of(rows))
    labels = [line.get_label() for line in fig.axes[0].get_lines() if not line.get_label().startswith("_")]
    assert labels == ["fp32, ckpt off", "fp32, ckpt full", "bf16, ckpt off", "bf16, ckpt full", "large batch (16×1)"]
    fp32_off = fig.axes[0].get_lines()[0]
    assert list(fp32_off.get_xdata()) == [2, 4, 8]
    assert list(fp32_off.get_ydata()) == [_row(m, 8 // m)["samples_per_s"] for m in (2, 4, 8)]
    plt.close(fig)


def test_sawtooth_shows_both_ends_event_by_event(results_folder):
    rows = load_rows(results_folder)
    fig = memory_sawtooth(rows, context_of(rows))
    labels = _labels(fig.axes[0])
    assert labels[0].startswith("16×1: oom")  # the large-batch end ran out of memory: said so
    assert labels[1] == "1×8: error"
    plt.close(fig)
    measured = rows[rows.status == "ok"]
    fig = memory_sawtooth(measured, context_of(measured))
    large, accumulated = fig.axes[0].get_lines()[:2]
    # The large batch's update lines up with the accumulated step's: both end at opt, zero.
    assert list(large.get_xdata()) == [0, 1, 8, 9]
    assert list(accumulated.get_xdata()) == list(range(10))
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()][-2:] == ["opt", "zero"]
    assert list(accumulated.get_ydata()) == [p[2] / GIB for p in json.loads(_row(2, 4)["phase_memory"])]
    plt.close(fig)


def test_optimizer_and_tradeoff_charts(results_folder):
    rows = load_rows(results_folder)
    fig = optimizers_side_by_side(rows, context_of(rows))
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["adamw", "adamw8bit", "sgd"]
    plt.close(fig)
    fig = memory_throughput_tradeoff(rows, context_of(rows))
    assert "frontier" in _labels(fig.axes[0])
    assert any("oom" in t.get_text() for t in fig.axes[0].texts)
    plt.close(fig)


def test_pareto_frontier_keeps_only_unbeaten_cells():
    points = pd.DataFrame({"peak_gib": [1, 2, 2, 3, 4], "samples_per_s": [5, 4, 8, 8, 9]})
    assert pareto_frontier(points).index.tolist() == [0, 2, 4]


@pytest.mark.slow
def test_single_row_folder_is_reported(tmp_path):
    folder = tmp_path / "one" / "cpu-x"
    RunsFile(folder / "runs.csv").write(_row(8, 1))
    assert (folder / "REPORT.md") in build_report(folder)
    assert "Only one micro-batch split" in (folder / "REPORT.md").read_text()


def test_rows_file_with_missing_columns_gets_a_clear_error(tmp_path, capsys):
    folder = tmp_path / "bad"
    folder.mkdir()
    pd.DataFrame({"cell_id": ["a"], "status": ["ok"]}).to_csv(folder / "runs.csv", index=False)
    with pytest.raises(ResultsFileError, match="missing columns experiment, profile"):
        load_rows(folder)
    assert main(["report", str(folder)]) == 2
    error = capsys.readouterr().err
    assert len(error.strip().splitlines()) == 1 and "runs.csv" in error


@pytest.mark.slow
def test_data_parallel_cells_get_their_own_table_and_stay_out_of_the_accumulation_comparison(tmp_path):
    folder = tmp_path / "ddp" / "nvidia-h200"
    runs = RunsFile(folder / "runs.csv")
    for micro, accum in ((8, 1), (2, 4)):
        runs.write(_row(micro, accum) | {"world_size": 1, "ddp_sync": "no_sync"})
    # Two processes: faster globally, but its per-process rate must not enter the 1-process comparison.
    two = _row(2, 4) | {"cell_id": "m-2x4-world_size_2", "world_size": 2, "ddp_sync": "every_step",
                        # half the ideal 2 x 125 samples/s: the reader derives 0.5 from the 1-process row
                        "samples_per_s": 62.5, "global_samples_per_s": 125.0, "scaling_efficiency": 0.5,
                        "peak_memory_max_rank_bytes": 3 * GIB, "allreduce_calls_per_step": 4.0,
                        "allreduce_ms_per_step": 12.0}
    runs.write(two)
    build_report(folder)
    (line,) = pd.read_csv(folder / "accumulation_cost.csv").to_dict("records")
    assert line["accumulated"] == "2×4" and line["throughput lost (%)"] == pytest.approx(
        100 * (_row(8, 1)["samples_per_s"] - _row(2, 4)["samples_per_s"]) / _row(8, 1)["samples_per_s"], abs=0.1)
    report = (folder / "REPORT.md").read_text()
    assert "## Data parallel" in report
    assert "| m | 2×4 | 2 | every_step | ok | 3.0 | 125.0 | 0.5 | 4.0 | 12.0 |" in report
    assert "world_size 2, ddp_sync every_step" in report  # its variant, in the every-cell table


def test_the_data_parallel_and_input_tables_carry_each_rows_timing_flags():
    """A noisy or loaded row reads as such in every table that shows it, not only in the cell table."""
    rows = pd.DataFrame({
        "model": ["m", "m"], "micro_batch": [8, 8], "accum_steps": [1, 1], "world_size": [1, 2],
        "ddp_sync": ["no_sync", "no_sync"], "status": ["ok", "ok"], "peak_memory_max_rank_bytes": [GIB, GIB],
        "global_samples_per_s": [100.0, 150.0], "scaling_efficiency": [None, 0.75],
        "allreduce_calls_per_step": [None, 1], "allreduce_ms_per_step": [None, 3.0],
        "noisy": [False, True], "loaded": [False, True], "remeasured": [False, False],
        "input": ["synthetic", "folder"], "loader_workers": [0, 2], "cpu_threads": [2, 2],
        "samples_per_s": [100.0, 80.0], "synthetic_samples_per_s": [100.0, 100.0], "input_wait_median_ms": [None, 1.0],
        "input_wait_p90_ms": [None, 2.0], "input_wait_pct": [None, 5.0], "input_bound": [None, False],
        "loader_samples_per_s": [None, 500.0], "loader_cpu_ms_per_sample": [None, 2.0],
        "host_rss_main_bytes": [None, GIB], "host_rss_workers_bytes": [None, GIB], "pinned_peak_bytes": [None, 0.0]})
    assert data_parallel(rows)["flags"].tolist() == ["", "NOISY LOADED"]
    assert input_table(rows)["flags"].tolist() == ["NOISY LOADED"]


def _measured_at(rate: float, started: str, run_id: str = "") -> dict:
    """The fixture's 8x1 cell measured at `rate` samples/s, its median's 95 % interval +-2 %."""
    step_ms = 1e3 * 8 / rate
    return _row(8, 1) | {"samples_per_s": rate, "step_time_median_ms": step_ms, "started_utc": started,
                         "run_id": run_id,
                         "step_time_ci95_low_ms": 0.98 * step_ms, "step_time_ci95_high_ms": 1.02 * step_ms}


@pytest.mark.parametrize("rerun_rate, disagree", [(150.0, "yes: beyond their spreads"), (201.0, "no")])
def test_a_cell_measured_twice_keeps_both_rows_and_says_whether_they_disagree_beyond_their_spreads(
        tmp_path, rerun_rate, disagree):
    """Run-to-run drift is shown, not averaged away: both measurements, each with its own interval, the spread
    between them, and whether it exceeds what each run's own steps show."""
    runs = RunsFile(tmp_path / "runs.csv")
    runs.write(_measured_at(200.0, "2026-12-01T10:00:00+00:00"))  # measured before rows carried a run id
    runs.write(_measured_at(rerun_rate, "2026-12-02T10:00:00+00:00", "20261202T100000Z-42"))  # --force appends
    assert len(read_runs(tmp_path / "runs.csv")) == 1  # the tables read the last
    table = run_to_run(read_runs(tmp_path / "runs.csv", every_row=True))
    assert table["samples/s"].tolist() == [200.0, rerun_rate]
    assert table["run"].tolist() == ["before run ids", "20261202T100000Z-42"]
    assert set(table["runs disagree"]) == {disagree}
    assert table["between runs (slowest / fastest)"].iloc[0] == round(min(200, rerun_rate) / max(200, rerun_rate), 3)



@pytest.mark.slow  # a whole report, charts included: 3.2 s on 2 Xeon cores
def test_a_gpu_folder_measured_in_both_formats_sets_each_ratio_beside_the_estimators_and_the_models(tmp_path):
    """What `scripts/gpu_check.sh --formats` answers on a GPU: for each model, channels-last over NCHW measured (here
    made up: 1.1x the peak, 1.3x the speed) beside the committed estimate's and H100 prediction's own ratios."""
    import shutil

    from bench.results.read import read_text
    from bench.results.schema import COLUMNS, ESTIMATE_COLUMNS, PREDICTED_COLUMNS

    committed = REPO / "results" / "gpu_check_formats"
    predicted = [row for row in read_text(committed / "predicted" / "runs.csv", PREDICTED_COLUMNS).rows
                 if row["gpu"] == "H100-80GB" and row["model"] in ("efficientnet_b0", "vgg13")]
    assert len(predicted) == 4
    runs = RunsFile(tmp_path / "gpu_check_formats" / "h100" / "runs.csv")
    for row in predicted:
        peak, speed = (8 * GIB * 1.1, 1300.0) if row["channels_last"] == "true" else (8 * GIB, 1000.0)
        measured = {name: value for name, value in row.items() if name in COLUMNS}
        measured.update(status="ok", device_type="cuda", device_name="NVIDIA H100 80GB HBM3",
                        memory_source="cuda_allocator", peak_memory_bytes=str(int(peak)),
                        peak_reserved_bytes=str(9 * GIB), samples_per_s=str(speed),
                        step_time_median_ms=str(128_000 / speed))
        runs.write(measured)
    for kind in ("estimate", "predicted"):
        shutil.copytree(committed / kind, tmp_path / "gpu_check_formats" / kind)
    report = build_report(tmp_path / "gpu_check_formats" / "h100")[-1].read_text()
    assert "## Memory formats" in report
    pairs = pd.read_csv(tmp_path / "gpu_check_formats" / "h100" / "format_pairs.csv").set_index("model")
    assert sorted(pairs.index) == ["efficientnet_b0", "vgg13"]
    assert (pairs["peak CL/NCHW"] == 1.1).all() and (pairs["samples/s CL/NCHW"] == 1.3).all()
    assert (pairs["reserved CL/NCHW"] == 1.0).all()
    estimated = read_runs(committed / "estimate" / "runs.csv", ESTIMATE_COLUMNS)
    for model, line in pairs.iterrows():
        peaks = estimated[estimated.model == model].set_index("channels_last").peak_memory_bytes
        speeds = {row["channels_last"] == "true": float(row["samples_per_s"])
                  for row in predicted if row["model"] == model}
        assert line.estimated == round(peaks[True] / peaks[False], 3)
        assert line.predicted == round(speeds[True] / speeds[False], 3)
