"""Figures derived from other rows of the same runs file, computed when the file is read.

A data-parallel row's scaling efficiency needs its configuration's 1-process row; a loader row's
synthetic samples/s needs its configuration's synthetic-input row. Either may be measured after the
row that needs it (SLURM jobs end in any order, a grid resumes), so the figures are computed from the
rows as read, never written back: a runs file holds measurements only, and a re-measured baseline
changes every figure derived from it at the next read.

Example: a 2-process row at 180 samples/s over a 1-process row at 100 is 0.9 efficient:
    >>> import pandas as pd
    >>> rows = pd.DataFrame([{"status": "ok", "profile": "cpu", "model": "m", "world_size": 1, "samples_per_s": 100.0,
    ...                       "global_samples_per_s": 100.0, "input": "synthetic", "cpu_threads": 2},
    ...                      {"status": "ok", "profile": "cpu", "model": "m", "world_size": 2, "samples_per_s": 90.0,
    ...                       "global_samples_per_s": 180.0, "input": "synthetic", "cpu_threads": 2}])
    >>> derive(rows).scaling_efficiency.tolist()
    [nan, 0.9]
"""

from __future__ import annotations

import math

import pandas as pd

from bench.results.keys import Key, configuration_key, key_columns

SCALING_BASELINE = {"world_size": 1, "ddp_sync": "no_sync"}
"""What a data-parallel row's reference differs in: one process (whose sync mode is the default)."""
SYNTHETIC_BASELINE = {"input": "synthetic", "loader_workers": 0}
"""What a loader row's reference differs in: synthetic input, which has no workers."""
_READ = ("profile", "status", "samples_per_s", "global_samples_per_s", "cpu_threads")
"""The columns the figures read besides the configuration's."""


def derive(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` with `scaling_efficiency` and `synthetic_samples_per_s` computed from the rows themselves
    (empty where the reference row is missing, failed, or, for a loader row, trained with other CPU threads)."""
    if rows.empty:
        return rows
    used = [name for name in (*key_columns(), *_READ) if name in rows.columns]  # what the figures read, no more
    records = rows[used].astype(object).where(rows[used].notna(), None).to_dict("records")
    keys = [configuration_key(row) for row in records]
    ok = {(row.get("profile"), key): row for row, key in zip(records, keys) if row.get("status") == "ok"}

    def reference(row: dict, key: Key, changes: dict) -> dict | None:
        return ok.get((row.get("profile"), tuple((name, changes.get(name, value)) for name, value in key)))

    efficiency, synthetic = [], []
    for row, key in zip(records, keys):
        efficiency.append(_efficiency(row, reference(row, key, SCALING_BASELINE)))
        synthetic.append(_synthetic(row, reference(row, key, SYNTHETIC_BASELINE)))
    return rows.assign(scaling_efficiency=pd.array(efficiency, dtype="float64"),
                       synthetic_samples_per_s=pd.array(synthetic, dtype="float64"))


def _efficiency(row: dict, baseline: dict | None) -> float:
    """Global samples/s over N x the 1-process samples/s of the same configuration."""
    world_size = row.get("world_size") or 1
    if world_size == 1 or row.get("status") != "ok" or baseline is None or row.get("global_samples_per_s") is None:
        return math.nan
    return float(row["global_samples_per_s"]) / (world_size * float(baseline["samples_per_s"]))


def _synthetic(row: dict, baseline: dict | None) -> float:
    if (row.get("input") or "synthetic") == "synthetic" or row.get("status") != "ok" or baseline is None:
        return math.nan
    if baseline.get("cpu_threads") != row.get("cpu_threads"):  # on a CPU a loader cell gives its workers threads
        return math.nan
    return float(baseline["samples_per_s"])
