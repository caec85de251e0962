"""The CPU main job's trust: a device tag per machine, a thread budget, the quiet guard, adaptive timing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench.grid.spec import load_grid
from bench.measure import cpu, host, peak, timing
from bench.measure.cpu import CpuIdentity, cpu_identity, thread_budget
from bench.measure.device import DeviceInfo
from bench.measure.host import CpuTimes, LoadReading, QuietPolicy, foreign_load_cores, loaded
from bench.measure.peak import PeakFlops
from bench.results.peaks import ensure_peak
from bench.measure.timing import TimingPolicy, time_until_stable, warm_up
from bench.run import cell_process
from bench.run.cell_measurement import CellTask
from bench.run.grid_runner import MeasurePlan, RunOptions, measure_plan

REPO = Path(__file__).resolve().parent.parent


def cpuinfo(name: str, family: int, model: int, flags: str, sockets: int = 1, cores: int = 2, threads: int = 1) -> str:
    """/proc/cpuinfo text of a machine with `sockets` x `cores` cores of `threads` hardware threads."""
    blocks = []
    for socket in range(sockets):
        for index in range(cores * threads):
            blocks.append(f"processor\t: {len(blocks)}\nvendor_id\t: x\ncpu family\t: {family}\nmodel\t\t: {model}\n"
                          f"model name\t: {name}\nphysical id\t: {socket}\ncpu cores\t: {cores}\nflags\t\t: {flags}\n")
    return "\n".join(blocks)


ZEN3 = cpuinfo("AMD EPYC", 25, 1, "fpu sse avx2 fma")
ZEN5 = cpuinfo("AMD EPYC", 26, 2, "fpu sse avx2 fma avx512f avx512_bf16 avx512_vnni")
SAPPHIRE_RAPIDS = cpuinfo("Intel(R) Xeon(R) Platinum 8480+", 6, 143,
                          "avx2 fma avx512f avx512_bf16 amx_tile amx_bf16 amx_int8", sockets=2, cores=56, threads=2)


def cpu_device(text: str, threads: int = 2) -> DeviceInfo:
    identity = cpu_identity(text)
    return DeviceInfo("cpu", identity.model_name, ("fp32", "bf16"), threads, identity)


def test_two_cpus_of_one_model_name_but_different_isa_never_share_a_tag():
    # The case of the merged folder: a Zen 3 (AVX2, bf16 emulated) and a Zen 5 (AVX512-BF16) VM, both "AMD EPYC".
    zen3, zen5 = cpu_device(ZEN3), cpu_device(ZEN5)
    assert zen3.tag == "cpu-amd-epyc-f25m1-avx2-2c"
    assert zen5.tag == "cpu-amd-epyc-f26m2-avx512bf16-2c"


def test_a_tag_names_sockets_cores_and_hardware_threads():
    device = cpu_device(SAPPHIRE_RAPIDS)
    assert device.cpu.cores == 112 and device.cpu.logical_cpus == 224
    assert device.tag == "cpu-intel-xeon-platinum-8480-f6m143-amx-112c224t"
    assert "amx_bf16" in device.cpu.isa_flags


def test_same_machine_with_fewer_cores_is_another_tag():
    assert cpu_device(cpuinfo("AMD EPYC", 26, 2, "avx2", cores=2)).tag != cpu_device(
        cpuinfo("AMD EPYC", 26, 2, "avx2", cores=4)).tag


def test_thread_budget_is_capped_by_the_cgroup_quota(monkeypatch, tmp_path):
    quota = tmp_path / "cpu.max"
    quota.write_text("150000 100000\n")  # 1.5 CPUs
    monkeypatch.setattr(cpu, "_CGROUP_V2_MAX", quota)
    monkeypatch.setattr(cpu.os, "sched_getaffinity", lambda pid: set(range(8)))
    assert thread_budget() == 1
    quota.write_text("max 100000\n")
    assert thread_budget() == 8


def test_thread_budget_follows_the_affinity_mask(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu, "_CGROUP_V2_MAX", tmp_path / "absent")
    monkeypatch.setattr(cpu, "_CGROUP_V1_QUOTA", tmp_path / "absent")
    monkeypatch.setattr(cpu.os, "sched_getaffinity", lambda pid: {3})
    assert thread_budget() == 1


def test_foreign_load_is_the_machines_busy_time_less_the_cells_own():
    ticks = host._CLOCK_TICKS
    before = LoadReading(CpuTimes(steal=0, total=0, idle=0), own_ticks=0, monotonic_s=0.0)
    # 10 s on a 2-CPU machine: 1.5 CPU-s per second busy, the cell's tree used 1.0 of it
    after = LoadReading(CpuTimes(steal=0, total=20 * ticks, idle=5 * ticks), own_ticks=10 * ticks, monotonic_s=10.0)
    assert foreign_load_cores(before, after) == pytest.approx(0.5)


def test_a_cell_using_every_core_is_loaded_by_half_a_core_of_other_work(monkeypatch):
    monkeypatch.setattr(host, "machine_cpus", lambda: 2)
    assert loaded(0.5, threads=2) is True
    assert loaded(0.1, threads=2) is False
    assert loaded(0.5, threads=1) is False  # one core was free for the other work


def scripted(times_ms: list[float]):
    """A `time_steps` stand-in that hands out the scripted step times in order."""
    remaining = list(times_ms)

    def fake(run_step, steps, device):
        taken = [remaining.pop(0) for _ in range(steps)]
        return taken
    return fake


def test_timing_stops_once_the_interval_of_the_median_is_narrow(monkeypatch):
    steady = [100.0, 101.0, 99.0, 100.5, 99.5] + [100.0] * 100
    monkeypatch.setattr(timing, "time_steps", scripted(steady))
    timed = time_until_stable(lambda: None, torch.device("cpu"), TimingPolicy(min_steps=3, target_ci95_rel=0.05))
    assert timed.target_met is True
    assert len(timed.samples_ms) == 5  # the minimum with an interval: already within 5 %


def test_noisy_steps_are_timed_until_the_step_cap_and_the_row_says_the_target_was_missed(monkeypatch):
    noisy = [100.0, 300.0] * 100
    monkeypatch.setattr(timing, "time_steps", scripted(noisy))
    policy = TimingPolicy(min_steps=5, target_ci95_rel=0.05, max_steps=40)
    timed = time_until_stable(lambda: None, torch.device("cpu"), policy)
    assert (len(timed.samples_ms), timed.target_met) == (40, False)


def test_ddp_timing_is_a_fixed_count(monkeypatch):
    monkeypatch.setattr(timing, "time_steps", scripted([100.0, 300.0] * 10))
    timed = time_until_stable(lambda: None, torch.device("cpu"), TimingPolicy(min_steps=4, target_ci95_rel=None))
    assert (len(timed.samples_ms), timed.target_met) == (4, None)


def test_warm_up_goes_on_until_step_times_settle(monkeypatch):
    monkeypatch.setattr(timing, "time_steps", scripted([900.0, 400.0, 200.0, 150.0, 148.0, 147.0]))
    assert warm_up(lambda: None, torch.device("cpu"), TimingPolicy(min_steps=5, min_warmup_steps=2)) == 5


def test_warm_up_is_bounded(monkeypatch):
    monkeypatch.setattr(timing, "time_steps", scripted([100.0, 200.0] * 20))
    policy = TimingPolicy(min_steps=5, min_warmup_steps=1, max_extra_warmup_steps=6)
    assert warm_up(lambda: None, torch.device("cpu"), policy) == 6


def ok_outcome(foreign: float, is_loaded: bool) -> dict:
    return {"status": "ok", "loaded": is_loaded, "foreign_load_cores": foreign, "noisy": False,
            "step_time_ci95_rel": 0.01, "step_times_ms": "[1]"}


def smoke_task(require: bool) -> CellTask:
    cell = load_grid(REPO / "experiments" / "smoke.toml", "cpu").cells[0]
    return CellTask(cell, cpu_device(ZEN5), PeakFlops(None, "none"), None, quiet=QuietPolicy(wait_s=0, require=require))


def test_require_quiet_records_a_cell_timed_under_load_every_time_as_machine_busy(monkeypatch):
    calls = []
    monkeypatch.setattr(cell_process, "_wait_for_quiet", lambda task: 0.0)
    monkeypatch.setattr(cell_process, "_measure", lambda task, timeout: calls.append(1) or ok_outcome(1.2, True))
    outcome = cell_process.run_cell(smoke_task(require=True), timeout_s=10)
    assert len(calls) == 3  # measured, then retried twice
    assert (outcome["status"], outcome["error_type"]) == ("error", "MachineBusy")
    assert "1.20 cores busy" in outcome["error_message"] and "--retry-failed" in outcome["error_message"]


def test_require_quiet_keeps_the_retry_that_was_quiet(monkeypatch):
    outcomes = [ok_outcome(1.2, True), ok_outcome(0.02, False)]
    monkeypatch.setattr(cell_process, "_wait_for_quiet", lambda task: 0.0)
    monkeypatch.setattr(cell_process, "_measure", lambda task, timeout: outcomes.pop(0))
    outcome = cell_process.run_cell(smoke_task(require=True), timeout_s=10)
    assert (outcome["status"], outcome["loaded"], outcome["foreign_load_cores"]) == ("ok", False, 0.02)


def test_without_require_quiet_a_loaded_row_is_kept_and_flagged(monkeypatch):
    monkeypatch.setattr(cell_process, "_wait_for_quiet", lambda task: 0.0)
    monkeypatch.setattr(cell_process, "_measure", lambda task, timeout: ok_outcome(1.2, True))
    outcome = cell_process.run_cell(smoke_task(require=False), timeout_s=10)
    assert (outcome["status"], outcome["loaded"]) == ("ok", True)


def test_a_stored_peak_measured_under_load_is_measured_again(monkeypatch, tmp_path):
    device = cpu_device(ZEN5)
    readings = iter([1.5, 0.01])  # the first measurement shares the machine, the second has it alone
    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(peak, "wait_for_quiet", lambda threads, wait_s: (0.0, None))
    monkeypatch.setattr(peak, "foreign_load_cores", lambda before, after: next(readings))
    monkeypatch.setattr(peak, "measure_matmul_peak", lambda *args: (1e11, 64))
    monkeypatch.setattr(host, "machine_cpus", lambda: 2)
    first = ensure_peak(device, "fp32", tmp_path)
    assert "foreign load 1.5 cores" in first.source
    second = ensure_peak(device, "fp32", tmp_path)  # the loaded one is refused, measured again, quiet now
    assert "foreign load 0.01 cores" in second.source
    third = ensure_peak(device, "fp32", tmp_path)  # a quiet one is kept
    assert third.source == second.source


def test_a_run_says_how_many_cells_already_have_rows_and_how_to_measure_them_again():
    grid = load_grid(REPO / "experiments" / "smoke.toml", "cpu")
    ids = [cell.cell_id for cell in grid.cells]
    existing = {ids[0]: {"status": "ok"}, ids[1]: {"status": "timeout"}}
    plan = measure_plan(grid, existing, RunOptions())
    assert len(plan.todo) == len(ids) - 2
    line = plan.describe(Path("r/runs.csv"))
    assert f"{len(ids) - 2} to measure; 2 already have rows in r/runs.csv (1 ok, 1 timeout)" in line
    assert "--retry-failed" in line and "--force" in line
    assert measure_plan(grid, existing, RunOptions(retry_failed=True)).kept == {"ok": 1}
    # --force measures every cell again: the line says they have rows, which stay (it said "none has a row yet")
    forced = measure_plan(grid, existing, RunOptions(force=True)).describe(Path("r/runs.csv"))
    assert forced.startswith(f"{len(ids)} to measure; 2 of them again: their rows in r/runs.csv stay")
    assert "none has a row" not in forced


def test_nothing_to_measure_is_said_as_such():
    line = MeasurePlan((), {"ok": 4}).describe(Path("r/runs.csv"))
    assert line.startswith("0 to measure: 4 already have rows") and "--force measures them again" in line


def test_identity_of_this_machine_is_readable():
    identity: CpuIdentity = cpu_identity()
    assert identity.cores >= 1 and identity.logical_cpus >= identity.cores and identity.model_name


@pytest.mark.serial
def test_a_cell_is_timed_until_its_interval_target_and_its_row_says_how(tmp_path, write_grid, capfd):
    from tests.conftest import bench_in_process, read_rows, tiny_grid

    grid = write_grid(tiny_grid("adaptive", pairs="[[4, 1]]").replace("adaptive_timing = false",
                                                                       "timing_budget_s = 3\ntarget_ci95_rel = 0.2"))
    ran = bench_in_process(capfd, "run", str(grid), "--results", str(tmp_path / "results"), "--threads", "1")
    assert ran.returncode == 0, ran.stderr
    assert "1 to measure; none has a row" in ran.stdout
    [row] = read_rows(next((tmp_path / "results" / "adaptive").glob("cpu-*/runs.csv")))
    assert row["status"] == "ok" and row["cpu_threads"] == "1" and row["cpu_isa"]
    assert len(json.loads(row["step_times_ms"])) >= 5  # at least the steps an interval needs, not the grid's 2
    assert row["ci95_target_rel"] == "0.2"
    assert row["ci95_target_met"] == str(float(row["step_time_ci95_rel"]) <= 0.2).lower()
    assert int(row["warmup_steps_run"]) >= 2 and float(row["foreign_load_cores"]) >= 0
    # the machine's own speed around the timed steps: a CPU does at least a GFLOP/s of fp32 matmul
    assert float(row["reference_flops_per_s_before"]) > 1e9 and float(row["reference_flops_per_s_after"]) > 1e9
    rerun = bench_in_process(capfd, "run", str(grid), "--results", str(tmp_path / "results"), "--threads", "1")
    assert "0 to measure: 1 already have rows" in rerun.stdout and "nothing measured now" in rerun.stdout


@pytest.mark.parametrize(("key", "value"), [("target_ci95_rel", "0"), ("timing_budget_s", "-1"), ("threads", "0"),
                                            ("quiet_wait_s", "-5"), ("adaptive_timing", '"yes"')])
def test_bad_timing_settings_name_the_key(write_grid, key, value):
    from bench.errors import GridFileError
    from tests.conftest import tiny_grid

    text = tiny_grid("bad").replace("adaptive_timing = false\n", "").replace("quiet_wait_s = 0\n", "")
    grid = write_grid(text.replace("[run]", f"[run]\n{key} = {value}"))
    with pytest.raises(GridFileError, match=f"run.{key}"):
        load_grid(grid, "cpu")


def test_a_report_says_how_far_the_machines_own_speed_moved_across_its_rows():
    import pandas as pd

    from bench.report.tables import machine_speed_note

    rows = pd.DataFrame({"reference_flops_per_s_before": [60e9, 40e9], "reference_flops_per_s_after": [60e9, None]})
    assert "40.0 to 60.0 GFLOP/s (median 60.0) over 3 probes in 2 rows: a spread of 33 %" in machine_speed_note(rows)
    assert machine_speed_note(rows.iloc[:1]) is None  # one row cannot show a drift
    assert machine_speed_note(pd.DataFrame({"step_time_median_ms": [1.0, 2.0]})) is None  # rows before the probe

