"""Cost estimates and the plan: catalogs, projection arithmetic, memory fit, ranking, and the CLI."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from conftest import CPU_ROWS, bench_in_process, paragraphs, read_rows

from bench.cost.catalog import COLUMNS as CATALOG_COLUMNS
from bench.cost.catalog import Instance, load_catalog
from bench.cost.outputs import COLUMNS as COST_COLUMNS
from bench.cost.price import (
    Assumptions,
    MeasuredRow,
    Workload,
    gpu_speed,
    memory_fit,
    price_line,
    price_rows,
    run_cost,
)
from bench.errors import CatalogError
from bench.planner.ranking import PlanError, PlanRequest, explain, make_plan
from bench.planner.rows import projection_errors
from bench.speed.params import load_model_file
from bench.measure.hardware import gpu_keys, gpu_spec
from bench.measure.utilization import samples_per_s_at
from bench.results.store import RunsFile
from bench.units import GIB

IMAGENET_90_EPOCHS = 1_281_167 * 90


def _row(model_speeds: tuple = (), **changes) -> MeasuredRow:
    """A made-up ResNet-50 row measured on an A100-40GB: 128x1 bf16, 40 % MFU, 20 GiB peak.

    A changed `samples_per_s` changes the MFU with it (24.6 GFLOP/sample, 312 TFLOP/s bf16 peak).
    """
    if "samples_per_s" in changes and "mfu_pct" not in changes:
        changes["mfu_pct"] = 100 * changes["samples_per_s"] * 24.6e9 / 312e12
    base = dict(status="ok", cell_id="r50-128x1", experiment="resnet50", profile="cuda", model="resnet50",
                image_size=224, micro_batch=128, accum_steps=1, precision="bf16", checkpointing="off",
                optimizer="adamw", device_type="cuda", device_name="NVIDIA A100-SXM4-40GB",
                samples_per_s=samples_per_s_at(40.0, 24.6e9, 312e12), mfu_pct=40.0,
                model_flops_per_sample=24.6e9, peak_memory_bytes=20 * GIB, memory_source="cuda_allocator")
    return MeasuredRow({**base, **changes}, model_speeds)


def _instance(gpu: str, gpu_count: int = 1, usd_per_hour: float = 1.0, **changes) -> Instance:
    fields = dict(provider="test", instance=f"{gpu_count}x-{gpu}-{usd_per_hour}", gpu=gpu, gpu_count=gpu_count,
                  gpu_memory_gb=gpu_spec(gpu).memory_gib, usd_per_hour=usd_per_hour, region="r",
                  observed="2025-01", source="made up for a test")
    return Instance(**{**fields, **changes})


# --- the seed article's own arithmetic -------------------------------------------------------

@pytest.mark.parametrize("one_gpu_hours, article_usd, at_0_9_usd", [(17.8, 73, 81), (18.9, 77, 86)])
def test_seed_article_p4d_arithmetic(one_gpu_hours, article_usd, at_0_9_usd):
    """Seed 002: 17.8 h (strategy A) and 18.9 h (B) of one A100 over a p4d.24xlarge's 8 GPUs
    at $32.77/h gives about $73 and $77 - with perfect scaling. At the default 0.9 efficiency
    the same hours cost $81 and $86."""
    p4d = next(i for i in load_catalog().select() if i.instance == "p4d.24xlarge")
    assert (p4d.gpu_count, p4d.gpu, round(p4d.usd_per_hour, 2)) == (8, "A100-40GB", 32.77)
    per_gpu = IMAGENET_90_EPOCHS / (one_gpu_hours * 3600)  # the article's one-GPU speed
    perfect = run_cost(samples_per_run=IMAGENET_90_EPOCHS, samples_per_s_per_gpu=per_gpu, gpu_count=8,
                       scaling_efficiency=1.0, usd_per_hour=p4d.usd_per_hour)
    assert perfect.hours_per_run == pytest.approx(one_gpu_hours / 8)
    assert round(perfect.usd_per_run) == article_usd
    realistic = run_cost(samples_per_run=IMAGENET_90_EPOCHS, samples_per_s_per_gpu=per_gpu, gpu_count=8,
                         scaling_efficiency=Assumptions().scaling_efficiency, usd_per_hour=p4d.usd_per_hour)
    assert round(realistic.usd_per_run) == at_0_9_usd


# --- pure arithmetic with made-up rows ----------------------------------------------------------

def test_projection_is_measured_mfu_times_the_target_peak():
    row = _row()
    h100 = gpu_speed(row, gpu_spec("H100-80GB"), projection_errors())
    assert h100.basis == "projected_from_gpu"
    assert h100.samples_per_s == pytest.approx(0.40 * 989e12 / 24.6e9)
    assert h100.samples_per_s == pytest.approx(row.samples_per_s * 989 / 312)  # same MFU, bigger peak
    assert "MFU 40.0%" in h100.assumption and "3.17x the peak" in h100.assumption
    assert "2.15x the memory bandwidth of A100-40GB" in h100.assumption  # 3350 / 1555 GB/s
    # The assumption's error across public pairs of GPUs (docs/speed/validation.md) comes with it, as an interval.
    projection = load_model_file().projection
    assert f"median error {projection.median_error_pct:.1f} %" in h100.assumption
    low, high = h100.interval
    assert low == pytest.approx(h100.samples_per_s / projection.ratio_high) and low < h100.samples_per_s < high
    # Pricing reads no file: without the errors passed in, the same projection states none and gives no interval.
    bare = gpu_speed(row, gpu_spec("H100-80GB"))
    assert bare.samples_per_s == h100.samples_per_s and bare.interval is None and "median error" not in bare.assumption
    fp32 = gpu_speed(_row(precision="fp32", mfu_pct=50.0), gpu_spec("L4"))
    assert fp32.samples_per_s == pytest.approx(0.50 * 30.3e12 / 24.6e9)  # the fp32 column, TF32 off


def test_a_gpu_row_on_another_gpu_scales_by_the_models_ratio_between_the_two():
    """Habitat's way: the measurement keeps what it got right on its own GPU, the model predicts what changes."""
    row = _row(samples_per_s=2000.0, model_speeds=(("A100-40GB", 1600.0), ("H100-80GB", 3000.0)))
    h100 = gpu_speed(row, gpu_spec("H100-80GB"), projection_errors())
    assert h100.basis == "projected_by_model" and h100.samples_per_s == pytest.approx(2000.0 * 3000 / 1600)
    assert "measured on A100-40GB x 1.88, the throughput model's predicted ratio of H100-80GB to A100-40GB" in \
        h100.assumption
    # Its validated error (the same pairs of public rows as the MFU carry-over's) and interval come with it.
    band = load_model_file().model_scaled
    assert f"median error {band.median_error_pct:.1f} %" in h100.assumption
    assert band.median_error_pct < load_model_file().projection.median_error_pct
    low, high = h100.interval
    assert low == pytest.approx(h100.samples_per_s / band.ratio_high) and low < h100.samples_per_s < high
    # A GPU the model has no speed for falls back to carrying the MFU over; the measuring GPU stays measured.
    assert gpu_speed(row, gpu_spec("L4")).basis == "projected_from_gpu"
    assert gpu_speed(row, gpu_spec("A100-40GB")).basis == "measured"


