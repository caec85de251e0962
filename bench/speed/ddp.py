"""Data-parallel scaling from the interconnect: the gradient all-reduce a DDP step adds, and what is left of it
once it overlaps the backward pass.

Pure arithmetic (numbers in, dataclass out; no clock, no device, no file but the interconnect table).

- Bytes: DDP all-reduces every gradient once per optimizer step (the accumulation micro-steps run under
  `no_sync`), in the gradients' dtype: fp32 under every precision the runner has (autocast keeps fp32
  parameters), so 4 bytes per parameter.
- Time: a ring all-reduce moves 2 (n - 1) / n times the bytes over each GPU's link (NCCL's bus-bandwidth
  convention), at `ACHIEVABLE_FRACTION` of the link's datasheet bandwidth per direction, plus 2 (n - 1)
  ring steps of `RING_STEP_LATENCY_US` per bucket.
- Overlap: DDP all-reduces gradients in buckets of `BUCKET_BYTES` as the backward pass produces them, on
  its own stream. The buckets are taken to come ready evenly over the last micro-step's backward
  (`BACKWARD_FRACTION` of that micro-step); each starts when it is ready and the one before is done, so
  what is left after the backward pass (at least the last bucket) is added to the step.

The efficiency is the 1-GPU step over the n-GPU step: per-GPU samples/s x n x efficiency is the instance's.

>>> link = Interconnect("nvlink", 300.0, "made up")
>>> s = ddp_step(step_s=0.1, micro_step_s=0.1, grads_bytes=100e6, gpus=8, link=link)
>>> round(s.allreduce_s * 1e3, 3), round(s.exposed_s * 1e3, 3), round(s.efficiency, 4)
(1.009, 0.252, 0.9975)
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Literal

from bench.units import MIB, mib, percent

INTERCONNECT_FILE = "interconnects.csv"
LinkKind = Literal["nvlink", "pcie"]
BUCKET_BYTES = 25 * MIB
"""DDP's default bucket (`bucket_cap_mb=25`, torch.nn.parallel.DistributedDataParallel's documented
default). Its first bucket is 1 MiB; taken as a full one here (a few microseconds either way)."""
ACHIEVABLE_FRACTION: dict[str, float] = {"nvlink": 0.8, "pcie": 0.8}
"""Bus bandwidth an NCCL ring all-reduce reaches of the link's datasheet figure per direction. An
assumption, not a measurement in this repository: nccl-tests' large-message all_reduce bus bandwidth is
commonly reported near 80 % of the link on NVSwitch systems; PCIe rings through a CPU's root complex may
reach less (the PCIe lines are then optimistic)."""
RING_STEP_LATENCY_US = 5.0
"""Latency of one step of a ring (a send to the next GPU), microseconds: an assumed order of magnitude
(NCCL's small-message all-reduce takes tens of microseconds on 8 GPUs)."""
BACKWARD_FRACTION = 2 / 3
"""The backward pass's share of a micro-step: its FLOPs are twice the forward's (the weight and input
gradients)."""
BYTES_PER_GRADIENT = 4
"""fp32 gradients: the runner's precisions all keep fp32 parameters (autocast), so their gradients are fp32."""


@dataclass(frozen=True)
class Interconnect:
    """How an instance's GPUs talk to each other."""

    kind: LinkKind
    link_gb_per_s: float
    """Each GPU's datasheet bandwidth per direction, GB/s (10**9 bytes)."""
    source: str

    def describe(self) -> str:
        """`NVLink 300 GB/s per GPU per direction`."""
        name = "NVLink" if self.kind == "nvlink" else "PCIe"
        return f"{name} {self.link_gb_per_s:g} GB/s per GPU per direction"


@dataclass(frozen=True)
class DdpStep:
    """One optimizer step on n GPUs, data parallel."""

    gpus: int
    step_s: float
    """The 1-GPU step (no all-reduce)."""
    allreduce_s: float
    """The whole gradient all-reduce, were nothing overlapping it."""
    exposed_s: float
    """What of it is left after the backward pass: added to the step."""

    @property
    def ddp_step_s(self) -> float:
        return self.step_s + self.exposed_s

    @property
    def efficiency(self) -> float:
        """The 1-GPU step over the n-GPU step: per-GPU samples/s x n x this is the instance's."""
        return self.step_s / self.ddp_step_s


def ring_allreduce_s(nbytes: float, gpus: int, link: Interconnect) -> float:
    """Seconds to all-reduce `nbytes` (one bucket) over a ring of `gpus`: 2 (n - 1) / n x bytes over the
    achievable bus bandwidth, plus 2 (n - 1) ring steps of latency; 0 on one GPU.

    >>> link = Interconnect("pcie", 32.0, "made up")
    >>> round(ring_allreduce_s(25.6e6, 2, link) * 1e3, 3)  # 25.6 MB / (0.8 x 32 GB/s) + 2 x 5 us
    1.01
    """
    if gpus <= 1:
        return 0.0
    bus_bytes_per_s = link.link_gb_per_s * 1e9 * ACHIEVABLE_FRACTION[link.kind]
    steps = 2 * (gpus - 1)
    return steps / gpus * nbytes / bus_bytes_per_s + steps * RING_STEP_LATENCY_US * 1e-6


def ddp_step(*, step_s: float, micro_step_s: float, grads_bytes: float, gpus: int, link: Interconnect,
             bucket_bytes: float = BUCKET_BYTES) -> DdpStep:
    """The step of `gpus` data-parallel GPUs, each running the 1-GPU step of `step_s` whose last micro-step
    takes `micro_step_s`, all-reducing `grads_bytes` of gradients over `link` in buckets.

    Buckets come ready evenly over the backward pass (`BACKWARD_FRACTION` x `micro_step_s`); each is
    all-reduced once it is ready and the previous one is done. With no backward to hide behind, the
    whole all-reduce is exposed:

    >>> link = Interconnect("pcie", 32.0, "made up")
    >>> s = ddp_step(step_s=1.0, micro_step_s=1e-9, grads_bytes=4 * 25.6e6, gpus=2, link=link, bucket_bytes=25.6e6)
    >>> round(s.exposed_s / s.allreduce_s, 3), round(s.allreduce_s * 1e3, 2)
    (1.0, 4.04)
    """
    if gpus <= 1 or grads_bytes <= 0:
        return DdpStep(gpus, step_s, 0.0, 0.0)
    buckets = max(1, math.ceil(grads_bytes / bucket_bytes))
    per_bucket_s = ring_allreduce_s(grads_bytes / buckets, gpus, link)
    backward_s = BACKWARD_FRACTION * micro_step_s
    done = 0.0
    for i in range(1, buckets + 1):
        done = max(done, backward_s * i / buckets) + per_bucket_s
    return DdpStep(gpus, step_s, per_bucket_s * buckets, done - backward_s)


@lru_cache(maxsize=None)
def interconnects() -> dict[tuple[str, str], Interconnect]:
    """The catalog instances' interconnects, by (provider, instance): `bench/data/interconnects.csv`."""
    text = resources.files("bench.data").joinpath(INTERCONNECT_FILE).read_text()
    return {(row["provider"], row["instance"]): Interconnect(row["interconnect"], float(row["link_gb_per_s"]),
                                                               row["source"])
            for row in csv.DictReader(text.splitlines())}


def interconnect_of(provider: str, instance: str) -> Interconnect | None:
    """The interconnect of a catalog instance; None for one the table does not list (a user's catalog)."""
    return interconnects().get((provider, instance))


def predicted_efficiency(*, step_s: float, micro_step_s: float, grads_bytes: float, gpus: int, provider: str,
                         instance: str) -> tuple[float, str] | None:
    """(efficiency, basis in words) of a catalog instance's `gpus` data parallel, or None when the instance's
    interconnect is not in `bench/data/interconnects.csv` (the caller's assumed figure stands)."""
    link = interconnect_of(provider, instance)
    if link is None:
        return None
    step = ddp_step(step_s=step_s, micro_step_s=micro_step_s, grads_bytes=grads_bytes, gpus=gpus, link=link)
    return step.efficiency, (f"predicted from the interconnect: ring all-reduce of {mib(grads_bytes)} of "
                             f"fp32 gradients over {link.describe()} ({percent(ACHIEVABLE_FRACTION[link.kind])} "
                             f"achievable), {step.exposed_s * 1e3:.1f} of its {step.allreduce_s * 1e3:.1f} ms left "
                             f"after the backward pass; the all-reduce only: no input pipeline or stragglers")
