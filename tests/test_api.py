"""The library and the command line agree: the same functions, the same defaults, the same lock."""

from __future__ import annotations

import fcntl
import os

import pytest
from conftest import REPO

import bench
from bench.results.lock import LOCK_NAME, FolderLocked, runner_lock


def test_run_grid_takes_the_results_lock_itself(tmp_path):
    """Another runner holding the folder: the library refuses as `bench run` does, before measuring anything."""
    fd = os.open(tmp_path / LOCK_NAME, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a second open file: to flock, another runner
        with pytest.raises(FolderLocked, match="another `bench run`"):
            bench.run_grid(REPO / "experiments" / "smoke.toml", device="cpu", results_root=tmp_path)
    finally:
        os.close(fd)
    assert not list(tmp_path.glob("*/*/runs.csv"))


def test_the_lock_is_reentrant_within_a_process(tmp_path):
    """`bench run` holds the lock over its grids, and `run_grid` takes it again for each (`within`)."""
    with runner_lock(tmp_path):
        with runner_lock(tmp_path, within=True):
            pass
        assert (tmp_path / LOCK_NAME).exists()  # the inner block neither released nor removed it
        with pytest.raises(FolderLocked):  # without `within`, a second block is another runner
            with runner_lock(tmp_path):
                pass
    assert not (tmp_path / LOCK_NAME).exists()


@pytest.mark.slow
def test_plan_predicts_by_default_as_bench_plan_does():
    """No rows of the model on a GPU: `bench.plan` adds the throughput model's options, as `bench plan` does."""
    plan = bench.plan(model="test_resnet", effective_batch=16, image_size=32, gpus=("L4",), precisions=("bf16",))
    assert plan.options and all(option.line.basis == "predicted" for option in plan.options)
    assert {option.line.instance.gpu for option in plan.options} == {"L4"}
    never = bench.plan(model="test_resnet", effective_batch=16, image_size=32, gpus=("L4",), predict="never")
    assert not never.options
