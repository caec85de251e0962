"""Where cells run: here by default, or as jobs through submitit (its local stand-in for SLURM)."""

from __future__ import annotations

import pytest
from conftest import read_rows, tiny_grid

from bench.grid.cell import Cell
from bench.grid.spec import load_grid
from bench.measure.device import DeviceInfo, detect_device
from bench.measure.peak import PeakFlops
from bench.results.store import COLUMNS
from bench.run.cell_measurement import CellTask
from bench.run.executors import (
    LocalExecutor,
    SlurmExecutor,
    SlurmOptions,
    job_outcome,
    make_executor,
    target_device,
)
from bench.run.grid_runner import RunOptions, run_grid


def test_the_local_executor_is_the_default():
    options = RunOptions()
    assert options.executor == "local"
    assert isinstance(make_executor(options.executor, options.slurm), LocalExecutor)


@pytest.mark.serial
def test_cells_run_as_submitit_jobs_write_the_same_rows_and_resume(write_grid, tmp_path):
    grid = load_grid(write_grid(tiny_grid("jobs")), "cpu")
    slurm = SlurmOptions(folder=tmp_path / "jobs", cluster="local", poll_s=0.2)
    device = target_device("auto", "slurm", slurm)  # asked in a job, as on a cluster's compute node
    assert device == detect_device("auto")
    options = RunOptions(results_root=tmp_path / "results", executor="slurm", slurm=slurm)
    rows = run_grid(grid, device, options)
    assert [r["status"] for r in rows] == ["ok", "ok"], [r["error_message"] for r in rows]
    runs = next((tmp_path / "results" / "jobs").glob("*/runs.csv"))
    assert runs.read_text().splitlines()[0] == ",".join(COLUMNS)
    assert all(float(r["samples_per_s"]) > 0 and r["started_utc"] and float(r["duration_s"]) > 0 for r in rows)
    submitted = len(list(slurm.folder.glob("*_submitted.pkl")))

    assert run_grid(grid, device, options) == rows  # resumed: every cell has a row, no job submitted
    assert len(list(slurm.folder.glob("*_submitted.pkl"))) == submitted
    # Jobs end in any order; the file holds rows as they came back.
    assert sorted(read_rows(runs), key=lambda r: r["cell_id"]) == sorted(rows, key=lambda r: r["cell_id"])


def test_job_parameters_ask_one_gpu_per_rank_and_the_users_partition():
    task = _cuda_task(world_size=8)
    parameters = SlurmExecutor(SlurmOptions(partition="gpu", time_min=30)).job_parameters(task, 900)
    assert parameters == {"name": f"bench-{task.cell.cell_id}", "nodes": 1, "tasks_per_node": 1,
                          "gpus_per_node": 8, "timeout_min": 30, "slurm_partition": "gpu"}
    default_time = SlurmExecutor(SlurmOptions()).job_parameters(task, 900)
    assert default_time["timeout_min"] == 15 + 10 and "slurm_partition" not in default_time


def test_a_job_that_fails_outside_the_cell_is_an_error_row():
    class FailedJob:
        job_id = "4242"

        def result(self):
            raise RuntimeError("Job 4242 failed with trace:\nTraceback ...\nsubmitit.core.utils.UncompletedJobError: "
                               "job 4242 timed out")

    assert job_outcome(FailedJob()) == {
        "status": "error", "error_type": "RuntimeError",
        "error_message": "job 4242: submitit.core.utils.UncompletedJobError: job 4242 timed out"}


def _cuda_task(world_size: int) -> CellTask:
    cell = Cell(experiment="e", profile="cuda", model="resnet50", image_size=224, micro_batch=64, accum_steps=2,
                precision="bf16", checkpointing="off", optimizer="adamw", channels_last=True, warmup_steps=3,
                measured_steps=10, world_size=world_size)
    return CellTask(cell, DeviceInfo("cuda", "NVIDIA H200", ("fp32", "bf16", "fp16"), 16), PeakFlops(None, ""), None)
