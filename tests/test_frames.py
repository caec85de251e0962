"""Notebook-friendly results: `bench.read_rows` and the API objects' `to_frame()` / `_repr_html_`."""

from __future__ import annotations

import pytest
from conftest import CPU_ROWS, REPO

import bench
from bench.errors import ResultsFileError
from bench.results.read import read_runs

FOLDER = CPU_ROWS.parent


def test_read_rows_is_the_one_readers_typed_frame_of_a_folder_or_its_runs_file():
    rows = bench.read_rows(FOLDER)
    assert rows.equals(read_runs(FOLDER / "runs.csv")) and rows.equals(bench.read_rows(FOLDER / "runs.csv"))
    assert str(rows.micro_batch.dtype) == "Int64" and set(rows.status) <= {"ok", "oom", "error", "timeout", "skipped"}


def test_read_rows_of_a_folder_without_rows_is_one_line(tmp_path):
    with pytest.raises(ResultsFileError, match=r"runs.csv: no runs file here; name a results folder"):
        bench.read_rows(tmp_path)


def test_a_plan_and_a_grid_are_tables_in_a_notebook():
    plan = bench.plan([FOLDER], model="resnet50", effective_batch=128, allow_cpu_projection=True,
                      predict="never")  # the table, not the throughput model (38 s of tracing ResNet-50)
    frame = plan.to_frame()
    assert frame["rank"].tolist() == list(range(1, len(plan.options) + 1))
    assert frame.usd_per_run.tolist() == [option.usd_per_run for option in plan.options]
    assert plan._repr_html_().startswith("<table") and plan.options[0].configuration in plan._repr_html_()
    grid = bench.load_grid(REPO / "experiments" / "smoke.toml", "cpu")
    assert grid.to_frame().cell_id.tolist() == [cell.cell_id for cell in grid.cells]
    table = bench.price(FOLDER, allow_cpu_projection=True, providers=["aws"])
    assert len(table.to_frame()) == len(table.lines)
