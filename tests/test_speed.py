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
from bench.speed.model import GENERATIONS, EntryRates, NoDatasheetPeak, gpu_rates, op_times, step_time
from bench.speed.params import load_model_file
from bench.measure.ops import OpRecorder
from bench.speed.predict import predict_grid, predict_on, predicted_rows
from bench.measure.op_table import DTYPES, OP_CLASSES, OpTable
from bench.memory.traces import trace_step_ops
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


@pytest.mark.slow
def test_recorder_sees_a_resnets_convolutions_with_the_flop_counters_total():
    recorder, total = _recorded_step("test_resnet")
    classes = {record.op_class for record in recorder.records}
    assert "conv" in classes and "batch_norm" in classes and "norm" not in classes  # every batch norm trains
    assert sum(record.flops for record in recorder.records) == total > 0


@pytest.mark.slow
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


def test_only_a_batch_norm_on_the_batchs_statistics_and_its_backward_count_as_two_passes():
    import torch

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.GroupNorm(2, 8),
                                torch.nn.LayerNorm(6))
    images = torch.randn(2, 3, 8, 8)
    with OpRecorder() as training:
        model(images).sum().backward()
    model.eval()
    with OpRecorder() as evaluating:
        model(images)
    classes = lambda recorder: {r.name.split(".")[1]: r.op_class for r in recorder.records if "norm" in r.name}
    assert classes(training) == {"native_batch_norm": "batch_norm", "native_batch_norm_backward": "batch_norm",
                                 "native_group_norm": "norm", "native_group_norm_backward": "norm",
                                 "native_layer_norm": "norm", "native_layer_norm_backward": "norm"}
    assert set(classes(evaluating).values()) == {"norm"}  # running statistics: one pass


def test_a_training_batch_norm_moves_its_bytes_the_fitted_times_over_and_a_layer_norm_once():
    params = load_model_file().params
    norms = OpTable(np.array([OP_CLASSES.index("batch_norm"), OP_CLASSES.index("norm")], dtype=np.int8),
                    np.array([DTYPES.index("float16")] * 2, dtype=np.int8), np.zeros(2), np.array([4e9, 4e9]),
                    np.array([True, True]), np.ones(2), np.array([1e9, 1e9]))
    rates = gpu_rates(gpu_spec("A100-80GB"), "bf16")
    times = op_times(norms, EntryRates.of(norms, rates), params)
    occupancy = rates.sm_count * params.bytes_per_sm_half
    assert (times.memory_s[0] / times.memory_s[1] ==
            pytest.approx((4e9 * params.batch_norm_bytes + occupancy) / (4e9 + occupancy)))
    assert params.batch_norm_bytes > 1.5  # at least the second read of the input


def _one_op(op_class: str, reduction: float, *, channels_last: bool = False, dtype: str = "float16",
            out_elements: float = 1e8) -> OpTable:
    """One op of `out_elements` outputs, each a reduction over `reduction` products (a convolution's: channels per
    group x kernel area)."""
    return OpTable(np.array([OP_CLASSES.index(op_class)], dtype=np.int8),
                   np.array([DTYPES.index(dtype)], dtype=np.int8),
                   np.array([2 * reduction * out_elements]), np.array([4 * out_elements]), np.array([channels_last]),
                   np.array([1.0]), np.array([out_elements]))


def test_a_weight_gradients_long_reduction_is_split_across_the_sms_and_attentions_is_not():
    # ViT-B/16's 768 x 768 weight gradient at 256 samples: 36 output tiles on an A100's 108 SMs, reduced over every
    # one of 256 x 197 token positions. cuBLAS splits that reduction (split-K) and fills the SMs; without it the op
    # would pay three whole waves for one.
    params, rates = load_model_file().params, gpu_rates(gpu_spec("A100-80GB"), "bf16")
    tensor_s = lambda op: op_times(op, EntryRates.of(op, rates), params).tensor_s[0]  # noqa: E731
    op = lambda op_class, outputs, reduction: _one_op(  # noqa: E731
        op_class, reduction, dtype="bfloat16", out_elements=outputs)
    weight_gradient, wide = op("matmul", 768 * 768, 256 * 197), op("matmul", 768 * 768 * 64, 256 * 197 / 64)
    assert tensor_s(weight_gradient) == pytest.approx(tensor_s(wide), rel=0.02)  # the same FLOPs, the same time
    # Flash attention parallelises over queries, heads and samples, never over the keys it reduces.
    narrow, wide = op("attention", 768 * 768, 256 * 197), op("attention", 768 * 768 * 64, 256 * 197 / 64)
    assert tensor_s(narrow) > 2.7 * tensor_s(wide)  # three waves for one (the per-SM fill cost paid once by each)


