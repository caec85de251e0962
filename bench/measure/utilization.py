"""Throughput, MFU and HFU: pure arithmetic, no clock or device."""

from __future__ import annotations


def samples_per_s(effective_batch: int, step_time_ms: float) -> float:
    """Example: 128 samples in a 500 ms step is 256 samples/s.

    >>> samples_per_s(128, 500.0)
    256.0
    """
    return effective_batch / (step_time_ms / 1e3)


def utilization_pct(flops_per_sample: float, samples_per_second: float,
                    peak_flops_per_s: float | None) -> float | None:
    """Achieved FLOP/s as a percentage of the device's peak; None when no peak is known.

    MFU passes model FLOPs (no recompute), HFU hardware FLOPs (with checkpoint recompute).

    >>> utilization_pct(1e9, 100.0, 1e12)
    10.0
    """
    if not peak_flops_per_s:
        return None
    return 100.0 * flops_per_sample * samples_per_second / peak_flops_per_s


def samples_per_s_at(utilization: float, flops_per_sample: float, peak_flops_per_s: float) -> float:
    """The inverse of `utilization_pct`: samples/s a device with `peak_flops_per_s` reaches at `utilization` %.

    Example: 40 % of an A100's 312 TFLOP/s bf16 peak, at 24.6 GFLOP per sample:
        >>> round(samples_per_s_at(40.0, 24.6e9, 312e12))
        5073
    """
    return utilization / 100 * peak_flops_per_s / flops_per_sample
