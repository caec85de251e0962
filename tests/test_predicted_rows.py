"""Every prediction carries its interval: the committed predicted rows (results/*/predicted/runs.csv) are the current
throughput model's, each with its cross-GPU interval and error, none above 75 % MFU, and a skipped row only where the
catalog still lacks a figure; every predicted `bench plan` line prints its hours and dollars as ranges."""

from __future__ import annotations

import csv
import re

import pytest
from conftest import REPO

from bench.cli import main
from bench.measure.hardware import gpu_spec
from bench.speed.model import NoDatasheetPeak, gpu_rates
from bench.speed.params import load_model_file

PREDICTED_FILES = sorted(REPO.glob("results/*/predicted/runs.csv"))
OP_MIX = {"resnet50": "conv", "vgg13": "conv", "efficientnet_b0": "grouped-conv", "nfnet_l0": "grouped-conv",
          "regnetx_080": "grouped-conv", "resnext101_32x4d": "grouped-conv"}
"""What the committed rows' convnets compute with (`bench.speed.model.OpMix`); the ViTs, PiT and Sequencer: matmul."""


def _rows(path):
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_the_study_has_predicted_rows():
    assert {path.parent.parent.name for path in PREDICTED_FILES} >= {"resnet50", "vit_b16", "vit_l16"}


@pytest.mark.parametrize("path", PREDICTED_FILES, ids=lambda p: p.parent.parent.name)
def test_every_predicted_row_is_the_current_model_with_its_cross_gpu_interval(path):
    model = load_model_file()
    rows = [row for row in _rows(path) if row["status"] == "predicted"]
    assert rows
    for row in rows:
        spec = gpu_spec(row["gpu"])
        where = (row["cell_id"], row["gpu"])
        assert row["speed_model_version"] == model.version, where
        # The error a user reads is the leave-one-GPU-out one of its kind of GPU and op mix, never a same-GPU figure.
        assert row["op_mix"] == OP_MIX.get(row["model"], "matmul"), where
        assert row["speed_basis"] == model.basis(spec, row["op_mix"]), where
        assert "leave-one-GPU-out" in row["speed_basis"], where
        low, high = model.interval(float(row["samples_per_s"]), spec, row["op_mix"])
        assert float(row["samples_per_s_low"]) == pytest.approx(low, rel=1e-9), where
        assert float(row["samples_per_s_high"]) == pytest.approx(high, rel=1e-9), where
        assert float(row["samples_per_s_low"]) < float(row["samples_per_s"]) < float(row["samples_per_s_high"])
        # Of its precision's dense datasheet peak (the fp32 column when TF32 is off).
        assert float(row["peak_flops_per_s"]) == gpu_rates(spec, row["precision"]).headline_peak_flops_per_s, where
        assert 0 < float(row["mfu_pct"]) <= 75, where


@pytest.mark.parametrize("path", PREDICTED_FILES, ids=lambda p: p.parent.parent.name)
def test_a_skipped_row_names_a_figure_the_catalog_still_lacks(path):
    for row in _rows(path):
        if row["status"] == "predicted":
            continue
        assert row["status"] == "skipped" and row["error_type"] == "NoDatasheetPeak", row["cell_id"]
        assert "no prediction rather than a guess" in row["error_message"]
        with pytest.raises(NoDatasheetPeak):
            gpu_rates(gpu_spec(row["gpu"]), row["precision"])


def _number(text: str) -> float:
    return float(text.replace(",", ""))


@pytest.mark.parametrize("gpus, overlap", [(("A10", "H100-80GB"), False), (("L4", "RTX-3090"), True)])
def test_every_predicted_plan_line_prints_its_ranges_and_says_when_the_top_two_overlap(gpus, overlap, capsys):
    args = ["plan", "test_resnet", "--effective-batch", "16", "--image-size", "32", "--precision", "bf16",
            "--top", "50"]
    assert main(args + [flag for gpu in gpus for flag in ("--gpu", gpu)]) == 0
    out = capsys.readouterr().out
    points = {int(rank): (_number(usd), _number(hours)) for rank, usd, hours in
              re.findall(r"^ +(\d+) +([\d,]+\.\d\d) +([\d,]+\.\d\d)  \S", out, re.M)}
    ranges = {int(rank): tuple(map(_number, values)) for rank, *values in
              re.findall(r"^ +(\d+): \[\d+\] ([\d,.]+)-([\d,.]+) h, \$([\d,.]+)-([\d,.]+) \((?:80 % band|p10-p90) of that error\)",
                         out, re.M)}
    assert len(points) >= 2 and ranges.keys() == points.keys()
    for rank, (usd, hours) in points.items():
        h_low, h_high, u_low, u_high = ranges[rank]
        assert h_low - 0.01 <= hours <= h_high + 0.01 and u_low - 0.01 <= usd <= u_high + 0.01, rank
    bases = re.findall(r"^basis \[\d+\]: (.*)$", out, re.M)
    assert bases and all("leave-one-GPU-out" in basis and "same-GPU" not in basis for basis in bases)
    # The winner's dollar range reaches the runner-up's: the ranking is within the model's error, and it says so.
    assert (ranges[1][3] >= ranges[2][2]) is overlap
    assert ("overlap within their stated error" in out) is overlap