@pytest.mark.slow
def test_a_gpu_rows_model_speeds_are_the_throughput_models_own_predictions():
    from bench.planner.rows import with_model_speeds
    from bench.speed.predict import predict_on
    from bench.memory.traces import trace_step_ops

    row = _row(model="test_resnet", image_size=32, micro_batch=12, accum_steps=3, samples_per_s=900.0)
    cpu = _row(profile="cpu", device_type="cpu", device_name="Some CPU")
    traced, untouched = with_model_speeds([row, cpu])
    assert untouched is cpu  # no GPU measured it: nothing to scale
    speeds = dict(traced.model_speeds)
    assert {"A100-40GB", "H100-80GB", "L4"} <= set(speeds) and "T4" not in speeds  # T4: no bf16 peak
    cell = row.cell()
    expected = predict_on(cell, trace_step_ops(cell), gpu_spec("H100-80GB")).samples_per_s
    # what `bench predict` says for the cell, though read off the two traces bench plan makes (8 and 16)
    assert speeds["H100-80GB"] == pytest.approx(expected)
    h100 = gpu_speed(traced, gpu_spec("H100-80GB"))
    assert h100.samples_per_s == pytest.approx(900.0 * speeds["H100-80GB"] / speeds["A100-40GB"])


def test_the_measured_gpu_keeps_its_measured_speed():
    row = _row(samples_per_s=1234.5)
    speed = gpu_speed(row, gpu_spec("A100-40GB"))
    assert (speed.basis, speed.samples_per_s) == ("measured", 1234.5)


def test_no_projection_without_a_peak_or_an_mfu():
    assert gpu_speed(_row(), gpu_spec("T4"))[0] == "no_peak"  # T4: no bf16 tensor cores
    unknown_gpu = _row(device_name="NVIDIA H20", mfu_pct=None)
    assert gpu_speed(unknown_gpu, gpu_spec("L4"))[0] == "no_mfu"


