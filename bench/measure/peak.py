"""The device's peak FLOP/s for a precision: datasheet on a known GPU, measured on a CPU."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bench.measure.device import DeviceInfo
from bench.measure.hardware import PEAK_COLUMN, find_gpu
from bench.measure.timing import best_time_s

_MATMUL_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class PeakFlops:
    flops_per_s: float | None
    """None when no trustworthy peak is known: MFU is then left empty, not guessed."""
    source: str


def device_peak(device: DeviceInfo, precision: str) -> PeakFlops:
    """The denominator of MFU/HFU for cells on `device` in `precision`."""
    if device.type == "cuda":
        spec = find_gpu(device.name)
        if spec is None:
            return PeakFlops(None, f"unknown GPU {device.name!r}: not in bench/data/gpus.csv, no MFU")
        value = spec.peak_flops_per_s(precision)
        if value is None:
            return PeakFlops(None, f"{spec.gpu} datasheet has no {precision} peak, no MFU")
        return PeakFlops(value, f"datasheet: {spec.gpu} {PEAK_COLUMN[precision]} ({spec.source})")
    flops, size = measure_matmul_peak(precision, torch.device("cpu"))
    return PeakFlops(flops, f"measured: best torch.matmul {size}x{size} {precision} on this CPU, "
                            f"{device.threads} threads")


def measure_matmul_peak(precision: str, device: torch.device, size: int = 1024,
                        min_time_s: float = 0.3) -> tuple[float, int]:
    """Best observed FLOP/s of a square matmul in `precision`, and the matrix side used."""
    dtype = _MATMUL_DTYPES[precision]
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    torch.matmul(a, b)  # first call pays for kernel selection and thread start-up
    return 2 * size**3 / best_time_s(lambda: torch.matmul(a, b), device, min_time_s=min_time_s), size


def measure_copy_bandwidth(device: torch.device, nbytes: int, repeats: int = 10) -> float:
    """Best bytes/s of a device-to-device copy of `nbytes`, counting the read and the write."""
    source = torch.empty(nbytes, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    return 2 * nbytes / best_time_s(lambda: target.copy_(source), device, repeats=repeats)
