"""The device's peak FLOP/s for a precision: the datasheet's on a known GPU, measured on a CPU.

A CPU has no datasheet peak worth dividing by: `measure_cpu_peak` measures it, the best of several rounds of a
large matmul, with the foreign load it ran under; `bench.results.peaks` stores it once per device, thread count
and precision, and every results folder of that device divides by it. Beside it, the probes a cell takes of the
machine's own speed (`reference_flops_per_s`) and a device's copy bandwidth.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from datetime import datetime, timezone

import torch

from bench.measure.device import DeviceInfo
from bench.measure.hardware import PEAK_COLUMN, find_gpu
from bench.measure.host import foreign_load_cores, read_load, wait_for_quiet
from bench.measure.timing import best_time_s

CPU_MATRIX_SIDE = {"fp32": 2048, "bf16": 2048, "fp16": 512}
"""The largest side measured: enough to keep every core busy. A precision the CPU runs slowly stops at a smaller
side (`cpu_matrix_side`): fp16 is emulated on CPUs, and bf16 without AVX512-BF16 or AMX runs a generic loop
(about 1 GFLOP/s per thread on an AVX2 EPYC, torch 2.14: 10-20 s for one 2048 x 2048 matmul)."""
CPU_CALL_S = 0.5
"""At most this long for one matmul of the side measured (`cpu_matrix_side`)."""
CPU_ROUNDS = 3
CPU_SECONDS_PER_ROUND = 0.5
"""The peak is the fastest matmul call of CPU_ROUNDS rounds of this long each. Measured alone on a 2-core Zen 4 VM,
4 alternated repeats each: 3 x 0.5 s gave a median of 203.9 GFLOP/s fp32 and 426.6 bf16 where 5 x 1.0 s gave
203.6 and 428.8 (-0.5 %, inside either setting's own 1-3 % spread between repeats), in 1.5 s a precision instead
of 5. A stored peak says the rounds and seconds it was measured with."""
PEAK_QUIET_WAIT_S = 120.0
"""Seconds to wait at most for other work to leave the CPU's cores free before measuring its peak."""

_MATMUL_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class PeakFlops:
    flops_per_s: float | None
    """None when no trustworthy peak is known: MFU is then left empty, not guessed."""
    source: str


def datasheet_peak(device: DeviceInfo, precision: str) -> PeakFlops:
    """A GPU's peak in `precision` from the catalog's datasheet (`bench/data/gpus.csv`); None where unknown."""
    spec = find_gpu(device.name)
    if spec is None:
        return PeakFlops(None, f"unknown GPU {device.name!r}: not in bench/data/gpus.csv, no MFU")
    value = spec.peak_flops_per_s(precision)
    if value is None:
        return PeakFlops(None, f"{spec.gpu} datasheet has no {precision} peak, no MFU")
    return PeakFlops(value, f"datasheet: {spec.gpu} {PEAK_COLUMN[precision]} ({spec.source})")


def measure_cpu_peak(device: DeviceInfo, precision: str) -> dict:
    """The CPU's matmul peak in `precision` with the device's threads, as a row of a peaks file
    (`bench.results.schema.PEAK_COLUMNS`): the fastest call of `CPU_ROUNDS` rounds, after a wait (bounded) for a
    quiet machine, with the foreign load it was measured under."""
    torch.set_num_threads(device.threads)  # as the cells will run
    wait_for_quiet(device.threads, PEAK_QUIET_WAIT_S)
    before = read_load()
    side = cpu_matrix_side(precision)
    flops = max(measure_matmul_peak(precision, torch.device("cpu"), side, CPU_SECONDS_PER_ROUND)[0]
                for _ in range(CPU_ROUNDS))
    foreign = foreign_load_cores(before, read_load())
    return {"device_tag": device.tag, "device_name": device.name, "threads": device.threads, "precision": precision,
            "flops_per_s": flops, "matrix_side": side, "rounds": CPU_ROUNDS, "seconds_per_round": CPU_SECONDS_PER_ROUND,
            "measured_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "torch_version": torch.__version__,
            "foreign_load_cores": None if foreign is None else round(foreign, 3)}


def cpu_matrix_side(precision: str) -> int:
    """The side the CPU's peak is measured at: from 256, doubled while one matmul of the doubled side (8 times the
    work) would stay under `CPU_CALL_S`, up to `CPU_MATRIX_SIDE`.

    >>> 256 <= cpu_matrix_side("fp32") <= CPU_MATRIX_SIDE["fp32"]
    True
    """
    dtype = _MATMUL_DTYPES[precision]
    side = 256
    while side < CPU_MATRIX_SIDE[precision]:
        a = torch.randn(side, side).to(dtype)
        torch.matmul(a, a)  # kernel selection and thread start-up
        began = time.perf_counter()
        torch.matmul(a, a)
        if 8 * (time.perf_counter() - began) >= CPU_CALL_S:
            break
        side *= 2
    return side


def measure_matmul_peak(precision: str, device: torch.device, size: int = 1024,
                        min_time_s: float = 0.3) -> tuple[float, int]:
    """Best observed FLOP/s of a square matmul in `precision`, and the matrix side used."""
    dtype = _MATMUL_DTYPES[precision]
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    torch.matmul(a, b)  # first call pays for kernel selection and thread start-up
    return 2 * size**3 / best_time_s(lambda: torch.matmul(a, b), device, min_time_s=min_time_s), size


REFERENCE_MATRIX_SIDE = 512
REFERENCE_SECONDS = 0.1
"""How long each probe calls the matmul (about 70 calls on a 2-core Zen 4 VM). Measured alone, 15 alternated
probes each: 0.25, 0.1 and 0.05 s gave the same median (199.5, 199.6, 199.3 GFLOP/s) and spread (1.51, 1.56,
1.54 % standard deviation); rows measured before 2026-12-05 probed 0.25 s. Two probes a CPU cell, so 0.3 s
less a cell, which a tiny cell's measurement (about 1 s) had spent half on."""


def reference_flops_per_s(seconds: float = REFERENCE_SECONDS) -> float:
    """The CPU's speed now on a fixed workload: the median FLOP/s of fp32 512x512 matmuls over `seconds`,
    with the threads this process has.

    Taken just before and just after a cell's timed steps, it shows whether the machine itself ran at
    another speed for rows measured minutes apart (a VM's neighbours, its clock), which the interval of one
    row's median cannot show. The median, not the best: a slower stretch is what it is there to see.
    """
    side = REFERENCE_MATRIX_SIDE
    a, b = torch.randn(side, side), torch.randn(side, side)
    torch.matmul(a, b)  # kernel selection and thread start-up
    call_times_s, began = [], time.perf_counter()
    while not call_times_s or time.perf_counter() - began < seconds:
        started = time.perf_counter()
        torch.matmul(a, b)
        call_times_s.append(time.perf_counter() - started)
    return 2 * side**3 / statistics.median(call_times_s)


def measure_copy_bandwidth(device: torch.device, nbytes: int, repeats: int = 10) -> float:
    """Best bytes/s of a device-to-device copy of `nbytes`, counting the read and the write."""
    source = torch.empty(nbytes, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    return 2 * nbytes / best_time_s(lambda: target.copy_(source), device, repeats=repeats)