def test_multi_gpu_instances_scale_by_count_and_efficiency():
    one = run_cost(samples_per_run=3600e3, samples_per_s_per_gpu=1000.0, gpu_count=1,
                   scaling_efficiency=0.9, usd_per_hour=2.0)
    assert (one.samples_per_s, one.hours_per_run, one.usd_per_run) == (1000.0, 1.0, 2.0)  # 1 GPU: no loss
    eight = run_cost(samples_per_run=3600e3, samples_per_s_per_gpu=1000.0, gpu_count=8,
                     scaling_efficiency=0.9, usd_per_hour=16.0, spot_usd_per_hour=8.0)
    assert eight.samples_per_s == pytest.approx(7200.0)
    assert eight.hours_per_run == pytest.approx(1 / 7.2)
    assert (eight.usd_per_run, eight.spot_usd_per_run) == pytest.approx((16 / 7.2, 8 / 7.2))


def test_a_measured_scaling_efficiency_replaces_the_default_and_says_so():
    single = _row(samples_per_s=2000.0)
    on_8 = _row(cell_id="r50-128x1-world_size_8", world_size=8, scaling_efficiency=0.8, samples_per_s=1600.0)
    forgot_no_sync = on_8.with_columns(cell_id="every", ddp_sync="every_step", scaling_efficiency=0.5)
    other_config = on_8.with_columns(cell_id="other", precision="fp32", scaling_efficiency=0.3)
    eight, four, one = (_instance("A100-40GB", gpu_count=n, usd_per_hour=n) for n in (8, 4, 1))
    table = price_rows([single, on_8, forgot_no_sync, other_config], (eight, four, one), Workload(), Assumptions())
    lines = {line.instance.gpu_count: line for line in table.lines}
    assert set(lines) == {8, 4, 1}  # only the 1-process row is priced; the DDP rows are its scaling
    assert {refusal.row.cell_id for refusal in table.refused} == {"r50-128x1-world_size_8", "every", "other"}
    assert (lines[8].scaling.efficiency, lines[8].scaling.basis) == \
        (0.8, "measured with 8 processes on NVIDIA A100-SXM4-40GB")
    assert lines[8].cost.hours_per_run == pytest.approx(IMAGENET_90_EPOCHS / (2000 * 8 * 0.8) / 3600)
    assert "at 0.8 scaling efficiency, measured with 8 processes" in lines[8].note
    assert (lines[4].scaling.efficiency, lines[4].scaling.basis) == (0.9, "assumed (--scaling-efficiency)")
    assert lines[1].scaling is None
    plan = make_plan([single, on_8], (eight,), PlanRequest(model="resnet50", effective_batch=1024), Assumptions())
    (option,) = plan.options
    assert option.line.scaling.efficiency == 0.8
    assert plan.left_out == {"data-parallel rows (their measured scaling efficiency is used instead)": 1}


def test_memory_fit_uses_reserved_when_present_and_marks_what_does_not_fit():
    l4 = _instance("L4")  # 24 GiB nominal
    allocated_only = price_line(_row(peak_memory_bytes=21 * GIB), l4, Workload(), Assumptions())
    assert allocated_only.status == "priced" and allocated_only.memory.required_bytes == pytest.approx(23.1 * GIB)
    reserved = price_line(_row(peak_memory_bytes=18 * GIB, peak_reserved_bytes=22 * GIB), l4, Workload(), Assumptions())
    assert reserved.status == "does_not_fit" and reserved.cost is None
    assert "needs 24.2 GiB" in reserved.note and "cuda_reserved" in reserved.note
    no_headroom = price_line(_row(peak_reserved_bytes=22 * GIB), l4, Workload(), Assumptions(headroom=0.0))
    assert no_headroom.status == "priced"
    assert memory_fit(24 * GIB, 0.0, 24).fits and not memory_fit(24 * GIB + 1, 0.0, 24).fits


def test_cpu_profile_rows_are_refused_unless_allowed_and_then_labelled():
    cpu_row = _row(profile="cpu", device_type="cpu", device_name="Intel(R) Xeon(R) Processor", image_size=32,
                   micro_batch=16, precision="fp32", mfu_pct=6.8, model_flops_per_sample=5.08e8,
                   memory_source="tracked_tensors")
    a100 = (_instance("A100-40GB"),)
    refused = price_rows([cpu_row], a100, Workload(), Assumptions())
    assert refused.lines == () and "CPU-profile row" in refused.refused[0].reason
    allowed = price_rows([cpu_row], a100, Workload(), Assumptions(allow_cpu_projection=True))
    (line,) = allowed.priced
    assert line.basis == "projected_from_cpu_profile" and line.note.startswith("NOT a GPU measurement")
    assert "32 px" in line.note and "tracked_tensors" in line.memory_basis
    assert line.samples_per_s_per_gpu == pytest.approx(0.068 * 19.5e12 / 5.08e8)