def test_an_nchw_half_convolution_pays_the_transposes_on_top_and_a_float_one_does_not():
    params = load_model_file().params
    rates = EntryRates.of(_one_op("conv", 576), gpu_rates(gpu_spec("A100-80GB"), "bf16"))
    nchw, nhwc = (op_times(_one_op("conv", 576, channels_last=layout), rates, params) for layout in (False, True))
    assert nhwc.transpose_s[0] == 0 < nchw.transpose_s[0]
    assert nchw.op_s[0] == pytest.approx(nhwc.op_s[0] + nchw.transpose_s[0])  # added, not hidden under the compute
    float_conv = _one_op("conv", 576, dtype="float32")
    fp32_rates = EntryRates.of(float_conv, gpu_rates(gpu_spec("A100-80GB"), "tf32"))
    assert op_times(float_conv, fp32_rates, params).transpose_s[0] == 0  # cuDNN runs fp32 NCHW natively


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16", "fp16"])
def test_a_precision_sets_the_tf32_switches_a_users_script_would_and_the_model_predicts_with_them(precision):
    import torch

    from bench.grid.cell import TF32_BY_PRECISION
    from bench.train.step import configure_precision

    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        configure_precision(precision)
        switches = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
    assert switches == ((False, False) if precision == "fp32" else (True, True))
    assert (TF32_BY_PRECISION[precision].matmul, TF32_BY_PRECISION[precision].conv) == switches
    assert gpu_rates(gpu_spec("A100-80GB"), precision).tf32 == TF32_BY_PRECISION[precision]


def test_tf32_runs_a_matmul_by_cublas_switch_and_a_convolution_by_cudnns():
    from bench.grid.cell import Tf32
    from bench.speed.model import tf32_entries

    ops = OpTable(np.array([OP_CLASSES.index(c) for c in ("matmul", "conv", "conv")], dtype=np.int8),
                  np.array([DTYPES.index(d) for d in ("float32", "float32", "bfloat16")], dtype=np.int8),
                  np.ones(3), np.ones(3), np.zeros(3, dtype=bool), np.ones(3), np.ones(3))
    pytorch_default = Tf32(matmul=False, conv=True)  # what a script that sets nothing gets
    assert tf32_entries(ops, pytorch_default).tolist() == [False, True, False]  # the bf16 op is no TF32 op
    rates = replace(gpu_rates(gpu_spec("A100-80GB"), "tf32"), tf32=pytorch_default)
    peaks = EntryRates.of(ops, rates).peak
    assert peaks[0] == 19.5e12 and peaks[1] == 156e12  # the A100's FP32 and TF32 datasheet peaks


def test_a_wide_group_channels_last_convolution_is_slow_on_cudnn_8_only():
    from bench.speed.model import GROUPED_NHWC_MIN_K, op_features

    params = load_model_file().params
    table = _one_op("grouped_conv", 2 * GROUPED_NHWC_MIN_K, channels_last=True)
    rates = EntryRates.of(table, gpu_rates(gpu_spec("RTX-3090"), "fp16"))
    torch2, cudnn8 = (op_times(op_features(table, rates, old), None, params) for old in (False, True))
    assert cudnn8.op_s[0] > 2 * torch2.op_s[0]  # off the tensor cores: RegNets at 0.3-0.45x channels-last
    narrow = _one_op("grouped_conv", GROUPED_NHWC_MIN_K / 4, channels_last=True)  # depthwise, ResNeXt's 4-wide groups
    assert op_times(op_features(narrow, rates, True), None, params).op_s[0] == \
        op_times(op_features(narrow, rates, False), None, params).op_s[0]


