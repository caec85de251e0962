"""Honest numbers: every timing with its spread, one peak per device, verdicts only from sources that can answer."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from test_cost import _instance, _row

import bench.measure.peak
import bench.run.cell_process
from bench.claims.claim import GPU_SPEED
from bench.claims.evaluate import Finding, evaluate, table_folder
from bench.claims.registry import CLAIMS
from bench.cost.price import Assumptions, Workload, gpu_speed, price_rows
from bench.errors import ResultsFileError
from bench.grid.cell import Cell, extra_axis_defaults
from bench.measure.device import DeviceInfo
from bench.measure.hardware import gpu_spec
from bench.measure.step_stats import NOISY_CI95_REL, summarize_step_times
from bench.measure.timing import TimingPolicy
from bench.report import build_report
from bench.report.console import console, summary_table
from bench.results.peaks import ensure_peak
from bench.results.rows import config_columns, keep_narrower
from bench.results.schema import COLUMNS, ESTIMATE_COLUMNS
from bench.results.store import RunsFile
from bench.run.cell_measurement import CellTask
from bench.run.cell_process import run_cell
from bench.units import GIB

CLAIM = {claim.id: claim for claim in CLAIMS}
CPU = DeviceInfo("cpu", "Some CPU", ("fp32", "bf16"), 2)


# --- spread of every timing ---------------------------------------------------------------------

def test_the_median_step_time_carries_an_interval_and_a_noisy_flag():
    steady = summarize_step_times([100.0, 101.0, 99.0, 100.5, 99.5, 100.2, 99.8, 100.1])
    assert steady.ci95_low_ms <= steady.median_ms <= steady.ci95_high_ms
    assert steady.ci95_rel < NOISY_CI95_REL and steady.noisy is False
    jumpy = summarize_step_times([226.0, 4152.0, 230.0, 3900.0, 240.0, 4000.0])  # the smoke cell's two modes
    assert jumpy.noisy is True
    assert summarize_step_times([226.0, 4152.0]).noisy is None  # two steps cannot show a spread: not stated
    assert summarize_step_times([5.0, 6.0, 7.0, 8.0, 9.0]) == summarize_step_times([5.0, 6.0, 7.0, 8.0, 9.0])


def _ok(times: list[float]) -> dict:
    stats = summarize_step_times(times)
    return {"status": "ok", "step_times_ms": json.dumps(times), "step_time_ci95_rel": stats.ci95_rel,
            "noisy": stats.noisy}


def test_a_noisy_cell_is_measured_again_in_a_fresh_process_and_the_narrower_kept(monkeypatch):
    measurements = iter([_ok([100.0, 400.0, 120.0, 390.0, 110.0]), _ok([100.0, 101.0, 99.0, 100.0, 100.5])])
    calls = []

    def measure(task, timeout_s):
        calls.append(task)
        return next(measurements)

    monkeypatch.setattr(bench.run.cell_process, "_measure", measure)
    monkeypatch.setattr(bench.run.cell_process, "_wait_for_quiet", lambda task: 0.0)  # whatever else runs beside
    cell = Cell(experiment="e", profile="cpu", model="test_vit", image_size=32, micro_batch=2, accum_steps=1,
                precision="fp32", checkpointing="off", optimizer="sgd", channels_last=False, warmup_steps=1,
                measured_steps=5)
    peak = bench.measure.peak.PeakFlops(None, "t")
    outcome = run_cell(CellTask(cell, CPU, peak, None, timing=TimingPolicy(min_steps=5, target_ci95_rel=0.05)), 60)
    assert len(calls) == 2 and outcome["remeasured"] is True
    assert json.loads(outcome["step_times_ms"])[1] == 101.0  # the steady measurement kept
    assert json.loads(outcome["discarded_step_times_ms"])[1] == 400.0  # the noisy one recorded beside it
    assert outcome["load_avg_1m"] is not None and "cpu_steal_pct" in outcome  # how loaded the host was
    # A grid of exactly its steps (adaptive_timing = false: no interval target) is measured once, its row flagged.
    measurements = iter([_ok([100.0, 400.0, 120.0, 390.0, 110.0])])
    once = run_cell(CellTask(cell, CPU, peak, None), 60)
    assert len(calls) == 3 and (once["noisy"], once["remeasured"]) == (True, False)


def test_a_steady_cell_is_measured_once():
    steady = _ok([100.0, 101.0, 99.0, 100.0, 100.5])
    assert keep_narrower(steady, {"status": "oom"})["step_times_ms"] == steady["step_times_ms"]


def _report_row(cell_id: str, micro: int, accum: int, noisy: bool, rel: float) -> dict:
    cell = Cell(experiment="fixture", profile="cpu", model="m", image_size=32, micro_batch=micro, accum_steps=accum,
                precision="fp32", checkpointing="off", optimizer="sgd", channels_last=False, warmup_steps=1,
                measured_steps=8)
    return {**config_columns(cell, CPU), "cell_id": cell_id, "status": "ok", "memory_source": "tracked_tensors",
            "peak_memory_bytes": GIB, "peak_tracked_bytes": GIB, "params_bytes": GIB // 4, "grads_bytes": GIB // 4,
            "optimizer_state_bytes": GIB // 4, "phase_memory": "[]", "samples_per_s": 100.0 / accum,
            "step_times_ms": json.dumps([80.0 * accum] * 8), "step_time_median_ms": 80.0 * accum,
            "step_time_p10_ms": 80.0 * accum, "step_time_p90_ms": 80.0 * accum, "step_time_ci95_rel": rel,
            "noisy": noisy, "remeasured": noisy}


def test_a_report_and_the_run_summary_never_hide_a_noisy_row(tmp_path):
    folder = tmp_path / "fixture" / "cpu-some"
    runs = RunsFile(folder / "runs.csv")
    rows = [_report_row("large", 8, 1, False, 0.02), _report_row("accumulated", 2, 4, True, 0.31)]
    for row in rows:
        runs.write(row)
    build_report(folder)
    report = (folder / "REPORT.md").read_text()
    [line] = [line for line in report.splitlines() if line.startswith("| m | 32 | 2×4 |")]
    assert "±15.5 NOISY (remeasured)" in line
    assert "CPU profile: the mechanisms, not the GPU answer" in report  # what a CPU row can show, up front
    with console.capture() as captured:
        console.print(summary_table("fixture", rows))
    assert "15.5 NOISY" in captured.get()


# --- one peak per device ------------------------------------------------------------------------

def test_two_folders_of_one_device_divide_by_the_same_stored_peak(tmp_path, monkeypatch):
    measured, load = [], {"cores": 0.0}

    def fake_matmul_peak(precision, device, size, min_time_s):
        measured.append(precision)
        return 1e11 + len(measured), size  # a different figure every time it is measured

    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache"))  # this machine's peaks across results roots
    monkeypatch.setattr(bench.measure.peak, "measure_matmul_peak", fake_matmul_peak)
    # a quiet machine, whatever else runs beside the tests: a peak measured under load is measured again
    monkeypatch.setattr(bench.measure.peak, "wait_for_quiet", lambda threads, wait_s: (0.0, 0.0))
    monkeypatch.setattr(bench.measure.peak, "foreign_load_cores", lambda before, after: load["cores"])
    first = ensure_peak(CPU, "fp32", tmp_path / "a")  # the first cell on this device measures and stores it
    again = ensure_peak(CPU, "fp32", tmp_path / "a")  # every later folder reads it
    assert first == again and len(measured) == bench.measure.peak.CPU_ROUNDS
    assert "peaks/cpu-some/peaks.csv" in first.source and first.source.startswith("measured 20")
    # Another results root on the machine copies the row, measured as it was, into its own file: no new measurement.
    elsewhere = ensure_peak(CPU, "fp32", tmp_path / "b")
    assert elsewhere == first and len(measured) == bench.measure.peak.CPU_ROUNDS
    assert (tmp_path / "b" / "peaks" / "cpu-some" / "peaks.csv").read_text() == \
        (tmp_path / "a" / "peaks" / "cpu-some" / "peaks.csv").read_text()
    other_threads = ensure_peak(replace(CPU, threads=1), "fp32", tmp_path / "a")
    assert other_threads.flops_per_s != first.flops_per_s  # a peak belongs to a thread count too
    # A peak measured under load stays in its own root: the next root measures its own.
    load["cores"] = 1.5
    loaded = ensure_peak(CPU, "bf16", tmp_path / "a")
    assert "foreign load 1.5 cores" in loaded.source
    count = len(measured)
    ensure_peak(CPU, "bf16", tmp_path / "c")
    assert len(measured) == count + bench.measure.peak.CPU_ROUNDS


def test_a_damaged_peaks_file_is_one_line_naming_the_file_line_and_column(tmp_path):
    """The stored peaks are read as every results table is: a hand-edited figure is refused where it is, not divided
    by (before, `float("fast")` raised a bare ValueError from inside the runner)."""
    path = tmp_path / "peaks" / CPU.tag / "peaks.csv"
    path.parent.mkdir(parents=True)
    path.write_text("device_tag,threads,precision,flops_per_s,foreign_load_cores\n"
                    f"{CPU.tag},2,fp32,fast,0.01\n")
    with pytest.raises(ResultsFileError, match=r"peaks.csv: line 2, column flops_per_s: .fast. is not a number; move "
                                               r"that line into a side file \(e.g. peaks.csv.bad\)"):
        ensure_peak(CPU, "fp32", tmp_path)


def test_a_gpu_peak_is_the_datasheet_and_stores_nothing(tmp_path):
    h200 = DeviceInfo("cuda", "NVIDIA H200", ("fp32", "bf16", "fp16"), 2)
    assert ensure_peak(h200, "bf16", tmp_path).flops_per_s == 989e12
    assert not (tmp_path / "peaks").exists()


# --- claims: verdicts only from sources that can answer them -------------------------------------

def _claims_rows(root, experiment: str, folder: str, device_type: str, rows: list[dict]) -> None:
    estimates = any(row.get("status") == "estimated" for row in rows)  # written as `bench estimate` writes them
    runs = RunsFile(root / experiment / folder / "runs.csv", ESTIMATE_COLUMNS if estimates else COLUMNS)
    for row in rows:
        runs.write({**extra_axis_defaults(), "status": "ok", "device_type": device_type,
                    "device_name": {"cuda": "NVIDIA H200", "cpu": "Some CPU"}[device_type], "error_message": "",
                    "experiment": experiment, "profile": "cpu" if device_type == "cpu" else "cuda", **row})


def _checkpointing_rows(slower: float) -> list[dict]:
    base = {"model": "resnet50", "image_size": 64, "micro_batch": 16, "accum_steps": 1, "effective_batch": 16,
            "precision": "fp32", "optimizer": "sgd", "phase_memory": "[]"}
    return [{**base, "cell_id": "off", "checkpointing": "off", "samples_per_s": 100.0},
            {**base, "cell_id": "full", "checkpointing": "full", "samples_per_s": 100.0 / (1 + slower)}]


def test_a_gpu_speed_claim_takes_no_verdict_from_cpu_rows(tmp_path):
    _claims_rows(tmp_path, "claims_checkpointing", "cpu-some", "cpu", _checkpointing_rows(0.33))
    finding = evaluate(CLAIM["002-checkpointing-time"], tmp_path)
    assert finding.verdict == "not testable here" and finding.source is None
    # What the CPU shows is there, labelled, with the FLOP counter's ratio.
    assert any("measured on CPU" in line and "no verdict on a GPU" in line for line in finding.supporting)
    assert any(line.startswith("FLOP counter") for line in finding.supporting)
    _claims_rows(tmp_path, "claims_checkpointing", "nvidia-h200", "cuda", _checkpointing_rows(0.30))
    on_gpu = evaluate(CLAIM["002-checkpointing-time"], tmp_path)
    assert (on_gpu.verdict, on_gpu.source) == ("holds", "cuda")


def test_every_speed_claim_accepts_gpu_rows_only():
    speed = [claim for claim in CLAIMS if claim.sources == GPU_SPEED]
    assert {"002-b-slower", "002-checkpointing-time", "000-selective-checkpointing-speed", "000-compile-speed",
            "002-vit-l-slower-at-8", "000-vit-b-faster", "000-ddp-no-sync-slow"} <= {claim.id for claim in speed}
    timed = [claim.id for claim in CLAIMS if "samples/s" in claim.method.lower()
             and claim.sources not in (GPU_SPEED, ("arithmetic",))]
    assert not timed, timed


def test_a_claim_over_a_range_says_where_it_holds(tmp_path):
    def row(micro: int, precision: str, peak_gib: float) -> dict:
        return {"cell_id": f"{micro}-{precision}", "model": "vit_large_patch16_224", "image_size": 224,
                "micro_batch": micro, "accum_steps": 64 // micro, "effective_batch": 64, "precision": precision,
                "optimizer": "adamw", "checkpointing": "off", "peak_memory_bytes": int(peak_gib * GIB),
                "status": "estimated"}
    _claims_rows(tmp_path, "claims_precision", "estimate", "cpu", [
        row(64, "fp32", 22.25), row(64, "fp16", 14.67), row(8, "fp32", 6.96), row(8, "fp16", 6.50)])
    finding = evaluate(CLAIM["000-amp-saving"], tmp_path)
    assert finding.verdict == "partly"
    assert finding.where_it_holds == "holds at 64×1; not at 8×8"


def test_a_larger_saving_than_claimed_exceeds_the_claim_rather_than_refuting_it():
    from bench.claims.verdict import range_check, verdict_of
    assert verdict_of([range_check("60-70 % less", 0.89, 0.60, 0.70, 0.0, "", favourable="higher")]) == \
        "exceeds the claim"
    assert verdict_of([range_check("60-70 % less", 0.30, 0.60, 0.70, 0.0, "", favourable="higher")]) == \
        "does not hold"


def test_the_claims_folder_is_named_after_the_devices_that_measured_its_rows(tmp_path):
    claim = CLAIMS[0]
    cpu = Finding(claim, "holds", source="cpu", rows_folder=tmp_path / "x" / "cpu-intel-xeon-processor")
    gpu = Finding(claim, "holds", source="cuda", rows_folder=tmp_path / "x" / "nvidia-h200")
    estimate = Finding(claim, "holds", source="estimate", rows_folder=tmp_path / "x" / "estimate")
    assert table_folder([cpu, estimate]) == "cpu-intel-xeon-processor"
    assert table_folder([cpu, gpu, estimate]) == "cpu-intel-xeon-processor+nvidia-h200"
    assert table_folder([estimate]) == "estimate"


# --- cost: nothing measured on a CPU stands for a GPU ----------------------------------------------

def test_a_scaling_efficiency_measured_on_a_cpu_is_never_applied_to_gpu_instances():
    single = _row(samples_per_s=2000.0)
    cpu_ddp = _row(cell_id="cpu-ddp", world_size=2, scaling_efficiency=0.42, profile="cpu", device_type="cpu",
                   device_name="Some CPU")
    eight = _instance("A100-40GB", gpu_count=8, usd_per_hour=8.0)
    (line,) = price_rows([single, cpu_ddp], (eight,), Workload(), Assumptions()).lines
    assert (line.scaling.efficiency, line.scaling.basis) == (0.9, "assumed (--scaling-efficiency)")


def test_an_fp16_row_measured_on_a_cpu_is_not_projected_onto_gpus():
    emulated = _row(precision="fp16", profile="cpu", device_type="cpu", device_name="Some CPU", mfu_pct=0.2)
    status, why = gpu_speed(emulated, gpu_spec("A100-40GB"))
    assert status == "no_mfu" and "emulated" in why
    bf16 = gpu_speed(emulated.with_columns(precision="bf16"), gpu_spec("A100-40GB"))
    assert bf16.basis == "projected_from_cpu_profile"  # labelled, and only on request (--allow-cpu-projection)


@pytest.mark.parametrize("claim_id", ["002-85-mfu", "002-steps"])
def test_the_articles_own_arithmetic_is_checked_without_rows(tmp_path, claim_id):
    finding = evaluate(CLAIM[claim_id], tmp_path)
    assert finding.verdict == "does not hold" and finding.source == "arithmetic" and finding.rows_folder is None
    if claim_id == "002-85-mfu":  # 1,281,167 images x 90 epochs in 17.8 h on one A100
        assert finding.checks[0].measured.startswith("1,799 samples/s")
