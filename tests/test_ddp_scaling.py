"""Data-parallel scaling from the interconnect (`bench.speed.ddp`): the arithmetic with made-up numbers, the
physics it must obey, the catalog's interconnects, and the price lines that use it."""

from __future__ import annotations

import csv
from importlib import resources

import pytest

from bench.cost.catalog import Instance, load_catalog
from bench.cost.price import Assumptions, MeasuredRow, Workload, price_line
from bench.measure.hardware import gpu_spec
from bench.speed.ddp import (
    BACKWARD_FRACTION,
    Interconnect,
    ddp_step,
    interconnect_of,
    interconnects,
    ring_allreduce_s,
)
from bench.units import GIB

NVLINK = Interconnect("nvlink", 300.0, "made up")
PCIE = Interconnect("pcie", 32.0, "made up")
VIT_L_GRADS = 304e6 * 4
"""About ViT-L/16's fp32 gradients."""


def test_a_ring_moves_two_n_minus_one_over_n_times_the_bytes():
    # Latency aside (a huge message), n GPUs take 2 (n - 1) / n of the 2-GPU time, and one GPU nothing.
    big = 1e12
    two = ring_allreduce_s(big, 2, PCIE)
    assert ring_allreduce_s(big, 1, PCIE) == 0.0
    for n in (3, 4, 8):
        assert ring_allreduce_s(big, n, PCIE) / two == pytest.approx(2 * (n - 1) / n, rel=1e-6)
    # 2 GPUs, 25.6 MB at 80 % of 32 GB/s: 1 ms, plus two ring steps of 5 us.
    assert ring_allreduce_s(25.6e6, 2, PCIE) == pytest.approx(1e-3 + 2 * 5e-6)


def test_with_no_backward_to_hide_behind_the_whole_all_reduce_is_added():
    step = ddp_step(step_s=0.5, micro_step_s=0.0, grads_bytes=VIT_L_GRADS, gpus=8, link=PCIE)
    assert step.exposed_s == pytest.approx(step.allreduce_s)
    assert step.ddp_step_s == pytest.approx(0.5 + step.allreduce_s)


def test_a_long_backward_hides_every_bucket_but_the_last():
    buckets = 4
    step = ddp_step(step_s=10.0, micro_step_s=10.0, grads_bytes=4 * 25e6, gpus=8, link=NVLINK, bucket_bytes=25e6)
    assert step.exposed_s == pytest.approx(step.allreduce_s / buckets)
    assert step.efficiency == pytest.approx(10.0 / (10.0 + step.allreduce_s / buckets))


def test_buckets_that_come_faster_than_the_link_queue_up():
    # Backward of 2/3 ms, all-reduce of 3.4 ms over PCIe: the link is the bottleneck, so what is left is
    # the all-reduce after the first bucket came ready, not the last bucket alone.
    step = ddp_step(step_s=1e-3, micro_step_s=1e-3, grads_bytes=4 * 25e6, gpus=2, link=PCIE, bucket_bytes=25e6)
    first_ready = BACKWARD_FRACTION * 1e-3 / 4
    assert step.exposed_s == pytest.approx(first_ready + step.allreduce_s - BACKWARD_FRACTION * 1e-3)


@pytest.mark.parametrize("link", [NVLINK, PCIE], ids=["nvlink", "pcie"])
@pytest.mark.parametrize("grads_bytes, step_s", [(VIT_L_GRADS, 0.4), (25.6e6 * 4, 0.08), (5e6 * 4, 0.02)])
def test_more_gpus_never_lower_the_instance_and_never_raise_the_efficiency(link, grads_bytes, step_s):
    steps = [ddp_step(step_s=step_s, micro_step_s=step_s, grads_bytes=grads_bytes, gpus=n, link=link)
             for n in range(1, 9)]
    efficiency = [s.efficiency for s in steps]
    instance = [n * e for n, e in zip(range(1, 9), efficiency)]
    assert efficiency[0] == 1.0 and all(0 < e <= 1 for e in efficiency)
    assert all(a >= b for a, b in zip(efficiency, efficiency[1:]))
    assert all(b > a for a, b in zip(instance, instance[1:]))


@pytest.mark.parametrize("gpus", [2, 4, 8])
def test_nvlink_scales_better_than_pcie(gpus):
    # A 50 ms step of ViT-L's gradients: over PCIe the all-reduce (48-84 ms) outlasts the backward pass.
    on = {link.kind: ddp_step(step_s=0.05, micro_step_s=0.05, grads_bytes=VIT_L_GRADS, gpus=gpus, link=link)
          for link in (NVLINK, PCIE)}
    assert on["nvlink"].efficiency > on["pcie"].efficiency
    assert on["pcie"].efficiency < 0.8 < on["nvlink"].efficiency


def test_accumulation_spreads_one_all_reduce_over_more_micro_steps():
    # The same micro-step, K times: one all-reduce per optimizer step, so the efficiency only rises with K.
    efficiency = [ddp_step(step_s=0.1 * k, micro_step_s=0.1, grads_bytes=VIT_L_GRADS, gpus=8, link=PCIE).efficiency
                  for k in (1, 2, 4, 8)]
    assert all(b > a for a, b in zip(efficiency, efficiency[1:]))