def test_the_oldest_price_used_is_reported_and_unpriced_lines_do_not_count():
    rows = [_row()]
    instances = (_instance("A100-40GB", observed="2025-03"), _instance("H100-80GB", observed="2024-11"),
                 _instance("T4", observed="2019-01"))  # T4 has no bf16 peak: not priced, not counted
    table = price_rows(rows, instances, Workload(), Assumptions())
    assert [line.status for line in table.lines] == ["priced", "priced", "no_peak"]
    assert table.oldest_price_observed == "2024-11"


def test_workload_sets_the_samples_per_run():
    row = _row(samples_per_s=1000.0)
    line = price_line(row, _instance("A100-40GB", usd_per_hour=3.0), Workload(dataset_size=36_000, epochs=10),
                      Assumptions())
    assert (line.cost.hours_per_run, line.cost.usd_per_run) == pytest.approx((0.1, 0.3))


# --- catalogs --------------------------------------------------------------------------------

def test_every_catalog_row_has_a_source_and_a_date():
    catalog = load_catalog()
    assert len(catalog.instances) >= 25
    for instance in catalog.instances:
        assert instance.source.strip() and re.fullmatch(r"\d{4}-\d{2}(-\d{2})?", instance.observed)
        assert instance.gpu_memory_gb == gpu_spec(instance.gpu).memory_gib
    for gpu in gpu_keys():
        spec = gpu_spec(gpu)
        assert spec.source and spec.observed and spec.memory_bandwidth_source
        assert spec.memory_bandwidth_gb_per_s > 0


def test_superseded_prices_are_kept_but_the_current_one_is_used():
    catalog = load_catalog()
    def prices(name, **kwargs):
        return [i.usd_per_hour for i in catalog.select(**kwargs) if i.instance == name]
    assert prices("p5.48xlarge") == [55.04] and prices("p5en.48xlarge") == [63.296]
    assert sorted(prices("p5.48xlarge", include_superseded=True)) == [55.04, 98.32]
    assert sorted(prices("p5en.48xlarge", include_superseded=True)) == [63.296, 84.80]
    current = [(i.provider, i.instance, i.region) for i in catalog.select()]
    assert len(current) == len(set(current))


def test_datasheet_bandwidths():
    assert {g: gpu_spec(g).memory_bandwidth_gb_per_s for g in ("A100-40GB", "H100-80GB", "H200", "T4")} == \
        {"A100-40GB": 1555, "H100-80GB": 3350, "H200": 4800, "T4": 320}


_GOOD = "aws,p4d.24xlarge,A100-40GB,8,40,32.7726,,us-east-1,2024-09,,SkyPilot catalog"


@pytest.mark.parametrize("case, line, column", [
    ("not a number", "aws,p4d.24xlarge,A100-40GB,8,40,lots,,us-east-1,2024-09,,x", "usd_per_hour"),
    ("unknown gpu", "aws,p4d.24xlarge,A999,8,40,32.7,,us-east-1,2024-09,,x", "gpu"),
    ("memory disagrees", "aws,p4d.24xlarge,A100-40GB,8,80,32.7,,us-east-1,2024-09,,x", "gpu_memory_gb"),
    ("bad date", "aws,p4d.24xlarge,A100-40GB,8,40,32.7,,us-east-1,Sept 2024,,x", "observed"),
    ("no source", "aws,p4d.24xlarge,A100-40GB,8,40,32.7,,us-east-1,2024-09,,", "source"),
    ("zero gpus", "aws,p4d.24xlarge,A100-40GB,0,40,32.7,,us-east-1,2024-09,,x", "gpu_count"),
    ("ends before it began", "aws,old,A100-40GB,8,40,32.7,,us-east-1,2024-09,2023-01,x", "valid_until"),
    ("two current prices", _GOOD, "valid_until"),
    ("a stray comma", _GOOD + ",extra", "source"),
    ("fields short", "aws,p4d.24xlarge,A100-40GB,8,40,32.7,,us-east-1,2024-09", "valid_until"),
])
def test_malformed_catalog_is_one_line_naming_file_row_and_column(case, line, column, tmp_path):
    path = tmp_path / "mine.csv"
    # Written without the vcpus column, added later: a catalog from before it still loads.
    header = [column for column in CATALOG_COLUMNS if column != "vcpus"]
    path.write_text(",".join(header) + "\n" + _GOOD + "\n" + line + "\n")
    with pytest.raises(CatalogError) as error:
        load_catalog(path)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: row 2 (line 3), column {column}:"), message


