"""The memory a probe's micro-batch must fit in: a catalog GPU, a size, or this device (whole, or capped).

Torch-free to import: the CLI resolves (and refuses) the budget before it loads the estimator.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.errors import OptionError
from bench.isolation import call_in_child
from bench.measure.device import DeviceChoice, DeviceInfo, detect_device
from bench.measure.hardware import gpu_key_hint, gpu_spec
from bench.memory.fit import DEFAULT_HEADROOM
from bench.units import GIB


@dataclass(frozen=True)
class Budget:
    """The memory a micro-batch must fit in, and where it comes from."""

    nbytes: float
    source: str
    headroom: float = 0.0
    """Kept free above the estimate (the cost planner's rule) when answering for a catalog GPU."""
    device: DeviceInfo | None = None
    """The device real trials run on; None: answer from the estimator alone."""


def probe_budget(*, gpu: str | None, memory_gib: float | None, memory_limit_gib: float | None,
                 device: DeviceChoice, headroom: float = DEFAULT_HEADROOM) -> Budget:
    """Resolve the command-line choices; a bad one is an `OptionError` naming its option. `headroom` is kept
    free when answering from the estimator for a GPU (`gpu`, `memory_gib`)."""
    if gpu is not None:
        spec = gpu_spec(gpu)
        if spec is None:
            raise OptionError(f"--gpu: {gpu!r} is not in the GPU catalog; {gpu_key_hint(gpu)}")
        return Budget(spec.memory_gib * GIB, f"{gpu} ({spec.memory_gib:g} GiB)", headroom)
    if memory_gib is not None:
        return Budget(memory_gib * GIB, f"--memory-gib {memory_gib:g}", headroom)
    info = detect_device(device)
    if memory_limit_gib is not None:
        return Budget(memory_limit_gib * GIB, f"--memory-limit-gib {memory_limit_gib:g} on {info.name}", device=info)
    if info.type == "cpu":
        raise OptionError("--memory-limit-gib: required for trials on a CPU (without a cap a trial could "
                        "exhaust the host); or answer from the estimator with --memory-gib or --gpu")
    total = call_in_child(_cuda_total_memory)
    return Budget(total, f"all of {info.name}", device=info)


def _cuda_total_memory() -> int:
    import torch

    return torch.cuda.get_device_properties(0).total_memory
