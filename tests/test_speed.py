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
from bench.measure.hardware import gpu_spec
from bench.speed.model import NoDatasheetPeak, gpu_rates, load_model_file, step_time
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
                         np.array([1e15]), np.array([1e9]), np.array([False]), np.array([1.0]))
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


def test_a_gpu_without_a_datasheet_peak_is_refused_not_guessed():
    with pytest.raises(NoDatasheetPeak, match="T4.*bf16_tflops"):
        gpu_rates(gpu_spec("T4"), "bf16")
    with pytest.raises(NoDatasheetPeak, match="tf32_tflops"):
        gpu_rates(gpu_spec("V100-16GB"), "tf32")
    rows = predicted_rows(_cell("test_resnet", 2, 1), ("A10G", "L4"))
    assert [(r["gpu"], r["status"], r.get("error_type")) for r in rows] == \
        [("A10G", "skipped", "NoDatasheetPeak"), ("L4", "predicted", None)]


def test_the_fit_reproduces_the_committed_parameters_byte_for_byte():
    from bench.speed.fit import fitted_params_json

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
