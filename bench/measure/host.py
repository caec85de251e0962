"""How busy the host was: the load average, CPU time stolen, and the cores other processes kept busy.

A timing from a loaded or oversubscribed machine is not the cell's own; every row says how
loaded the host was so a reader can see it. The figure that decides is *foreign load*: the cores
busy with work that is not the measuring process tree's (all of /proc/stat's busy time minus the
tree's own CPU time), which the load average cannot tell from the cell's own threads.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

_PROC_STAT = Path("/proc/stat")
_PROC = Path("/proc")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

QUIET_SLACK_CORES = 0.25
"""Foreign load a measurement tolerates beyond the cores its threads leave free: a quiet VM's own
background (daemons, the hypervisor's agent) stays well under it."""
QUIET_SAMPLE_S = 0.5
"""Length of one load sample while waiting for the machine to quieten."""


@dataclass(frozen=True)
class CpuTimes:
    """The aggregate `cpu` line of /proc/stat: steal, idle (with iowait) and total jiffies since boot."""

    steal: int
    total: int
    idle: int = 0

    @property
    def busy(self) -> int:
        return self.total - self.idle


def load_average_1m() -> float | None:
    """The 1-minute load average (None where the OS does not report one)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def cpu_times() -> CpuTimes | None:
    """Jiffies so far, or None where /proc/stat is unreadable (not Linux)."""
    try:
        fields = _PROC_STAT.read_text().splitlines()[0].split()
    except OSError:
        return None
    values = [int(value) for value in fields[1:]]
    # user nice system idle iowait irq softirq steal [guest guest_nice]: guest time is inside user.
    return CpuTimes(steal=values[7] if len(values) > 7 else 0, total=sum(values[:8]),
                    idle=values[3] + (values[4] if len(values) > 4 else 0))


def steal_pct(before: CpuTimes | None, after: CpuTimes | None) -> float | None:
    """Stolen CPU time between two readings, % of all CPU time then.

    >>> steal_pct(CpuTimes(10, 1000), CpuTimes(30, 2000))
    2.0
    """
    if before is None or after is None or after.total <= before.total:
        return None
    return 100.0 * (after.steal - before.steal) / (after.total - before.total)


def tree_cpu_ticks(root_pid: int) -> int | None:
    """CPU time (user + system, all threads, in clock ticks) of `root_pid` and every process below it
    (a loader's workers, a compile's helpers): what a cell itself keeps busy. None where /proc is unreadable."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in _PROC.iterdir() if _PROC.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            # the command name (field 2) may hold spaces and parentheses: split after its last ')'
            rest = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # the process ended while being read
            continue
        pid = int(entry.name)
        parents[pid], ticks[pid] = int(rest[1]), int(rest[11]) + int(rest[12])
    if root_pid not in ticks:
        return None
    tree, frontier = {root_pid}, [root_pid]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier.extend(children)
    return sum(ticks[pid] for pid in tree)


@dataclass(frozen=True)
class QuietPolicy:
    """What the runner does about other work on the machine (`bench run --require-quiet`, `--quiet-wait-s`)."""

    wait_s: float = 120.0
    """Before a cell, wait at most this long for other work to leave the cell's cores free."""
    require: bool = False
    """A row timed under foreign load is measured again (`retries` times), then recorded as a failure."""
    retries: int = 2


@dataclass(frozen=True)
class LoadReading:
    """A moment's counters: the machine's CPU jiffies, the measured tree's CPU ticks, the clock."""

    machine: CpuTimes | None
    own_ticks: int | None
    monotonic_s: float


def read_load(root_pid: int | None = None) -> LoadReading:
    """The counters now; `root_pid`: the process tree whose work is not foreign (default: this process)."""
    return LoadReading(cpu_times(), tree_cpu_ticks(root_pid or os.getpid()), time.monotonic())


def foreign_load_cores(before: LoadReading, after: LoadReading) -> float | None:
    """Cores kept busy by other processes between two readings: the machine's busy time less the
    measured tree's, over the wall time. None where the counters are unreadable.

    >>> a = LoadReading(CpuTimes(0, 1000, 800), 100, 0.0)
    >>> b = LoadReading(CpuTimes(0, 1400, 900), 300, 2.0)  # 300 busy ticks, 200 of them the tree's
    >>> round(foreign_load_cores(a, b) * _CLOCK_TICKS / 100, 3)
    0.5
    """
    if None in (before.machine, after.machine, before.own_ticks, after.own_ticks):
        return None
    wall_s = after.monotonic_s - before.monotonic_s
    if wall_s <= 0:
        return None
    busy_ticks = after.machine.busy - before.machine.busy
    own_ticks = after.own_ticks - before.own_ticks
    return max(0.0, (busy_ticks - own_ticks) / _CLOCK_TICKS / wall_s)


def available_memory_bytes() -> int | None:
    """Memory the host can give a new process without swapping (/proc/meminfo's MemAvailable), or None."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def usable_cpus() -> int:
    """Cores this process may run on (its affinity), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def machine_cpus() -> int:
    """Logical CPUs /proc/stat counts busy time over: the whole machine's, not this process's affinity."""
    return os.cpu_count() or 1


def loaded(foreign_cores: float | None, threads: int) -> bool | None:
    """Whether other work took cores the measurement's `threads` needed (beyond `QUIET_SLACK_CORES`).

    >>> loaded(0.1, 2), loaded(1.0, 2), loaded(None, 2)
    (False, True, None)
    """
    if foreign_cores is None:
        return None
    return foreign_cores > max(0, machine_cpus() - threads) + QUIET_SLACK_CORES


def wait_for_quiet(threads: int, max_wait_s: float,
                   on_wait: Callable[[float], None] | None = None) -> tuple[float, float | None]:
    """Sample the machine until other work leaves `threads` cores free, at most `max_wait_s`.

    Returns the seconds waited and the foreign load of the last sample; `on_wait(load)` is called once,
    when the first sample is busy (the runner says why it pauses). A wait of 0 s takes no sample (it would
    wait for nothing, and cost a cell `QUIET_SAMPLE_S`): no load then.

    >>> wait_for_quiet(2, 0.0)
    (0.0, None)
    """
    if max_wait_s <= 0:
        return 0.0, None
    began = time.monotonic()
    told = False
    while True:
        before = read_load()
        time.sleep(QUIET_SAMPLE_S)
        foreign = foreign_load_cores(before, read_load())
        waited = time.monotonic() - began
        if not loaded(foreign, threads) or waited >= max_wait_s:
            return round(max(0.0, waited - QUIET_SAMPLE_S), 3), foreign  # the last sample measured, not waited
        if on_wait and not told:
            on_wait(foreign)
            told = True
