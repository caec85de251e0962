"""How busy the host was: the load average when a cell starts, and CPU time stolen while it runs.

A timing from a loaded or oversubscribed machine is not the cell's own; every row says how
loaded the host was so a reader can see it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_PROC_STAT = Path("/proc/stat")


@dataclass(frozen=True)
class CpuTimes:
    """The aggregate `cpu` line of /proc/stat: steal and total jiffies since boot."""

    steal: int
    total: int


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
    return CpuTimes(steal=values[7] if len(values) > 7 else 0, total=sum(values[:8]))


def steal_pct(before: CpuTimes | None, after: CpuTimes | None) -> float | None:
    """Stolen CPU time between two readings, % of all CPU time then.

    >>> steal_pct(CpuTimes(10, 1000), CpuTimes(30, 2000))
    2.0
    """
    if before is None or after is None or after.total <= before.total:
        return None
    return 100.0 * (after.steal - before.steal) / (after.total - before.total)
