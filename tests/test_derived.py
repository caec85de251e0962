"""Figures that depend on other rows are computed when a runs file is read, never written back."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import REPO

from bench.results.derived import derive
from bench.results.read import read_runs, read_text
from bench.results.store import RunsFile

MEASURED = sorted(path for path in (REPO / "results").glob("*/*/runs.csv")
                  if path.parent.name not in ("estimate", "predicted"))


@pytest.mark.parametrize("path", MEASURED, ids=[f"{p.parent.parent.name}/{p.parent.name}" for p in MEASURED])
def test_the_committed_rows_derive_what_the_runner_wrote(path):
    stored = read_text(path).rows
    read = read_runs(path)
    for column in ("scaling_efficiency", "synthetic_samples_per_s"):
        # rows of a runner that still wrote the figure back: what it wrote is what the reader derives
        written = np.array([float(row[column]) if row[column] else np.nan for row in stored])
        was_written = ~np.isnan(written)
        assert np.array_equal(written[was_written], read[column].to_numpy(dtype=float)[was_written]), column


def test_a_baseline_measured_again_changes_the_figure_at_the_next_read(tmp_path):
    ddp = REPO / "tests" / "data" / "ddp_rows" / "runs.csv"  # see tests/data/cpu_rows/README.md
    rows = read_text(ddp).rows
    runs = RunsFile(tmp_path / "runs.csv")
    for row in rows:
        runs.write(row)
    before = read_runs(runs.path)
    multi = before[(before.world_size == 2) & before.scaling_efficiency.notna()].iloc[0]
    baseline = next(row for row in rows if row["world_size"] == "1" and row["model"] == multi.model
                    and row["micro_batch"] == str(multi.micro_batch) and row["accum_steps"] == str(multi.accum_steps)
                    and row["status"] == "ok")
    runs.write({**baseline, "samples_per_s": str(2 * float(baseline["samples_per_s"]))})  # appended, not rewritten
    after = read_runs(runs.path).set_index("cell_id")
    assert after.loc[multi.cell_id, "scaling_efficiency"] == pytest.approx(multi.scaling_efficiency / 2)
    assert derive(before.iloc[:0]).empty