def test_catalog_header_problems_are_named(tmp_path):
    path = tmp_path / "mine.csv"
    path.write_text(",".join(c for c in CATALOG_COLUMNS if c != "region") + ",colour\n")
    with pytest.raises(CatalogError, match=r"mine.csv: header \(line 1\): missing column\(s\) region; "
                                           r"unknown column\(s\) colour"):
        load_catalog(path)


# --- the plan --------------------------------------------------------------------------------

def _plan_rows() -> list[MeasuredRow]:
    # Measured on an A100-40GB: the large batch is faster but needs 30 GiB; accumulation needs 8.
    return [_row(cell_id="128x1", samples_per_s=2000.0, peak_memory_bytes=30 * GIB),
            _row(cell_id="8x16", micro_batch=8, accum_steps=16, samples_per_s=1600.0, peak_memory_bytes=8 * GIB)]


def test_plan_ranks_fitting_options_by_dollars_and_says_why_the_winner_wins():
    a100, l4, big = _instance("A100-40GB", usd_per_hour=1.29), _instance("L4", usd_per_hour=0.44), \
        _instance("A100-40GB", gpu_count=8, usd_per_hour=32.77)
    plan = make_plan(_plan_rows(), (a100, l4, big), PlanRequest(model="resnet50", effective_batch=128), Assumptions(),
                     projection_errors())
    costs = [o.usd_per_run for o in plan.options]
    assert costs == sorted(costs)
    winner = plan.options[0]
    assert (winner.line.instance, winner.configuration, winner.line.basis) == \
        (a100, "128x1 per GPU bf16 ckpt-off adamw", "measured")
    assert winner.usd_per_run == pytest.approx(IMAGENET_90_EPOCHS / 2000 / 3600 * 1.29)
    # The 128x1 row (30 GiB + 10 %) does not fit an L4; 8x16 does, projected from the A100.
    l4_options = [o for o in plan.options if o.line.instance == l4]
    assert [o.configuration for o in l4_options] == ["8x16 per GPU bf16 ckpt-off adamw"]
    assert l4_options[0].line.basis == "projected_from_gpu"
    assert plan.left_out["do not fit in memory"] == 1
    # Runner-up: 8x16 on the L4 at 1600 x 121/312 samples/s, 51.6 h at $0.44/h against 16.0 h at $1.29/h.
    runner = plan.options[1]
    assert runner.line.instance == l4 and runner.configuration.startswith("8x16")
    # The runner-up's speed is a projection: its dollars are a range (the projection's validated p10-p90), which
    # reaches below the measured winner's, and the reason says so.
    projection = load_model_file().projection
    low, high = 22.71 * projection.ratio_low, 22.71 * projection.ratio_high
    assert plan.reason == ("test 1x-A100-40GB-1.29 (1x A100-40GB), 128x1 per GPU bf16 ckpt-off adamw: $20.66 "
                           f"on-demand for 16.0 h (measured) vs $22.71 (${low:,.2f}-{high:,.2f}) for the runner-up, "
                           "test 1x-L4-0.44 (1x L4), 8x16 per GPU bf16 ckpt-off adamw: 3.22x faster, which outweighs "
                           "2.93x the hourly price; the two overlap within their stated error, so either may be cheaper")
    alone = make_plan(_plan_rows(), (a100,), PlanRequest(model="resnet50", effective_batch=128), Assumptions())
    assert alone.reason.endswith("vs $25.82 for the runner-up, 8x16 per GPU bf16 ckpt-off adamw on the same "
                                 "instance: 1.25x faster")


def test_on_a_gpu_without_a_measurement_the_model_beats_a_carried_over_mfu():
    """The throughput model's cross-GPU error is several times smaller than the MFU carry-over's
    (docs/speed/validation.md): for one instance and configuration, its line stands over the projection."""
    l4 = _instance("L4", usd_per_hour=0.44)
    measured = _row(cell_id="8x16", micro_batch=8, accum_steps=16, samples_per_s=1600.0, peak_memory_bytes=8 * GIB)
    predicted = measured.with_columns(cell_id="8x16-L4", device_name="predicted for L4", samples_per_s=450.0,
                                      status="predicted", gpu="L4",
                                      speed_basis="predicted (model vT, leave-one-GPU-out, ...)",
                                      samples_per_s_low=400.0, samples_per_s_high=600.0,
                                      memory_source="estimate_cuda_allocator")
    plan = make_plan([measured, predicted], (l4,), PlanRequest(model="resnet50", effective_batch=128), Assumptions())
    option, = plan.options
    assert option.line.basis == "predicted" and option.line.samples_per_s_per_gpu == 450.0
    # Its hours follow its interval: the slowest end is the longest run.
    low, high = option.hours_range
    assert low == pytest.approx(option.hours_per_run * 450 / 600) and high == pytest.approx(option.hours_per_run * 450 / 400)


