"""`bench compare A B`: run against run and predicted against measured, from small runs files in the real schema."""

from __future__ import annotations

import json

import pytest
from conftest import CPU_ROWS, REPO

from bench.cli import main
from bench.results.read import read_text
from bench.results.schema import COLUMNS, PREDICTED_COLUMNS
from bench.results.store import RunsFile

CPU_RUNS = CPU_ROWS
PREDICTED_RUNS = REPO / "results" / "resnet50" / "predicted" / "runs.csv"


def _measured(step_ms: float, half_width_ms: float, **columns: str) -> dict[str, str]:
    """A measured ok row of the committed CPU run, its median step set to `step_ms` +- `half_width_ms`, without its
    raw step times (unless `step_times_ms` is given)."""
    row = next(r for r in read_text(CPU_RUNS).rows if r["status"] == "ok")
    samples = int(row["effective_batch"]) / step_ms * 1000
    return {**row, "step_time_median_ms": str(step_ms), "step_time_ci95_low_ms": str(step_ms - half_width_ms),
            "step_time_ci95_high_ms": str(step_ms + half_width_ms), "samples_per_s": str(samples),
            "noisy": "false", "step_times_ms": "", **columns}


def _write(path, rows, columns=COLUMNS, key=("cell_id",)):
    runs = RunsFile(path / "runs.csv", columns, key=key)
    for row in rows:
        runs.write(row)
    return path


def _folders(tmp_path, a_rows, b_rows):
    return (str(_write(tmp_path / "a", a_rows)), str(_write(tmp_path / "b", b_rows)))


