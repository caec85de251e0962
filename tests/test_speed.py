"""The throughput model: what the op recorder sees, how the roofline scales, refusals, the fit, and its rows."""

from __future__ import annotations

from dataclasses import replace
from importlib import resources

import numpy as np
import pytest
from conftest import REPO
from torch.utils.flop_counter import FlopCounterMode

from bench.cli import main
from bench.cost.catalog import load_catalog
from bench.cost.outputs import load_ok_rows
from bench.cost.price import Assumptions, Workload, price_rows
from bench.grid.cell import Cell
from bench.grid.spec import load_grid
from bench.measure.hardware import gpu_keys, gpu_spec
from bench.speed.model import GENERATIONS, NoDatasheetPeak, gpu_rates, step_time
from bench.speed.params import load_model_file
from bench.speed.ops import OpRecorder
from bench.speed.predict import predict_grid, predict_on, predicted_rows
from bench.speed.trace import OP_CLASSES, OpTable, trace_step_ops
from bench.train.models import build_model, synthetic_batch
from bench.train.optim import build_optimizer
from bench.train.step import train_step

REPO_SMOKE = REPO / "experiments" / "smoke.toml"


def _cell(model: str, micro_batch: int, accum_steps: int, **settings) -> Cell:
    values = dict(experiment="t", profile="cuda", model=model, image_size=32, micro_batch=micro_batch,
                  accum_steps=accum_steps, precision="bf16", checkpointing="off", optimizer="sgd",
                  channels_last=False, warmup_steps=1, measured_steps=1)
    return Cell(**{**values, **settings})


def _recorded_step(model_name: str, attention: str = "sdpa") -> tuple[OpRecorder, float]:
    model = build_model(model_name, 32, attention=attention)
    optimizer = build_optimizer("sgd", model.parameters())
    batch = synthetic_batch(2, 32, channels_last=False, device="cpu")
    with FlopCounterMode(display=False) as counter, OpRecorder() as recorder:
        train_step(model, optimizer, [batch], "fp32")
    return recorder, counter.get_total_flops()


def test_recorder_sees_a_resnets_convolutions_with_the_flop_counters_total():
    recorder, total = _recorded_step("test_resnet")
    classes = {record.op_class for record in recorder.records}
    assert "conv" in classes and "norm" in classes
    assert sum(record.flops for record in recorder.records) == total > 0


def test_recorder_sees_a_vits_attention():
    fused, _ = _recorded_step("test_vit")  # CPU's fused kernel: the flop counter does not count it, we do
    assert any(r.op_class == "attention" and r.flops > 0 for r in fused.records)
    eager, total = _recorded_step("test_vit", attention="eager")  # softmax between two matmuls
    assert not any(r.op_class == "attention" for r in eager.records)
    assert any("_softmax" in r.name for r in eager.records)
    assert sum(r.flops for r in eager.records) == total > 0


def test_a_compute_bound_op_on_a_gpu_with_twice_the_peak_takes_half_the_time():
    big_matmul = OpTable(np.array([OP_CLASSES.index("matmul")], dtype=np.int8), np.array([1], dtype=np.int8),
                         np.array([1e15]), np.array([1e9]), np.array([False]), np.array([1.0]), np.array([1e9]))
    spec = gpu_spec("A100-80GB")
    doubled = replace(spec, peak_tflops={k: None if v is None else 2 * v for k, v in spec.peak_tflops.items()})
    params = load_model_file().params
    one, two = (step_time(big_matmul, gpu_rates(s, "bf16"), params) for s in (spec, doubled))
    assert one.bound == two.bound == "compute"
    assert two.compute_s == pytest.approx(one.compute_s / 2, rel=1e-12)