@pytest.mark.parametrize("model", ["test_resnet", "test_vit"])
@pytest.mark.slow
def test_smaller_micro_batches_never_predict_more_samples_per_second(model):
    effective = 16
    for gpu in ("H100-80GB", "L4", "RTX-3090"):
        rates = []
        for micro_batch in (2, 4, 8, 16):
            cell = _cell(model, micro_batch, effective // micro_batch)
            rates.append(predict_on(cell, trace_step_ops(cell), gpu_spec(gpu)).samples_per_s)
        assert rates == sorted(rates), (gpu, rates)


@pytest.mark.parametrize("model", ["test_resnet", "test_vit"])
@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.xdist_group("study_ops")  # on one worker: the fixture is traced once
def test_no_predicted_cell_exceeds_75_percent_of_its_dense_peak(study_ops):
    for cell, ops in study_ops.values():
        for gpu in gpu_keys():
            try:
                prediction = predict_on(cell, ops, gpu_spec(gpu))
            except NoDatasheetPeak:
                continue
            assert 0 < prediction.mfu_pct <= 75, (cell.model, cell.precision, gpu, prediction.mfu_pct)


@pytest.mark.slow
@pytest.mark.xdist_group("study_ops")  # on one worker: the fixture is traced once
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


@pytest.mark.slow
@pytest.mark.xdist_group("study_ops")  # on one worker: the fixture is traced once
def test_half_precision_channels_last_is_faster_than_nchw_for_a_conv_net(study_ops):
    checked = 0
    for gpu in gpu_keys():
        for precision in ("bf16", "fp16"):
            cell_ops = {layout: study_ops[("resnet50", precision, layout)] for layout in (True, False)}
            try:
                channels_last, nchw = (predict_on(cell, ops, gpu_spec(gpu)) for cell, ops in cell_ops.values())
            except NoDatasheetPeak:
                continue
            if "overhead" in (channels_last.step.bound, nchw.step.bound):
                # Host-bound (the fastest GPUs at this micro-batch): the step is the ops' dispatch, and the
                # channels-last trace dispatches a few layout copies more.
                assert channels_last.samples_per_s >= 0.98 * nchw.samples_per_s, (gpu, precision)
                continue
            # The NCHW cell pays cuDNN's transposes (timm's RTX 3090 ResNets train 1.17-1.35x faster channels-last).
            assert channels_last.samples_per_s > 1.05 * nchw.samples_per_s, (gpu, precision)
            checked += 1
    assert checked >= 16


@pytest.mark.slow
@pytest.mark.xdist_group("study_ops")  # on one worker: the fixture is traced once
def test_tf32_lies_between_fp32_and_half_precision(study_ops):
    for model in ("resnet50", "vit_base_patch16_224"):
        for gpu in ("A100-40GB", "A100-80GB", "H100-80GB", "L4", "RTX-4090"):
            fp32, tf32, bf16, fp16 = (_speed(study_ops, (model, precision, True), gpu)
                                      for precision in ("fp32", "tf32", "bf16", "fp16"))
            # Where TF32 tensor cores barely beat the FP32 units (L4, GeForce) a TF32 cell may run the FP32 path.
            assert fp32 <= tf32 < min(bf16, fp16), (model, gpu, fp32, tf32, bf16, fp16)
            if gpu.startswith(("A100", "H100")):
                assert fp32 < tf32, (model, gpu)


def test_a_prediction_takes_the_band_of_the_narrowest_training_slice_and_says_what_it_rests_on():
    from bench.speed.params import UNSEEN_GENERATION, ErrorBand

    band = lambda low, high, rows=25: ErrorBand(10.0, 30.0, low, high, rows, "leave-one-GPU-out")  # noqa: E731
    model = replace(load_model_file(), training_gpus=("RTX-3090", "A100-80GB", "V100-16GB"),
                    bands={"train": band(0.8, 1.5), "gddr train": band(0.8, 1.3), "gddr conv train": band(0.8, 1.2),
                           "hbm train": band(0.9, 1.1, 52), UNSEEN_GENERATION: band(0.7, 1.4, 40)})
    a10, a100, h200 = gpu_spec("A10"), gpu_spec("A100-80GB"), gpu_spec("H200")
    assert model.band(a10, "conv") == band(0.8, 1.2) and model.band(a10, "matmul") == band(0.8, 1.3)
    assert model.interval(120.0, a10, "conv") == pytest.approx((100.0, 150.0))
    assert "training rows on A100-80GB; band from training rows on hbm GPUs, n=52" in model.basis(a100, "conv")
    assert "no training row on A10: band from training rows of conv nets on gddr GPUs, n=25" in \
        model.basis(a10, "conv")
    # Hopper has no training row at all: each end of the band widens to the unseen-generation slice's.
    assert model.interval(110.0, h200, "conv") == pytest.approx((110.0 / 1.4, 110.0 / 0.7))
    assert "no training row on H200 (hopper, a generation with none): band from training rows on hbm GPUs, n=52, " \
        "widened to training rows of a generation the fit never saw, n=40" in model.basis(h200, "conv")


def test_bands_rest_on_held_out_training_rows_of_both_schemes_only():
    from bench.speed.params import UNSEEN_GENERATION
    from bench.speed.validate import band_coverage, error_bands

    measured = np.full(60, 100.0)
    logo, loso = np.linspace(80, 120, 60), np.linspace(60, 140, 60)
    training = np.arange(60) < 40
    gpus = np.array(["A", "B"] * 30)
    kinds, mixes = np.full(60, "hbm"), np.full(60, "conv")
    bands = error_bands({"logo": logo, "loso": loso}, measured, gpus, kinds, mixes, training, logo * 0.5)
    # Inference rows (the last 20) never move a training band; both schemes' residuals are pooled.
    wild = logo.copy()
    wild[~training] = 1e6
    assert bands == error_bands({"logo": wild, "loso": loso}, measured, gpus, kinds, mixes, training, logo * 0.5)
    assert bands["hbm conv train"].rows == 80 and "leave-one-source-out" in bands["hbm conv train"].held_out
    assert bands[UNSEEN_GENERATION].ratio_high < 0.65
    # A band measured on the other GPU's residuals, applied to this GPU's held-out predictions.
    coverage = band_coverage({"logo": logo}, measured, training, gpus)
    assert coverage["predictions"] == 40 and 60 <= coverage["coverage_pct"] <= 100


@pytest.mark.slow
@pytest.mark.xdist_group("study_ops")  # on one worker: the fixture is traced once
def test_the_study_models_op_mix_is_what_their_layers_are(study_ops):
    from bench.speed.model import op_mix

    for (model, precision, channels_last), (cell, ops) in study_ops.items():
        assert op_mix(ops.for_step(1)) == ("conv" if model == "resnet50" else "matmul"), (model, precision)


def test_the_targets_table_lists_every_slice_with_both_held_out_errors_and_the_committed_coverage():
    import csv

    from bench.speed.validate import TARGET_SLICES, targets_table

    with (REPO / "docs/speed/validation.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    table = targets_table(rows)
    train = [row for row in rows if row["mode"] == "train"]
    assert table[0]["slice"] == "all" and table[0]["rows"] == len(train)
    for column in TARGET_SLICES:  # every source, GPU, precision, memory format, family and op mix of a training row
        assert {line["value"] for line in table if line["slice"] == column} == {row[column] for row in train}
        assert sum(line["rows"] for line in table if line["slice"] == column) == len(train)
    # The same coverage the validation page states for bands held out by source, and within the 80 % band's
    # honest range there: the band's percentiles were chosen by GPU, so the sources are a check it had no say in.
    assert f"held out by source: **{table[0]['coverage_pct']} %**" in (REPO / "docs/speed/validation.md").read_text()
    assert 75 <= table[0]["coverage_pct"] <= 85
    assert all(line["logo_median_pct"] >= 0 and line["loso_p90_pct"] >= line["loso_median_pct"] for line in table)


def test_the_committed_bands_are_the_slices_of_the_committed_held_out_predictions():
    """speed_params.json's intervals are docs/speed/validation.csv's held-out residuals of training rows, sliced."""
    import pandas as pd

    from bench.speed.params import BAND_MIN_ROWS, UNSEEN_GENERATION, band_key
    from bench.speed.validate import calibrated_quantiles, error_bands

    rows = pd.read_csv(REPO / "docs/speed/validation.csv")
    kinds = np.array([band_key(gpu_spec(gpu)) for gpu in rows["gpu"]])
    gpus, measured, training = rows["gpu"].to_numpy(), rows["measured_samples_per_s"].to_numpy(), \
        (rows["mode"] == "train").to_numpy()
    held_out = {name: rows[f"{name}_predicted_samples_per_s"].to_numpy() for name in ("logo", "loso")}
    quantiles = calibrated_quantiles(held_out, measured, training, gpus)
    assert quantiles[0] <= 10 <= 90 <= quantiles[1]  # never narrower than the nominal p10-p90
    bands = error_bands(held_out, measured, gpus, kinds, rows["op_mix"].to_numpy(), training,
                        rows["logen_predicted_samples_per_s"].to_numpy(), quantiles)
    committed = load_model_file().bands
    assert committed.keys() == bands.keys() and {"train", "hbm train", UNSEEN_GENERATION} <= committed.keys()
    # The RTX 3090's training rows alone set no slice: a one-GPU error is not a cross-GPU one.
    assert "gddr conv train" not in committed and "gddr train" not in committed
    assert all(key.endswith("train") for key in committed)  # never an inference row's error
    for key, band in bands.items():
        # validation.csv rounds predictions to 0.1 samples/s: the bands agree to their own rounding
        assert committed[key].rows == band.rows and (band.rows >= BAND_MIN_ROWS or key == "train")
        assert committed[key].ratio_low == pytest.approx(band.ratio_low, abs=0.002), key
        assert committed[key].ratio_high == pytest.approx(band.ratio_high, abs=0.002), key
    assert set(load_model_file().training_gpus) == set(rows.loc[rows["mode"] == "train", "gpu"])


def test_carrying_a_measured_mfu_to_another_gpu_has_the_committed_error_and_holds_between_twins():
    from bench.speed.validate import projection_band, projection_by_pair, projection_pairs

    pairs = projection_pairs()
    assert load_model_file().projection == projection_band(pairs)
    by_pair = {(r["from_gpu"], r["to_gpu"]): r for r in projection_by_pair(pairs)}
    # The same chip with more memory: the MFU carries over within a few per cent ...
    assert by_pair[("V100-16GB", "V100-32GB")]["median_error_pct"] < 5
    # ... not to a GPU of another shape: the RTX 4090's 2.3x fp16 peak over the 3090's is not 2.3x the speed.
    assert by_pair[("RTX-3090", "RTX-4090")]["median_ratio"] > 1.3


def test_a_model_scaled_projection_takes_both_predictions_from_the_fit_that_never_saw_the_target():
    import types

    from bench.speed.validate import model_scaled_pairs

    row = lambda gpu, samples, model="m": types.SimpleNamespace(  # noqa: E731
        source="s", mode="train", precision="fp16", model=model, memory_format="channels_last", batch_size=64,
        image_size=224, attention="eager", gpu=gpu, samples_per_s=samples)
    data = types.SimpleNamespace(rows=[row("X", 100.0), row("Y", 300.0), row("Y", 50.0, model="n")])
    # The fit without Y predicts X at 80 and Y at 200 (2.5x); without X, X at 120 and Y at 240 (2x).
    fits = {"Y": np.array([80.0, 200.0, 1.0]), "X": np.array([120.0, 240.0, 1.0])}
    assert model_scaled_pairs(data, fits) == [("X", "Y", pytest.approx(100 * 2.5 / 300)),
                                              ("Y", "X", pytest.approx(300 / 2 / 100))]


def test_the_validation_page_states_every_slice_and_both_projections():
    from bench.report.speed_validation import validation_markdown
    from bench.speed.params import ErrorBand

    model = load_model_file()
    summary = {"rows": 536, "median_error_pct": 14.5, "p90_error_pct": 41.4, "median_ratio": 0.95}
    scaled = ErrorBand(11.0, 38.0, 0.79, 1.27, 336)
    tables = {"logo": summary, "lofo": summary, "loso": summary, "bands": model.bands, "projection": model.projection,
              "coverage": {"by GPU": {"coverage_pct": 61.0, "predictions": 340}}, "band_quantiles": (5.5, 94.5),
              "projection_by_pair": [], "model_scaled": scaled, "logo_by_gpu": [], "logo_by_family": [],
              "lofo_by_family": [], "lofo_by_gpu": [],
              "rows": [{"gpu": "H200", "family": "bert"}, {"gpu": "RTX-3090", "family": "vit"}]}
    ratios = [{"model": "resnet50", "precision": "bf16", "micro_batch": 256, "L4_x": 0.3, "L4_mfu_pct": 10.0}]
    page = validation_markdown(tables, ratios, model.version)
    assert all(f"| {key} | {band.rows} |" in page for key, band in model.bands.items())
    assert "held out by GPU: **61.0 %** of 340 predictions" in page
    assert "divided by the 94.5th and 5.5th percentiles" in page and "predicted/measured p5.5 | p94.5 |" in page
    assert f"median error **{model.projection.median_error_pct} %**" in page
    assert "off by median **11.0 %**, p90 **38.0 %**" in page and "14.5 % / 41.4 % for the model alone" in page
    # The cross-GPU ratios say what the fit saw of the newest GPUs they are read for.
    assert "The fit's rows on Hopper and Blackwell: 1 (H200), of the families bert." in page


def test_predicted_rows_carry_the_cross_gpu_interval_and_say_so():
    rows = predicted_rows(_cell("test_resnet", 2, 1), ("L4", "A100-80GB"))
    for row in rows:
        assert row["samples_per_s_low"] < row["samples_per_s"] < row["samples_per_s_high"]
        assert "leave-one-GPU-out" in row["speed_basis"] and "same-GPU" not in row["speed_basis"]
        assert "80 % band: " in row["speed_basis"] and "n=" in row["speed_basis"]


def test_the_written_tables_keep_their_committed_headers_from_declared_columns(tmp_path):
    from bench.speed.predict import ACCUMULATION_COLUMNS
    from bench.frames import write_csv
    from bench.speed.hopper_blackwell import RATIO_COLUMNS, ROW_COLUMNS
    from bench.speed.memory_format import PAIR_COLUMNS
    from bench.speed.validate import ERROR_COLUMNS, VALIDATION_COLUMNS, cross_gpu_columns

    header = lambda path: path.read_text().splitlines()[0].split(",")  # noqa: E731
    assert header(REPO / "docs/speed/validation.csv") == list(VALIDATION_COLUMNS)
    assert header(REPO / "docs/speed/cross_gpu.csv") == list(cross_gpu_columns())
    assert header(REPO / "docs/speed/logo_by_gpu.csv") == ["gpu", *ERROR_COLUMNS]
    assert header(REPO / "docs/speed/hopper_blackwell.csv") == list(ROW_COLUMNS)  # make bench-speed's tables too
    assert header(REPO / "docs/speed/hopper_blackwell_ratios.csv") == list(RATIO_COLUMNS)
    assert header(REPO / "docs/speed/memory_format.csv") == list(PAIR_COLUMNS)
    assert header(REPO / "results/resnet50/predicted/accumulation.csv") == [c for c in ACCUMULATION_COLUMNS
                                                                           if c != "variant"]
    # A row whose first key is not the first column still lands under its own column; a stray key is refused.
    write_csv([{"rows": 3, "gpu": "L4", "median_error_pct": 1, "p90_error_pct": 2, "median_ratio": 1.0}],
               tmp_path / "t.csv", ("gpu", *ERROR_COLUMNS))
    assert (tmp_path / "t.csv").read_text() == "gpu,rows,median_error_pct,p90_error_pct,median_ratio\nL4,3,1,2,1.0\n"
    with pytest.raises(ValueError, match="stray"):
        write_csv([{"gpu": "L4", "stray": 1}], tmp_path / "u.csv", ("gpu", *ERROR_COLUMNS))
    assert not (tmp_path / "u.csv").exists()


@pytest.mark.slow
def test_the_plans_micro_batches_are_the_largest_a_full_trace_fits_though_most_are_settled_without_one(tmp_path,
                                                                                                    monkeypatch):
    """`bench plan` traces the line and the largest size proposed, and settles the sizes between by the chord
    (`Traced.bounds`): each GPU still gets the largest power of two a full trace of its own fits, and the memory
    it states is never below that trace's, and at most 16 MiB or 0.25 % (and a segment) above it. The plan's memory
    is the allocated peak in whole segments (`Trace.allocated_peak_bytes`, convex in the micro-batch)."""
    from dataclasses import replace

    from bench.memory.fit import memory_fit
    from bench.memory.allocator import CUDA_SEGMENT_BYTES
    from bench.memory.traces import traced
    from bench.planner.search import (SETTLED_WITHIN_BYTES, SETTLED_WITHIN_SHARE, PlanCandidates, Progress,
                                      plan_predictions)

    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path))
    request = PlanCandidates(model="test_resnet", image_size=224, effective_batch=2 ** 15, precisions=("bf16",),
                             gpus=("L4", "L40S", "A100-40GB", "H100-80GB", "H200", "B200"))
    progress = Progress()
    options = plan_predictions(request, progress=progress)
    sizes = {option.cell.micro_batch for option in options}
    assert len(sizes) >= 3 and progress.traces < 2 + len(sizes)  # some sizes were settled without a trace
    for option in options:
        m, gpu = option.cell.micro_batch, gpu_spec(option.prediction.gpu)
        exact = traced(replace(option.cell, accum_steps=2), "cuda")[0].allocated_peak_bytes
        settled_within = max(SETTLED_WITHIN_BYTES, SETTLED_WITHIN_SHARE * option.peak_reserved_bytes)
        assert 0 <= option.peak_reserved_bytes - exact <= settled_within + CUDA_SEGMENT_BYTES
        assert memory_fit(exact, request.headroom, gpu.memory_gib).fits
        if 2 * m <= request.effective_batch:
            double = traced(replace(option.cell, micro_batch=2 * m, accum_steps=2), "cuda")[0].allocated_peak_bytes
            assert not memory_fit(double, request.headroom, gpu.memory_gib).fits