def _json(capsys, *argv) -> dict:
    assert main(["compare", *argv, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def _figure(document, name):
    return next(f for f in document["pairs"][0]["figures"] if f["figure"] == name)


def test_identical_rows_have_ratio_one_and_no_real_difference(tmp_path, capsys):
    row = _measured(100.0, 2.0)
    document = _json(capsys, *_folders(tmp_path, [row], [row]))
    assert document["command"] == "compare" and len(document["pairs"]) == 1
    for figure in document["pairs"][0]["figures"]:
        assert figure["ratio"] == pytest.approx(1.0)
        assert figure["verdict"] == "not real"
    assert {"samples_per_s", "step_time_ms", "peak_memory_gib"} <= {f["figure"] for f in
                                                                    document["pairs"][0]["figures"]}


def test_a_twice_slower_run_with_tight_spreads_is_a_real_difference(tmp_path, capsys):
    document = _json(capsys, *_folders(tmp_path, [_measured(100.0, 2.0)], [_measured(200.0, 4.0)]))
    step = _figure(document, "step_time_ms")
    assert step["ratio"] == pytest.approx(2.0)
    assert (step["verdict"], step["method"]) == ("real", "ci95")
    assert _figure(document, "samples_per_s")["ratio"] == pytest.approx(0.5)
    assert _figure(document, "samples_per_s")["verdict"] == "real"


def _steps(median_ms: float, spread_ms: float, count: int = 20) -> str:
    """`count` raw step times evenly spread over median +- spread, as the runner writes them (JSON)."""
    return json.dumps([median_ms - spread_ms + 2 * spread_ms * i / (count - 1) for i in range(count)])


def test_raw_step_times_decide_by_a_mann_whitney_test_before_the_intervals(tmp_path, capsys):
    """Intervals that overlap (the rows' 95 % intervals of the median, 100+-30 and 110+-30) say "not real"; 20 raw
    steps each, 95-105 ms against 105-115 ms, are told apart by the test on the steps themselves."""
    a = _measured(100.0, 30.0, step_times_ms=_steps(100.0, 5.0))
    b = _measured(110.0, 30.0, step_times_ms=_steps(110.0, 5.0))
    step = _figure(_json(capsys, *_folders(tmp_path, [a], [b])), "step_time_ms")
    assert (step["verdict"], step["method"]) == ("real", "mann-whitney")
    assert "p=" in step["how"]
    same = _measured(100.0, 30.0, step_times_ms=_steps(100.0, 5.0, count=19))
    step = _figure(_json(capsys, *_folders(tmp_path / "again", [a], [same])), "step_time_ms")
    assert (step["verdict"], step["method"]) == ("not real", "mann-whitney")


def test_overlapping_noisy_rows_are_not_a_real_difference(tmp_path, capsys):
    a = _measured(100.0, 30.0, noisy="true")
    document = _json(capsys, *_folders(tmp_path, [a], [_measured(120.0, 30.0)]))
    step = _figure(document, "step_time_ms")
    assert step["ratio"] == pytest.approx(1.2)
    assert (step["verdict"], step["method"]) == ("not real", "ci95")
    assert document["pairs"][0]["a"]["flags"] == ["noisy"]


def test_rows_without_a_spread_are_judged_by_the_stated_threshold(tmp_path, capsys):
    a, b = (_measured(step, 1.0, step_time_ci95_low_ms="", step_time_ci95_high_ms="") for step in (100.0, 105.0))
    document = _json(capsys, *_folders(tmp_path, [a], [b]))
    step = _figure(document, "step_time_ms")
    assert (step["verdict"], step["method"]) == ("not real", "threshold")
    assert "10 %" in step["how"]


def _prediction_and_measurement(tmp_path, measured_samples_per_s: float):
    """The committed A100-40GB prediction of one cell, and a measured A100 row of the same cell."""
    predicted = next(r for r in read_text(PREDICTED_RUNS, PREDICTED_COLUMNS).rows
                     if r["gpu"] == "A100-40GB" and r["status"] == "predicted")
    step_ms = int(predicted["effective_batch"]) / measured_samples_per_s * 1000
    measured = {name: value for name, value in predicted.items() if name in COLUMNS}
    measured.update(status="ok", device_type="cuda", device_name="NVIDIA A100-SXM4-40GB", memory_source="cuda_allocator",
                    samples_per_s=str(measured_samples_per_s), step_time_median_ms=str(step_ms),
                    step_time_ci95_low_ms=str(step_ms * 0.99), step_time_ci95_high_ms=str(step_ms * 1.01))
    a = _write(tmp_path / "predicted", [predicted], PREDICTED_COLUMNS, ("cell_id", "gpu"))
    b = _write(tmp_path / "a100", [measured])
    return str(a), str(b), predicted


@pytest.mark.parametrize("where,inside", [("middle", True), ("above", False)])
def test_a_measurement_is_inside_or_outside_the_predictions_band(tmp_path, capsys, where, inside):
    predicted = next(r for r in read_text(PREDICTED_RUNS, PREDICTED_COLUMNS).rows
                     if r["gpu"] == "A100-40GB" and r["status"] == "predicted")
    low, high = float(predicted["samples_per_s_low"]), float(predicted["samples_per_s_high"])
    samples = (low + high) / 2 if where == "middle" else high * 1.5
    a, b, _ = _prediction_and_measurement(tmp_path, samples)
    document = _json(capsys, a, b)
    assert len(document["pairs"]) == 1  # the other GPUs' predictions of the cell do not match an A100 row
    speed = _figure(document, "samples_per_s")
    assert speed["verdict"] == ("inside band" if inside else "outside band")
    assert (speed["a"]["low"], speed["a"]["high"]) == pytest.approx((low, high))
    assert _figure(document, "peak_allocated_gib")["method"] == "threshold"  # the estimator states no band here


def test_unmatched_rows_are_listed_with_their_count(tmp_path, capsys):
    rows = [r for r in read_text(CPU_RUNS).rows if r["status"] == "ok"][:3]
    a, b = _folders(tmp_path, rows, rows[:1])
    document = _json(capsys, a, b)
    assert len(document["pairs"]) == 1
    assert len(document["unmatched_a"]) == 2 and document["unmatched_b"] == []
    assert main(["compare", a, b]) == 0
    out = capsys.readouterr().out
    assert "A: 2 rows without a match in B" in out


def test_markdown_is_a_table_with_the_summary_below(tmp_path, capsys):
    a, b = _folders(tmp_path, [_measured(100.0, 2.0)], [_measured(200.0, 4.0)])
    assert main(["compare", a, b, "--format", "markdown"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith("| configuration | figure | A | B | B/A | difference | flags |")
    assert any(line.startswith("| ") and "| 2.000 | real (ci95) |" in line for line in lines)
    assert any(line.startswith("- step ms: 1 pairs, median difference 100 %, 1 of 1 differ") for line in lines)


@pytest.mark.parametrize("case", ["missing", "unknown kind", "no match", "not a plan"])
def test_bad_input_is_one_line_naming_the_path_and_exit_2(tmp_path, capsys, case):
    a = _write(tmp_path / "a", [_measured(100.0, 2.0)])
    other = tmp_path / "other"
    if case == "missing":
        b = tmp_path / "nowhere"
    elif case == "unknown kind":
        b = tmp_path / "notes.txt"
        b.write_text("hello\n")
    elif case == "no match":
        b = _write(other, [_measured(100.0, 2.0, model="resnet18")])
    else:
        b = tmp_path / "doc.json"
        b.write_text(json.dumps({"command": "probe"}))
    assert main(["compare", str(a), str(b)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("compare: reading")  # the progress line, then the one error line
    assert str(b) in err[1] and "Traceback" not in err[1]


def _plan_document(line: dict, samples_per_s: float) -> dict:
    """A plan's document (docs/json.md) with one option: the keys `bench compare` reads."""
    option = {"rank": 1, "usd_per_run": 10.0, "hours_per_run": 2.0, "usd_per_run_low": 8.0, "usd_per_run_high": 13.0,
              "hours_per_run_low": 1.6, "hours_per_run_high": 2.6, "instance": "aws p4d.24xlarge",
              "line": {**line, "samples_per_s_per_gpu": samples_per_s, "samples_per_s_per_gpu_low": samples_per_s * 0.8,
                       "samples_per_s_per_gpu_high": samples_per_s * 1.2, "peak_memory_gib": 10.0}}
    return {"command": "plan", "schema_version": 1, "options": [option]}


def test_a_plan_is_compared_with_a_measurement_on_the_axes_it_names(tmp_path, capsys):
    _, measured, predicted = _prediction_and_measurement(tmp_path, 1000.0)
    named = ("model", "image_size", "micro_batch", "accum_steps", "precision", "checkpointing", "optimizer")
    line = {name: predicted[name] for name in named} | {"image_size": int(predicted["image_size"]), "gpu": "A100-40GB",
                                                        "micro_batch": int(predicted["micro_batch"]),
                                                        "accum_steps": int(predicted["accum_steps"])}
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(_plan_document(line, 900.0)))
    document = _json(capsys, str(plan), measured)
    speed = _figure(document, "samples_per_s")
    assert speed["verdict"] == "inside band" and speed["ratio"] == pytest.approx(1000 / 900)
    slower = tmp_path / "slower.json"
    slower.write_text(json.dumps(_plan_document(line, 450.0)))
    document = _json(capsys, str(plan), str(slower))  # plan against plan: hours and dollars too
    assert {"samples_per_s", "hours_per_run", "usd_per_run"} <= {f["figure"] for f in document["pairs"][0]["figures"]}


@pytest.mark.slow  # predicts every measured cell: 1.5 s on 2 Xeon cores
def test_the_report_sets_the_prediction_beside_each_measured_gpu_cell(tmp_path):
    from bench.report import build_report

    predicted = next(r for r in read_text(PREDICTED_RUNS, PREDICTED_COLUMNS).rows
                     if r["gpu"] == "A100-40GB" and r["status"] == "predicted")
    inside = (float(predicted["samples_per_s_low"]) + float(predicted["samples_per_s_high"])) / 2
    _, measured, _ = _prediction_and_measurement(tmp_path, inside)  # tmp_path/predicted beside tmp_path/a100
    report = "\n".join(build_report(tmp_path / "a100")[-1].read_text().splitlines())
    assert "## Predicted beside measured" in report
    error = 100 * (float(predicted["samples_per_s"]) / inside - 1)
    assert f"- speed: 1 cells, median error {abs(error):.0f} %, 1 of 1 inside the band" in report
    assert "- peak memory: 1 cells, median error 0 %, no band stated" in report


def test_a_cpu_report_with_cpu_profile_estimates_does_not_say_there_is_no_estimate(tmp_path):
    from bench.report import build_report
    from bench.results.schema import ESTIMATE_COLUMNS

    rows = [r for r in read_text(CPU_RUNS).rows if r["status"] == "ok"][:4]
    estimated = [{**r, "status": "estimated", "memory_source": "estimate_tracked_tensors",
                  "peak_memory_bytes": str(int(int(r["peak_memory_bytes"]) * 1.05))} for r in rows]
    _write(tmp_path / "exp" / "estimate", estimated, ESTIMATE_COLUMNS)
    folder = _write(tmp_path / "exp" / "cpu-x", rows)
    report = build_report(folder)[-1].read_text()
    assert "## The estimator against the measurement" in report
    assert "No estimate of the grid as written yet" not in report
    assert "The estimates beside these rows are of the CPU profile" in report
    assert "| estimated peak (GiB) | measured peak (GiB) |" in report  # both values, not only their ratio


def test_the_accumulation_table_carries_a_noisy_rows_flag():
    import pandas as pd

    from bench.report.tables import accumulation_cost
    from bench.results.read import read_runs

    rows = read_runs(CPU_RUNS)
    table = accumulation_cost(rows.assign(noisy=pd.array([True] * len(rows), dtype="boolean")))
    assert len(table) and table["flags"].str.contains("large NOISY; accumulated NOISY").all()