def test_every_multi_gpu_catalog_instance_says_its_interconnect_with_a_source():
    text = resources.files("bench.data").joinpath("interconnects.csv").read_text()
    rows = list(csv.DictReader(text.splitlines()))
    multi = {(i.provider, i.instance) for i in load_catalog().select(include_superseded=True) if i.gpu_count > 1}
    assert {(r["provider"], r["instance"]) for r in rows} == multi
    assert all(r["source"].strip() and float(r["link_gb_per_s"]) > 0 for r in rows)
    for instance in load_catalog().select(include_superseded=True):
        link = interconnect_of(instance.provider, instance.instance)
        if link is None:
            continue
        # GPUs without NVLink (L40S, L40) talk over PCIe; SXM boards over NVLink, faster than any PCIe.
        assert link.kind == ("pcie" if instance.gpu in ("L40S", "L40") else "nvlink"), instance.instance
        assert (link.link_gb_per_s > 64) == (link.kind == "nvlink")
    assert len(interconnects()) == len(rows)


def _predicted_row(**changes) -> MeasuredRow:
    row = MeasuredRow(dict(status="predicted", gpu="L40S", cell_id="p", experiment="plan", profile="cuda",
                      model="vit_large_patch16_224", image_size=224, micro_batch=32, accum_steps=1, precision="bf16", checkpointing="off", optimizer="adamw",
                      device_type="cuda", device_name="predicted for L40S", samples_per_s=80.0, mfu_pct=None,
                      model_flops_per_sample=None, peak_memory_bytes=20 * GIB, memory_source="estimate_cuda_allocator",
                      speed_basis="predicted (model v3)", grads_bytes=int(VIT_L_GRADS)))
    return row.with_columns(**changes)


def _catalog_instance(name: str) -> Instance:
    (instance,) = [i for i in load_catalog().select() if i.instance == name]
    return instance


def test_a_price_line_on_a_known_interconnect_scales_as_the_model_predicts():
    g6e = _catalog_instance("g6e.48xlarge")
    line = price_line(_predicted_row(), g6e, Workload(), Assumptions())
    step_s = 32 / 80.0
    expected = ddp_step(step_s=step_s, micro_step_s=step_s, grads_bytes=VIT_L_GRADS, gpus=8,
                        link=interconnect_of("aws", "g6e.48xlarge")).efficiency
    assert line.scaling.efficiency == pytest.approx(expected, abs=1e-4)
    assert line.scaling.basis.startswith("predicted from the interconnect: ring all-reduce of 1160 MiB")
    assert "PCIe 32 GB/s" in line.scaling.basis and "predicted from the interconnect" in line.note
    assert line.cost.samples_per_s == pytest.approx(80.0 * 8 * line.scaling.efficiency, rel=1e-3)


def test_without_gradient_bytes_or_a_known_interconnect_the_assumed_figure_stands():
    g6e = _catalog_instance("g6e.48xlarge")
    no_grads = price_line(_predicted_row(grads_bytes=None), g6e, Workload(), Assumptions())
    assert (no_grads.scaling.efficiency, no_grads.scaling.basis) == (0.9, "assumed (--scaling-efficiency)")
    unknown = Instance(provider="test", instance="8x-L40S", gpu="L40S", gpu_count=8,
                       gpu_memory_gb=gpu_spec("L40S").memory_gib, usd_per_hour=8.0, region="r", observed="2025-01",
                       source="made up for a test")
    line = price_line(_predicted_row(), unknown, Workload(), Assumptions())
    assert line.scaling.basis == "assumed (--scaling-efficiency)"


def test_the_dle_8_gpu_rows_never_scale_better_than_their_all_reduce_allows():
    # The model counts the all-reduce alone (no input pipeline, no stragglers): an upper bound of what the
    # DGX rows measured, each within 1 % above at worst (the measured spread of a table's rows).
    from bench.speed.validate import dle_scaling_check

    table = dle_scaling_check()
    assert len(table) == 78
    assert all(row["predicted_efficiency"] >= row["measured_efficiency"] - 0.01 for row in table)
    assert all(0.99 < row["predicted_efficiency"] <= 1 for row in table)


@pytest.mark.slow
def test_plan_rows_carry_their_fp32_gradients_and_scale_by_the_interconnect():
    from bench.planner.rows import predicted_row
    from bench.planner.search import PlanCandidates, plan_predictions
    from bench.train.models import build_model

    (option,) = plan_predictions(PlanCandidates(model="test_resnet", image_size=32, effective_batch=16,
                                                gpus=("H100-80GB",), precisions=("bf16",)))
    row = predicted_row(option)
    params = sum(p.numel() for p in build_model("test_resnet", 32).parameters())
    assert row.grads_bytes == 4 * params
    line = price_line(row, _catalog_instance("p5.48xlarge"), Workload(), Assumptions())
    assert line.scaling.basis.startswith("predicted from the interconnect") and "NVLink 450 GB/s" in line.scaling.basis
    assert 0 < line.scaling.efficiency <= 1


def test_the_efficiency_follows_the_split_each_gpu_runs_not_the_rows_own():
    # A 1-GPU row of 32 x 16 run as 32 x 2 per GPU on 8 GPUs (bench plan's split): the all-reduce is
    # spread over 2 micro-steps, not 16.
    g6e = _catalog_instance("g6e.48xlarge")
    row = _predicted_row(accum_steps=16, samples_per_s=320.0)  # a 0.1 s micro-step: PCIe's 86 ms not hidden
    own, split = (price_line(row, g6e, Workload(), Assumptions(), accum_steps_per_gpu=k) for k in (None, 2))
    micro_s, link = 0.1, interconnect_of("aws", "g6e.48xlarge")
    for line, k in ((own, 16), (split, 2)):
        expected = ddp_step(step_s=micro_s * k, micro_step_s=micro_s, grads_bytes=VIT_L_GRADS, gpus=8, link=link)
        assert line.scaling.efficiency == pytest.approx(expected.efficiency, abs=1e-4)
    assert split.scaling.efficiency < own.scaling.efficiency < 1