def test_a_measurement_scaled_by_the_model_beats_the_model_alone():
    """Across public pairs of GPUs the model's ratio applied to a measurement misses by less than the model alone
    (docs/speed/validation.md): for one instance and configuration, its line stands over the prediction."""
    l4 = _instance("L4", usd_per_hour=0.44)
    measured = _row(cell_id="8x16", micro_batch=8, accum_steps=16, samples_per_s=1600.0, peak_memory_bytes=8 * GIB,
                    model_speeds=(("A100-40GB", 1500.0), ("L4", 480.0)))
    predicted = MeasuredRow({**measured.row, "cell_id": "8x16-L4", "device_name": "predicted for L4",
                             "samples_per_s": 480.0, "status": "predicted", "gpu": "L4",
                             "speed_basis": "predicted (model vT, leave-one-GPU-out, ...)", "samples_per_s_low": 400.0,
                             "samples_per_s_high": 600.0, "memory_source": "estimate_cuda_allocator"})
    option, = make_plan([measured, predicted], (l4,), PlanRequest(model="resnet50", effective_batch=128),
                        Assumptions(), projection_errors()).options
    assert option.line.basis == "projected_by_model" and option.line.samples_per_s_per_gpu == pytest.approx(512.0)
    assert "measured speed x the model's ratio between the two GPUs: across" in option.evidence


def test_a_measured_line_carries_its_rows_95_percent_interval():
    from bench.cost.outputs import load_ok_rows

    folder = CPU_ROWS.parent
    rows = load_ok_rows(folder)
    raw = {r["cell_id"]: r for r in read_rows(folder / "runs.csv") if r["status"] == "ok"}
    assert rows
    for row in rows:
        low, high = row.speed_interval
        batch_ms = row.effective_batch * 1e3
        assert low == pytest.approx(batch_ms / float(raw[row.cell_id]["step_time_ci95_high_ms"]))
        assert high == pytest.approx(batch_ms / float(raw[row.cell_id]["step_time_ci95_low_ms"]))
        assert low <= row.samples_per_s <= high, row.cell_id
    # Had it been measured on an A100, its A100 line would be measured, with that interval.
    on_gpu = rows[0].with_columns(profile="cuda", device_type="cuda", device_name="NVIDIA A100-SXM4-40GB")
    line, = price_rows([on_gpu], (_instance("A100-40GB"),), Workload(), Assumptions()).lines
    assert (line.basis, line.speed_interval) == ("measured", rows[0].speed_interval)
    option = make_plan([on_gpu], (_instance("A100-40GB"),), PlanRequest(model="resnet50",
                       effective_batch=on_gpu.effective_batch, image_size=on_gpu.image_size), Assumptions()).options[0]
    assert "(95 % interval of the measured median step)" in option.evidence


def test_plan_splits_the_effective_batch_across_gpus():
    big = _instance("A100-40GB", gpu_count=8, usd_per_hour=32.77)
    plan = make_plan(_plan_rows(), (big,), PlanRequest(model="resnet50", effective_batch=128), Assumptions())
    (option,) = plan.options  # 128 per GPU x 8 GPUs cannot make 128
    assert (option.configuration, option.accum_steps_per_gpu) == ("8x2 per GPU bf16 ckpt-off adamw", 2)
    assert "measured at 8x16" in option.evidence
    assert plan.left_out == {"micro-batch x GPUs does not divide the effective batch 128": 1}
    assert option.hours_per_run == pytest.approx(IMAGENET_90_EPOCHS / (1600 * 8 * 0.9) / 3600)


def test_plan_budget_deadline_spot_and_nothing_fits():
    a100, l4 = _instance("A100-40GB", usd_per_hour=1.29), _instance("L4", usd_per_hour=0.44, spot_usd_per_hour=0.2)
    request = PlanRequest(model="resnet50", effective_batch=128)
    a100_run_usd = IMAGENET_90_EPOCHS / 2000 / 3600 * 1.29
    cheap = make_plan(_plan_rows(), (a100, l4), replace(request, budget_usd=a100_run_usd - 0.01), Assumptions())
    assert all(o.usd_per_run <= a100_run_usd - 0.01 for o in cheap.options) and cheap.left_out
    quick = make_plan(_plan_rows(), (a100, l4), replace(request, deadline_hours=17.0), Assumptions())
    assert [o.line.instance for o in quick.options] == [a100]  # 16.0 h; 8x16 on the A100 takes 20 h
    spot = make_plan(_plan_rows(), (a100, l4), replace(request, spot=True), Assumptions())
    assert {o.line.instance for o in spot.options} == {l4} and spot.options[0].usd_basis == "spot"
    assert spot.left_out["no spot price"] == 2
    none = make_plan(_plan_rows(), (a100,), replace(request, budget_usd=1.0), Assumptions())
    assert none.options == () and none.reason == "nothing fits the request"


