"""Which device this machine offers, what it is called, and which precisions it runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from bench.errors import DeviceUnavailable
from bench.measure.cpu import CpuIdentity, cpu_identity, slug, thread_budget

DeviceChoice = Literal["auto", "cuda", "cpu"]


@dataclass(frozen=True)
class DeviceInfo:
    type: Literal["cuda", "cpu"]
    name: str
    """`torch.cuda.get_device_name()` on a GPU, the CPU model name otherwise."""
    precisions: tuple[str, ...]
    """Precisions this device can train in."""
    threads: int
    """Intra-op CPU threads each cell's process uses (on CPU: the thread budget, or what the grid or
    `--threads` asks for)."""
    cpu: CpuIdentity | None = None
    """The CPU's model, ISA and cores: on a CPU device, part of its tag; None where not detected."""

    @property
    def tag(self) -> str:
        """Folder name for this device's results, e.g. `nvidia-h200` or `cpu-amd-epyc-f26m2-avx512bf16-2c`.

        A CPU's tag names its family/model, ISA level and cores, so rows of two different machines
        never share a folder (a VM's model name alone may say only "AMD EPYC").
        """
        if self.type == "cuda":
            return slug(self.name)
        return "-".join(("cpu", slug(self.name), *([self.cpu.tag_suffix] if self.cpu else [])))


def detect_device(choice: DeviceChoice = "auto", threads: int | None = None) -> DeviceInfo:
    """The CUDA device if there is one (or `choice` forces one), else the CPU.

    `threads`: intra-op threads per cell; None: the thread budget (`bench.measure.cpu.thread_budget`)
    on a CPU, torch's default with a GPU. Creates no CUDA context in this process (the device is
    queried from a child), so the cells' processes get the whole GPU.
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
        return DeviceInfo("cuda", name, precisions, threads or torch.get_num_threads())
    # CPU autocast runs bf16 and fp16 (fp16 very slowly on most CPUs: keep it to few cells).
    identity = cpu_identity()
    return DeviceInfo("cpu", identity.model_name, ("fp32", "bf16", "fp16"), threads or thread_budget(), identity)


def _cuda_facts() -> tuple[str, bool]:
    import torch

    return torch.cuda.get_device_name(0), torch.cuda.is_bf16_supported(including_emulation=False)
