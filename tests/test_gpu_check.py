"""The GPU validation script, run in its dry mode: the same code path on CPU with tiny models."""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest
from conftest import REPO, read_rows


@pytest.mark.serial
def test_gpu_check_dry_run_writes_rows_reports_and_device_figures(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable}
    # The limit only catches a hang: on a loaded 2-core machine the dry run once took over 900 s.
    ran = subprocess.run(["bash", "scripts/gpu_check.sh", "--dry", str(tmp_path)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=3600)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    (resnet,) = [d for d in (tmp_path / "gpu_check_resnet50").iterdir() if d.name != "estimate"]
    rows = read_rows(resnet / "runs.csv")
    assert len(rows) == 14 and {r["status"] for r in rows} == {"ok"}
    assert {r["optimizer"] for r in rows} == {"adamw", "adamw8bit"}
    assert (resnet / "REPORT.md").exists() and (resnet / "memory_by_micro_batch.png").exists()
    vit = tmp_path / "gpu_check_vit" / resnet.name
    assert len(read_rows(vit / "runs.csv")) == 4
    extras = tmp_path / "gpu_check" / resnet.name
    peaks = pd.read_csv(extras / "device_peaks.csv").set_index("quantity")
    assert set(peaks.index) == {"matmul_bf16_tflops", "matmul_fp32_tflops", "copy_gb_per_s"}
    assert (peaks.measured > 0).all()
    # The estimator beside each measured cell (in each report): on CPU both are tracked-tensor bytes, so equal.
    for measured, cells in ((resnet, 14), (vit, 4)):
        beside = pd.read_csv(measured / "estimate_vs_measured.csv")
        assert len(beside) == cells  # every cell, adamw8bit included
        assert beside.peak_ratio.between(0.99, 1.01).all(), beside.peak_ratio
    overhead = pd.read_csv(extras / "overhead.csv")
    assert overhead.ratio.iloc[0] > 0 and overhead.runner_samples_per_s.iloc[0] > 0


@pytest.mark.serial
def test_gpu_check_formats_dry_run_measures_both_formats_beside_the_estimate(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable}
    both = subprocess.run(["bash", "scripts/gpu_check.sh", "--dry", "--claims", "--formats", str(tmp_path)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=60)
    assert both.returncode == 2 and "separate device calls" in both.stderr and not any(tmp_path.iterdir())
    ran = subprocess.run(["bash", "scripts/gpu_check.sh", "--dry", "--formats", str(tmp_path)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=3600)  # a hang guard, as above
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    (measured,) = [d for d in (tmp_path / "gpu_check_formats").iterdir() if d.name != "estimate"]
    rows = read_rows(measured / "runs.csv")
    assert sorted((r["channels_last"], r["status"]) for r in rows) == [("false", "ok"), ("true", "ok")]
    assert not (tmp_path / "gpu_check_resnet50").exists()  # the formats call runs its grid only
    pairs = pd.read_csv(measured / "format_pairs.csv")
    assert len(pairs) == 1 and pairs["peak CL/NCHW"].iloc[0] > 0 and pairs["estimated"].iloc[0] > 0
    assert "## Memory formats" in (measured / "REPORT.md").read_text()