@pytest.mark.serial
def test_a_cold_plan_traces_its_configurations_side_by_side_and_answers_as_one_process_does(tmp_path, monkeypatch):
    """Configurations not in the cache are traced in child processes, one each (`_trace_apart`); the plan that reads
    their traces is the one a single process makes, and it counts their traces."""
    import os

    from bench.planner.search import PlanCandidates, Progress, plan_predictions

    request = PlanCandidates(model="test_vit", image_size=32, effective_batch=256, gpus=("A100-40GB", "L4"),
                             precisions=("bf16", "tf32"))
    answers = []
    for run, cores in enumerate((2, 1, 2)):  # the second parallel run's fork server started with the first's cache
        monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / f"run-{run}"))
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, cores=cores: set(range(cores)))
        progress, lines = Progress(), []
        options = plan_predictions(request, on_trace=lines.append, progress=progress)
        answers.append(([(o.prediction.gpu, o.cell.cell_id, o.peak_reserved_bytes, o.prediction.samples_per_s)
                         for o in options], progress.traces))
        assert all(("in a child process" in line) == (cores == 2) for line in lines), lines
    assert answers[0] == answers[1] == answers[2] and answers[1][1] >= 4


@pytest.mark.slow
def test_the_in_sample_table_puts_every_reference_row_in_one_slice():
    """The targets page's in-sample table (`make bench-speed`) covers each fitted row once, by mode and op mix."""
    from bench.speed.calibrate import reference_dataset
    from bench.speed.validate import in_sample_table

    data = reference_dataset()
    table = in_sample_table(data)
    assert sum(line["rows"] for line in table) == len(data.rows)
    assert {line["mode"] for line in table} == {"train", "infer"}
    assert all(line["median_error_pct"] <= line["p90_error_pct"] for line in table)


@pytest.mark.slow
def test_the_committed_reference_tables_are_what_todays_recorder_traces():
    # The fit reads the committed tables; a prediction traces afresh. Were the recorder or the fake step to change
    # without `bench predict --trace-reference`, the fit would be judged on steps it never predicts (v4's tables
    # had held layer norms in fp16 where today's trace holds them in fp32).
    from bench.speed.reference import read_reference_ops, reference_rows, trace_reference

    wanted = {"train:resnet10t:176px:b512:half:eager:channels_last",
              "train:vit_small_patch32_224:224px:b512:half:eager:channels_last"}
    rows = [row for row in reference_rows() if row.trace in wanted]
    committed = read_reference_ops()
    traced = trace_reference(rows)
    assert wanted <= set(traced)
    for trace in wanted:
        for column in ("op_class", "dtype", "flops", "bytes_moved", "channels_last", "count", "out_elements"):
            assert np.array_equal(getattr(traced[trace], column), getattr(committed[trace], column)), (trace, column)