@pytest.mark.parametrize("model", ["test_resnet", "test_vit"])
def test_smaller_micro_batches_never_predict_more_samples_per_second(model):
    effective = 16
    for gpu in ("H100-80GB", "L4", "RTX-3090"):
        rates = []
        for micro_batch in (2, 4, 8, 16):
            cell = _cell(model, micro_batch, effective // micro_batch)
            rates.append(predict_on(cell, trace_step_ops(cell), gpu_spec(gpu)).samples_per_s)
        assert rates == sorted(rates), (gpu, rates)


@pytest.mark.parametrize("model", ["test_resnet", "test_vit"])
def test_a_tiny_step_is_bound_by_its_overheads_and_its_gpu_time_grows_with_the_micro_batch(model):
    # v2 fitted the per-kernel and host costs to 0.02 us and put such a step memory-bound; and an op's
    # per-SM fill cost multiplied by its idle tiles made a bigger micro-batch's GPU time shorter.
    params = load_model_file().params
    assert params.kernel_us >= 1 and params.host_us >= 5  # held at a launch timing and a measurement
    for gpu in ("H100-80GB", "L4"):
        gpu_ms = []
        for micro_batch in (2, 8, 32):
            cell = _cell(model, micro_batch, 1)
            step = predict_on(cell, trace_step_ops(cell), gpu_spec(gpu)).step
            gpu_ms.append(step.gpu_s * 1e3)
            if micro_batch == 2:
                assert step.bound == "overhead", (gpu, step)
        assert gpu_ms == sorted(gpu_ms), (gpu, gpu_ms)


def test_a_gpu_without_a_datasheet_peak_is_refused_not_guessed():
    with pytest.raises(NoDatasheetPeak, match="T4.*bf16_tflops"):
        gpu_rates(gpu_spec("T4"), "bf16")
    with pytest.raises(NoDatasheetPeak, match="tf32_tflops"):
        gpu_rates(gpu_spec("V100-16GB"), "tf32")
    rows = predicted_rows(_cell("test_resnet", 2, 1), ("A10G", "L4"))
    assert [(r["gpu"], r["status"], r.get("error_type")) for r in rows] == \
        [("A10G", "skipped", "NoDatasheetPeak"), ("L4", "predicted", None)]


@pytest.mark.slow  # a full fit on 536 rows: about a minute on two shared cores
def test_the_fit_reproduces_the_committed_parameters_byte_for_byte():
    from bench.speed.calibrate import fitted_params_json

    text, _ = fitted_params_json()
    assert text == resources.files("bench.data").joinpath("speed_params.json").read_text()


def test_predicted_rows_are_priced_on_their_own_gpu_only(tmp_path):
    grid = load_grid(REPO_SMOKE, "cuda")
    path = predict_grid(grid, tmp_path, ("L4",))
    rows = load_ok_rows(path.parent)
    assert rows and all(row.predicted_gpu == "L4" for row in rows)
    table = price_rows(rows, load_catalog().select(), Workload(), Assumptions())
    assert table.priced and {line.instance.gpu for line in table.lines} == {"L4"}
    assert all(line.basis == "predicted" and line.note.startswith("predicted (model v") for line in table.priced)
    assert (path.parent / "accumulation.csv").exists() is False  # only the command writes the table


def test_plan_with_no_rows_at_all_ranks_predicted_options(capsys):
    code = main(["plan", "test_resnet", "--effective-batch", "16", "--image-size", "32", "--gpu", "L4",
                 "--gpu", "H100-80GB", "--precision", "bf16"])
    out = capsys.readouterr().out
    assert code == 0
    assert "predicted (model" in out and "why: " in out
    assert "L4" in out and "H100" in out


def test_plan_refuses_an_unknown_gpu_in_one_line(capsys):
    assert main(["plan", "test_resnet", "--effective-batch", "16", "--gpu", "H20"]) == 2
    assert "--gpu H20: not a catalog key" in capsys.readouterr().err


def test_every_gpu_the_model_predicts_has_its_shape_from_the_catalog_with_a_source():
    for key in gpu_keys():
        spec = gpu_spec(key)
        assert spec.generation in GENERATIONS, key
        if spec.sm_count is not None and spec.boost_clock_mhz is not None:
            assert spec.facts_source and "read 2026" in spec.facts_source
        else:  # no sourced SM count or clock: refused, not guessed
            with pytest.raises(NoDatasheetPeak, match="sm_count|boost_clock_mhz"):
                gpu_rates(spec, "fp32" if spec.peak_tflops["fp32_tflops"] else "bf16")


@pytest.fixture(scope="module")
def study_ops():
    """The study's conv net and transformer at sizes that fill a GPU (traced once for the physics tests)."""
    traced = {}
    for model, micro_batch in (("resnet50", 128), ("vit_base_patch16_224", 64)):
        for precision in ("bf16", "fp16", "tf32", "fp32"):
            for channels_last in (True, False):
                if model.startswith("vit") and not channels_last:
                    continue
                cell = _cell(model, micro_batch, 1, image_size=224, precision=precision, optimizer="adamw",
                             channels_last=channels_last)
                traced[(model, precision, channels_last)] = (cell, trace_step_ops(cell))
    return traced


def _speed(study_ops, key, gpu: str) -> float:
    cell, ops = study_ops[key]
    return predict_on(cell, ops, gpu_spec(gpu)).samples_per_s


def test_no_predicted_cell_exceeds_75_percent_of_its_dense_peak(study_ops):
    for cell, ops in study_ops.values():
        for gpu in gpu_keys():
            try:
                prediction = predict_on(cell, ops, gpu_spec(gpu))
            except NoDatasheetPeak:
                continue
            assert 0 < prediction.mfu_pct <= 75, (cell.model, cell.precision, gpu, prediction.mfu_pct)


def test_faster_memory_and_a_newer_gpu_predict_faster(study_ops):
    for key in study_ops:
        if key[1] == "fp16":
            continue  # the same shapes as bf16
        # A host-bound cell runs alike on every GPU: never slower on the better one, strictly faster below.
        assert _speed(study_ops, key, "A100-80GB") >= _speed(study_ops, key, "A100-40GB"), key
        assert _speed(study_ops, key, "H100-80GB") >= _speed(study_ops, key, "A100-80GB"), key
    conv_net = ("resnet50", "bf16", True)
    assert _speed(study_ops, conv_net, "A100-80GB") > _speed(study_ops, conv_net, "A100-40GB")
    assert _speed(study_ops, conv_net, "H100-80GB") > _speed(study_ops, conv_net, "A100-80GB")


def test_half_precision_channels_last_is_at_least_as_fast_as_nchw_for_a_conv_net(study_ops):
    checked = 0
    for gpu in gpu_keys():
        for precision in ("bf16", "fp16"):
            try:
                channels_last = _speed(study_ops, ("resnet50", precision, True), gpu)
            except NoDatasheetPeak:
                continue
            # Within 0.1 %: the two layouts' traces differ by a few layout copies, and the fitted
            # transpose cost (nchw_half_bytes) is near zero: these rows do not separate it (on the
            # B200 channels-last comes out 0.0003 % slower).
            assert channels_last >= 0.999 * _speed(study_ops, ("resnet50", precision, False), gpu), (gpu, precision)
            checked += 1
    assert checked >= 20


def test_tf32_lies_between_fp32_and_half_precision(study_ops):
    for model in ("resnet50", "vit_base_patch16_224"):
        for gpu in ("A100-40GB", "A100-80GB", "H100-80GB", "L4", "RTX-4090"):
            fp32, tf32, bf16, fp16 = (_speed(study_ops, (model, precision, True), gpu)
                                      for precision in ("fp32", "tf32", "bf16", "fp16"))
            # Where TF32 tensor cores barely beat the FP32 units (L4, GeForce) a TF32 cell may run the FP32 path.
            assert fp32 <= tf32 < min(bf16, fp16), (model, gpu, fp32, tf32, bf16, fp16)
            if gpu.startswith(("A100", "H100")):
                assert fp32 < tf32, (model, gpu)


def test_predicted_rows_carry_the_cross_gpu_interval_and_say_so():
    rows = predicted_rows(_cell("test_resnet", 2, 1), ("L4", "A100-80GB"))
    for row in rows:
        assert row["samples_per_s_low"] < row["samples_per_s"] < row["samples_per_s_high"]
        assert "leave-one-GPU-out" in row["speed_basis"] and "same-GPU" not in row["speed_basis"]


def test_the_written_tables_keep_their_committed_headers_from_declared_columns(tmp_path):
    from bench.commands.speed import ACCUMULATION_COLUMNS, _write_csv
    from bench.speed.validate import ERROR_COLUMNS, VALIDATION_COLUMNS, cross_gpu_columns

    header = lambda path: path.read_text().splitlines()[0].split(",")  # noqa: E731
    assert header(REPO / "docs/speed/validation.csv") == list(VALIDATION_COLUMNS)
    assert header(REPO / "docs/speed/cross_gpu.csv") == list(cross_gpu_columns())
    assert header(REPO / "docs/speed/logo_by_gpu.csv") == ["gpu", *ERROR_COLUMNS]
    assert header(REPO / "results/resnet50/predicted/accumulation.csv") == [c for c in ACCUMULATION_COLUMNS
                                                                           if c != "variant"]
    # A row whose first key is not the first column still lands under its own column; a stray key is refused.
    _write_csv([{"rows": 3, "gpu": "L4", "median_error_pct": 1, "p90_error_pct": 2, "median_ratio": 1.0}],
               tmp_path / "t.csv", ("gpu", *ERROR_COLUMNS))
    assert (tmp_path / "t.csv").read_text() == "gpu,rows,median_error_pct,p90_error_pct,median_ratio\nL4,3,1,2,1.0\n"
    with pytest.raises(ValueError, match="stray"):
        _write_csv([{"gpu": "L4", "stray": 1}], tmp_path / "u.csv", ("gpu", *ERROR_COLUMNS))
    assert not (tmp_path / "u.csv").exists()
