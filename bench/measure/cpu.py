"""What this CPU is and how much of it a cell may use: identity for the device tag, and the thread budget.

Two machines whose rows must never share a folder differ in what changes a training step's speed:
the model (family and model number, since a VM's name may say only "AMD EPYC"), the vector and
matrix units torch's kernels use (AVX2, AVX-512, AVX512-BF16, AMX), and the cores. The thread budget
is the cores this process may run on — its affinity mask, capped by a cgroup CPU quota — because
every intra-op thread beyond the free cores multiplies a step's time and its spread.
"""

from __future__ import annotations

import math
import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path

_CPUINFO = Path("/proc/cpuinfo")
_CGROUP_V2_MAX = Path("/sys/fs/cgroup/cpu.max")
_CGROUP_V1_QUOTA = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
_CGROUP_V1_PERIOD = Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us")

ISA_LEVELS = (("amx", ("amx_bf16", "amx_tile")), ("avx512bf16", ("avx512_bf16",)), ("avx512", ("avx512f",)),
              ("avx2", ("avx2",)))
"""From the most capable down: the first level whose flags are all present names the machine's kernels.
AMX and AVX512-BF16 run bf16 matmuls in hardware; without them bf16 is converted and runs slower than fp32."""
SPEED_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "avx_vnni", "amx_tile",
               "amx_bf16", "amx_int8", "asimd", "sve", "bf16")
"""The ISA features a row records (x86 and Arm), when the CPU reports them."""


@dataclass(frozen=True)
class CpuIdentity:
    """The facts that tell two CPUs apart for speed."""

    model_name: str
    """/proc/cpuinfo `model name` (the platform's processor name elsewhere)."""
    family_model: str
    """`f<family>m<model>` from /proc/cpuinfo, e.g. `f26m2` (a Zen 5 part); empty where not reported."""
    isa_flags: tuple[str, ...]
    """Those of `SPEED_FLAGS` this CPU reports."""
    cores: int
    """Physical cores the OS reports (sockets x cores per socket); logical CPUs where unknown."""
    logical_cpus: int
    """Hardware threads (logical CPUs) the OS reports."""

    @property
    def isa_level(self) -> str:
        """The most capable of `ISA_LEVELS` present, else `baseline`.

        >>> CpuIdentity("x", "", ("avx2", "avx512f", "avx512_bf16"), 2, 2).isa_level
        'avx512bf16'
        """
        present = set(self.isa_flags)
        return next((level for level, flags in ISA_LEVELS if present.issuperset(flags)), "baseline")

    @property
    def tag_suffix(self) -> str:
        """What the device tag adds to the model name: family/model, ISA level, cores (and threads).

        >>> CpuIdentity("AMD EPYC", "f26m2", ("avx2", "avx512f", "avx512_bf16"), 2, 2).tag_suffix
        'f26m2-avx512bf16-2c'
        >>> CpuIdentity("Xeon", "", ("avx2",), 8, 16).tag_suffix
        'avx2-8c16t'
        """
        threads = "" if self.logical_cpus == self.cores else f"{self.logical_cpus}t"
        return "-".join(part for part in (self.family_model, self.isa_level, f"{self.cores}c{threads}") if part)


def cpu_identity(cpuinfo: str | None = None) -> CpuIdentity:
    """This machine's CPU as /proc/cpuinfo describes it (`cpuinfo`: its text, for tests)."""
    if cpuinfo is None:
        cpuinfo = _CPUINFO.read_text() if _CPUINFO.exists() else ""
    first: dict[str, str] = {}
    cores_by_socket: dict[str, str] = {}  # `cpu cores` is per socket: counted once per `physical id`
    logical, socket = 0, "0"
    for line in cpuinfo.splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key == "processor":
            logical += 1
        first.setdefault(key, value)
        if key == "physical id":
            socket = value
        if key == "cpu cores":
            cores_by_socket[socket] = value
    name = first.get("model name") or platform.processor() or platform.machine() or "cpu"
    family_model = (f"f{first['cpu family']}m{first['model']}"
                    if first.get("cpu family", "").isdigit() and first.get("model", "").isdigit() else "")
    flags = set((first.get("flags") or first.get("Features") or "").split())
    logical = logical or os.cpu_count() or 1
    cores = sum(int(count) for count in cores_by_socket.values() if count.isdigit()) or logical
    return CpuIdentity(name, family_model, tuple(flag for flag in SPEED_FLAGS if flag in flags), cores, logical)


def cpu_model_name() -> str:
    """The CPU's model name, e.g. `AMD EPYC` or `Intel(R) Xeon(R) Platinum 8480+`."""
    return cpu_identity().model_name


def thread_budget() -> int:
    """Cores this process may use: its affinity mask, capped by the cgroup CPU quota (rounded down, at least 1)."""
    try:
        allowed = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        allowed = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    return max(1, min(allowed, math.floor(quota)) if quota is not None else allowed)


def threads_per_rank(world_size: int, threads: int | None = None) -> int:
    """CPU threads for each of `world_size` ranks: the cell's threads (default: this machine's thread
    budget, `thread_budget`) shared out.

    >>> threads_per_rank(10**6), threads_per_rank(2, threads=8)
    (1, 4)
    """
    return max(1, (threads or thread_budget()) // world_size)


def cgroup_cpu_quota() -> float | None:
    """CPUs the cgroup's quota allows (cpu.max, or cfs_quota_us / cfs_period_us), None when unlimited or unknown.

    >>> cgroup_cpu_quota() is None or cgroup_cpu_quota() > 0
    True
    """
    try:
        if _CGROUP_V2_MAX.exists():
            quota, period = _CGROUP_V2_MAX.read_text().split()[:2]  # "max 100000" or "150000 100000"
            return None if quota == "max" else int(quota) / int(period)
        if _CGROUP_V1_QUOTA.exists():
            quota_us = int(_CGROUP_V1_QUOTA.read_text())
            return None if quota_us < 0 else quota_us / int(_CGROUP_V1_PERIOD.read_text())
    except (OSError, ValueError, ZeroDivisionError):
        return None
    return None


def slug(text: str) -> str:
    """A folder-name form of a device name: lower case, marks and `CPU`/clock dropped.

    >>> slug("Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz")
    'intel-xeon-platinum-8480'
    """
    return re.sub(r"[^a-z0-9]+", "-", re.sub(r"\((r|tm)\)|\bcpu\b|@.*", "", text.lower())).strip("-") or "unknown"