def test_plan_reason_weighs_speed_against_hourly_price():
    fast = _instance("H100-80GB", usd_per_hour=3.0)
    cheap = _instance("A100-40GB", usd_per_hour=1.0)
    plan = make_plan([_row()], (fast, cheap), PlanRequest(model="resnet50", effective_batch=128), Assumptions())
    # Same MFU: the H100 is 3.17x faster at 3x the hourly price, so it wins by a little.
    assert plan.options[0].line.instance == fast
    assert "3.17x faster, which outweighs 3.00x the hourly price" in explain(plan.options)
    dear = _instance("H100-80GB", usd_per_hour=4.0)
    plan = make_plan([_row()], (dear, cheap), PlanRequest(model="resnet50", effective_batch=128), Assumptions())
    assert "4.00x cheaper per hour, which outweighs being 3.17x slower" in plan.reason


def test_plan_asks_for_an_image_size_when_rows_have_several():
    rows = [_row(), _row(cell_id="other", image_size=160)]
    with pytest.raises(PlanError, match=r"image sizes \[160, 224\]"):
        make_plan(rows, (_instance("L4"),), PlanRequest(model="resnet50", effective_batch=128), Assumptions())
    plan = make_plan(rows, (_instance("A100-40GB"),), PlanRequest(model="resnet50", effective_batch=128,
                                                                  image_size=160), Assumptions())
    assert [o.line.row.cell_id for o in plan.options] == ["other"]


# --- the command line ------------------------------------------------------------------------

def _results_folder(tmp_path, rows: list[MeasuredRow], status: str = "ok"):
    folder = tmp_path / "results" / "resnet50" / "nvidia-a100-sxm4-40gb"
    runs = RunsFile(folder / "runs.csv")
    for row in rows:
        runs.write({"cell_id": row.cell_id, "experiment": row.experiment, "profile": row.profile,
                    "model": row.model, "image_size": row.image_size, "micro_batch": row.micro_batch,
                    "accum_steps": row.accum_steps, "effective_batch": row.effective_batch,
                    "precision": row.precision, "checkpointing": row.checkpointing, "optimizer": row.optimizer,
                    "device_type": row.device_type, "device_name": row.device_name, "status": status,
                    "samples_per_s": row.samples_per_s, "mfu_pct": row.mfu_pct,
                    "model_flops_per_sample": row.model_flops_per_sample,
                    "peak_memory_bytes": row.peak_memory_bytes, "peak_reserved_bytes": row.peak_reserved_bytes,
                    "memory_source": row.memory_source})
    return folder


@pytest.mark.slow
def test_cost_command_writes_csv_markdown_and_chart_next_to_the_results(tmp_path, capfd):
    folder = _results_folder(tmp_path, _plan_rows())
    empty = _results_folder(tmp_path / "other", [_row(cell_id="oom")], status="oom")
    cpu = _results_folder(tmp_path / "cpu", [_row(cell_id="c", profile="cpu", device_type="cpu", device_name="A CPU")])
    result = bench_in_process(capfd, "cost", str(folder), str(empty), str(cpu))
    assert result.returncode == 0, result.stderr
    assert "oldest price used: 2024-09" in result.stdout and "no ok rows, skipped" in result.stdout
    # Every instance is offered each folder's rows, priced or not (the CPU row is refused without a projection).
    instances = len(load_catalog().select())
    assert f"2 ok rows x {instances} instances" in result.stdout and f"1 ok rows x {instances} instances" in result.stdout
    written = folder / "cost"
    assert {p.name for p in written.iterdir()} == {"cost.csv", "cost.md", "usd_per_run.png"}
    assert not (empty / "cost").exists()
    assert written.joinpath("cost.csv").read_text().splitlines()[0] == ",".join(COST_COLUMNS)
    lines = read_rows(written / "cost.csv")
    assert len(lines) == 2 * len(load_catalog().select())
    (p4d,) = [r for r in lines if r["instance"] == "p4d.24xlarge" and r["cell_id"] == "128x1"]
    assert (p4d["basis"], p4d["status"], p4d["global_batch"]) == ("measured", "priced", "1024")
    assert float(p4d["usd_per_run"]) == pytest.approx(IMAGENET_90_EPOCHS / (2000 * 8 * 0.9) / 3600 * 32.7726)
    assert p4d["usd_per_run_low"] == p4d["samples_per_s_per_gpu_low"] == ""  # measured: no model error to state
    # A projected line carries its validated range: the dollars at the fast and the slow end of the speed's.
    # The row's configuration was traced: its H100 speed is the A100 measurement x the model's H100 / A100 ratio.
    (h100,) = [r for r in lines if r["instance"] == "p5.48xlarge" and r["cell_id"] == "128x1"]
    assert h100["basis"] == "projected_by_model" and "the throughput model's predicted ratio" in h100["note"]
    speed, low, high = (float(h100[f"samples_per_s_per_gpu{end}"]) for end in ("", "_low", "_high"))
    assert float(h100["usd_per_run_low"]) == pytest.approx(float(h100["usd_per_run"]) * speed / high)
    assert float(h100["usd_per_run_high"]) == pytest.approx(float(h100["usd_per_run"]) * speed / low)
    assert low < speed < high
    (t4,) = [r for r in lines if r["instance"] == "g4dn.xlarge" and r["cell_id"] == "128x1"]
    assert (t4["status"], t4["usd_per_run"]) == ("no_peak", "")
    assert "Dollars per run: resnet50 on nvidia-a100-sxm4-40gb" in written.joinpath("cost.md").read_text()


