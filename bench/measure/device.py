"""Which device this machine offers, what it is called, and which precisions it runs."""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bench.errors import DeviceUnavailable

DeviceChoice = Literal["auto", "cuda", "cpu"]


@dataclass(frozen=True)
class DeviceInfo:
    type: Literal["cuda", "cpu"]
    name: str
    """`torch.cuda.get_device_name()` on a GPU, the CPU model name otherwise."""
    precisions: tuple[str, ...]
    """Precisions this device can train in."""
    threads: int
    """Intra-op CPU threads torch uses."""

    @property
    def tag(self) -> str:
        """Folder name for this device's results, e.g. `nvidia-h200` or `cpu-intel-xeon-processor`."""
        slug = re.sub(r"[^a-z0-9]+", "-", re.sub(r"\((r|tm)\)|\bcpu\b|@.*", "", self.name.lower()))
        slug = slug.strip("-") or "unknown"
        return slug if self.type == "cuda" else f"cpu-{slug}"


def detect_device(choice: DeviceChoice = "auto") -> DeviceInfo:
    """The CUDA device if there is one (or `choice` forces one), else the CPU.

    Creates no CUDA context in this process (the device is queried from a child), so the
    cells' processes get the whole GPU.
    """
    import torch  # here, not at the top: `bench --help` and the CLI's parsers never load torch

    use_cuda = torch.cuda.is_available() if choice == "auto" else choice == "cuda"
    if use_cuda:
        if not torch.cuda.is_available():
            raise DeviceUnavailable("--device cuda: torch sees no CUDA device on this machine; allowed here: auto, cpu")
        from bench.isolation import (
            call_in_child,  # late: isolation preloads modules that import this one
        )

        name, bf16 = call_in_child(_cuda_facts)
        # bf16 in hardware is Ampere or later, which is also where TF32 tensor cores begin.
        precisions = ("fp32", "bf16", "fp16", "tf32") if bf16 else ("fp32", "fp16")
        return DeviceInfo("cuda", name, precisions, torch.get_num_threads())
    # CPU autocast runs bf16 and fp16 (fp16 very slowly on most CPUs: keep it to few cells).
    return DeviceInfo("cpu", cpu_model_name(), ("fp32", "bf16", "fp16"), torch.get_num_threads())


def _cuda_facts() -> tuple[str, bool]:
    import torch

    return torch.cuda.get_device_name(0), torch.cuda.is_bf16_supported(including_emulation=False)


def cpu_model_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "cpu"
