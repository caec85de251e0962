"""Measurements a user reads off a row: memory by category, FLOPs, MFU, the GPU catalog."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import measured_columns

from bench.grid.cell import Cell
from bench.measure.device import DeviceInfo
from bench.measure.flops import flops_per_sample
from bench.measure.hardware import find_gpu, gpu_keys
from bench.measure.memory import optimizer_state_bytes, unique_tensor_bytes
from bench.measure.peak import PeakFlops
from bench.results.peaks import ensure_peak
from bench.measure.step_stats import summarize_step_times
from bench.measure.utilization import samples_per_s, utilization_pct
from bench.run.cell_measurement import CellTask
from bench.train.models import build_model
from bench.train.optim import build_optimizer

CPU = DeviceInfo("cpu", "test cpu", ("fp32", "bf16", "fp16"), 2)


def _measure(model="test_resnet", image_size=64, micro_batch=16, accum_steps=1, checkpointing="off",
             optimizer="sgd", precision="fp32") -> dict:
    cell = Cell(experiment="t", profile="cpu", model=model, image_size=image_size, micro_batch=micro_batch,
                accum_steps=accum_steps, precision=precision, checkpointing=checkpointing,
                optimizer=optimizer, channels_last=False, warmup_steps=1, measured_steps=2)
    flops = flops_per_sample(model, image_size, checkpointing)
    return measured_columns(CellTask(cell, CPU, PeakFlops(1e11, "test peak"), flops))


@pytest.mark.serial
def test_peak_memory_falls_with_the_micro_batch_at_fixed_effective_batch():
    peaks = [_measure(micro_batch=mb, accum_steps=16 // mb)["peak_memory_bytes"] for mb in (16, 4, 1)]
    assert peaks[0] > peaks[1] > peaks[2]


@pytest.mark.serial
def test_checkpointing_lowers_activation_memory():
    off = _measure(model="test_vit", checkpointing="off")
    full = _measure(model="test_vit", checkpointing="full")
    assert full["activations_peak_bytes"] < 0.8 * off["activations_peak_bytes"]
    assert full["params_bytes"] == off["params_bytes"]


@pytest.mark.serial
def test_row_splits_static_memory_and_traces_every_phase():
    row = _measure(model="test_vit", micro_batch=4, accum_steps=4, optimizer="adamw")
    assert row["memory_source"] == "tracked_tensors"
    assert row["grads_bytes"] == row["params_bytes"]
    assert row["optimizer_state_bytes"] == pytest.approx(2 * row["params_bytes"], rel=0.01)
    static = row["params_bytes"] + row["grads_bytes"] + row["optimizer_state_bytes"]
    assert row["activations_peak_bytes"] == row["peak_memory_bytes"] - static > 0
    phases = json.loads(row["phase_memory"])
    assert [p[0] for p in phases] == ["forward", "backward"] * 4 + ["optimizer", "zero_grad"]
    # Gradients are freed by zero_grad(set_to_none=True).
    assert phases[-1][2] <= phases[-2][2] - row["grads_bytes"] + 1024
    assert len(json.loads(row["step_times_ms"])) == 2
    assert row["samples_per_s"] > 0 and row["mfu_pct"] > 0


@pytest.mark.slow
def test_eight_bit_adamw_state_is_about_a_quarter_of_fp32_adamw():
    def state_bytes(name: str) -> int:
        model = build_model("resnet18", 32)
        optimizer = build_optimizer(name, model.parameters())
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        optimizer.step()
        return optimizer_state_bytes(optimizer)
    ratio = state_bytes("adamw8bit") / state_bytes("adamw")
    assert 0.24 < ratio < 0.30, ratio


@pytest.mark.slow  # counts the FLOPs of real timm models: 1.5 s on 2 Xeon cores
def test_flops_match_published_macs_and_count_attention():
    # Forward GMACs at 224 px: ResNet-50 4.11, ViT-B/16 17.58; training ~ 3 x forward x 2 FLOPs/MAC.
    assert flops_per_sample("resnet50", 224, "off").model == pytest.approx(6 * 4.11e9, rel=0.03)
    vit = flops_per_sample("vit_base_patch16_224", 224, "full")
    assert vit.model == pytest.approx(6 * 17.58e9, rel=0.03)
    assert vit.hardware > 1.15 * vit.model  # recompute of the checkpointed blocks


def test_unique_tensor_bytes_counts_shared_storage_once():
    t = torch.zeros(1000)
    assert unique_tensor_bytes([t, t[:10], t.view(10, 100)]) == 4000


def test_throughput_and_utilisation_arithmetic():
    assert samples_per_s(128, 250.0) == 512.0
    assert utilization_pct(2e9, 512.0, 1024e9) == pytest.approx(100.0)
    assert utilization_pct(2e9, 512.0, None) is None
    stats = summarize_step_times([10.0, 20.0, 30.0, 40.0, 50.0])
    assert (stats.median_ms, stats.p10_ms, stats.p90_ms) == (30.0, 14.0, 46.0)


REAL_DEVICE_NAMES = [  # torch.cuda.get_device_name() as these GPUs report it
    ("NVIDIA H200", "H200"), ("NVIDIA H100 80GB HBM3", "H100-80GB"), ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
    ("NVIDIA A100-SXM4-80GB", "A100-80GB"), ("NVIDIA A100 80GB PCIe", "A100-80GB-PCIe"), ("NVIDIA L4", "L4"),
    ("NVIDIA A10G", "A10G"), ("Tesla T4", "T4"), ("Tesla V100-SXM2-16GB", "V100-16GB"),
    ("Tesla V100-SXM2-32GB", "V100-32GB"), ("NVIDIA A100-PCIE-40GB", "A100-40GB"),
    ("NVIDIA GeForce RTX 3090", "RTX-3090"), ("NVIDIA GeForce RTX 4090", "RTX-4090"),
    ("NVIDIA H100 PCIe", "H100-PCIe"), ("NVIDIA H100 NVL", "H100-NVL"), ("NVIDIA L40S", "L40S"),
    ("NVIDIA L40", "L40"), ("NVIDIA A10", "A10"), ("NVIDIA B200", "B200"),
]


@pytest.mark.parametrize("device_name, gpu", REAL_DEVICE_NAMES)
def test_catalog_matches_real_device_names(device_name, gpu):
    assert find_gpu(device_name).gpu == gpu


def test_every_catalog_gpu_is_matched_from_a_real_device_name():
    assert {gpu for _, gpu in REAL_DEVICE_NAMES} == set(gpu_keys())


@pytest.mark.parametrize("device_name", ["NVIDIA H20", "NVIDIA H200 NVL", "NVIDIA GeForce RTX 4080"])
def test_unknown_gpu_gets_no_peak_rather_than_a_guess(device_name):
    assert find_gpu(device_name) is None
    peak = ensure_peak(DeviceInfo("cuda", device_name, ("fp32",), 1), "bf16", Path("unused"))
    assert peak.flops_per_s is None and device_name in peak.source


def test_datasheet_peak_by_precision():
    h200 = DeviceInfo("cuda", "NVIDIA H200", ("fp32", "bf16", "fp16"), 1)
    assert ensure_peak(h200, "bf16", Path("unused")).flops_per_s == 989e12
    assert ensure_peak(h200, "fp32", Path("unused")).flops_per_s == 67e12  # TF32 off: the fp32 column
    assert ensure_peak(DeviceInfo("cuda", "Tesla T4", ("fp32", "fp16"), 1), "bf16", Path("unused")).flops_per_s is None


@pytest.mark.serial
def test_cpu_peak_is_measured_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache"))  # measured here, not copied from another root
    peak = ensure_peak(CPU, "fp32", tmp_path)
    assert peak.flops_per_s > 1e9 and peak.source.startswith("measured")