@pytest.mark.slow
def test_cost_command_refuses_cpu_rows_unless_asked(tmp_path, capfd):
    cpu = _row(profile="cpu", device_type="cpu", device_name="Some CPU", image_size=32, micro_batch=16,
               memory_source="tracked_tensors")
    folder = _results_folder(tmp_path, [cpu])
    refused = bench_in_process(capfd, "cost", str(folder))
    assert refused.returncode == 0 and "CPU-profile row" in refused.stdout and not (folder / "cost").exists()
    allowed = bench_in_process(capfd, "cost", str(folder), "--allow-cpu-projection")
    assert allowed.returncode == 0 and "NOT GPU measurements" in allowed.stdout
    assert {r["basis"] for r in read_rows(folder / "cost" / "cost.csv") if r["status"] == "priced"} == \
        {"projected_from_cpu_profile"}


def test_bad_catalog_and_bad_folder_exit_2_with_one_line(tmp_path, capfd):
    folder = _results_folder(tmp_path, _plan_rows())
    bad = tmp_path / "prices.csv"
    bad.write_text(",".join(column for column in CATALOG_COLUMNS if column != "vcpus") + "\n"
                   + _GOOD.replace("32.7726", "cheap") + "\n")
    result = bench_in_process(capfd, "cost", str(folder), "--catalog", str(bad))
    assert result.returncode == 2
    assert result.stderr.strip() == f"bench: {bad}: row 1 (line 2), column usd_per_hour: 'cheap': " \
                                    f"Input should be a valid number, unable to parse string as a number"
    missing = bench_in_process(capfd, "plan", str(tmp_path / "nowhere"), "--model", "resnet50", "--effective-batch", "128")
    assert missing.returncode == 2 and "nowhere: no such folder" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_plan_command_prints_a_ranking_and_one_reason(tmp_path, capfd):
    folder = _results_folder(tmp_path, _plan_rows())
    result = bench_in_process(capfd, "plan", str(folder), "--model", "resnet50", "--effective-batch", "128", "--provider", "lambda")
    assert result.returncode == 0, result.stderr
    why = paragraphs(result.stdout, "why: ")
    # One reason: the winner's dollars and hours against the runner-up's. Which wins is the throughput model's call
    # (the A100 rows are projected to other GPUs by its ratio); a projected option's dollars are a range.
    assert len(why) == 1
    assert re.match(r"why: lambda \S+ \(1x [\w-]+\), \d+x\d+ per GPU bf16 ckpt-off adamw: \$[\d.]+ "
                    r"(\(\$[\d.]+-[\d.]+\) )?on-demand for [\d.]+ h", why[0])
    assert re.search(r"vs \$[\d.]+ (\(\$[\d.]+-[\d.]+\) )?for the runner-up", why[0])  # a measured one: no range
    # Every projection names how it was made and its error across public pairs of GPUs.
    assert re.search(r"projected_by_model \(measured speed x the model's ratio between the two GPUs: across \d+ pairs "
                     r"of public rows\s+on two GPUs, median error [\d.]+ %, p90 [\d.]+ %\)", result.stdout)
    assert "projected_from_gpu" not in result.stdout  # ResNet-50 traces: no MFU carried over
    assert "oldest price used: 2024-09" in result.stdout
    nothing = bench_in_process(capfd, "plan", str(folder), "--model", "resnet50", "--effective-batch", "128",
                        "--budget-usd", "0.01")
    assert nothing.returncode == 1 and "why: nothing fits the request" in nothing.stdout
