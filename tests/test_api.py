"""The library and the command line agree: the same functions, the same defaults, the same lock."""

from __future__ import annotations

import fcntl
import os

import pytest
from conftest import REPO

import bench
from bench.errors import OptionError
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


@pytest.mark.slow  # about 1.5 s: two grids estimated and predicted twice
def test_estimate_predict_and_probe_answer_as_their_commands_do(tmp_path, capsys):
    """`bench estimate`, `bench predict` and `bench probe` are the library's `estimate_grids`, `predict_grids` and
    `probe_report` with their output formatted: the same rows, files and answers."""
    from bench.cli import main
    from bench.results.read import file_schema, read_runs

    def rows(path):
        return read_runs(path, file_schema(path).columns)

    grid = REPO / "experiments" / "smoke.toml"
    estimated = bench.estimate_grids([grid], profile="cpu", results_root=tmp_path / "lib")
    predicted = bench.predict_grids([grid], gpus=["L4"], only={"model": "test_resnet"}, results_root=tmp_path / "lib")
    assert main(["estimate", str(grid), "--profile", "cpu", "--results", str(tmp_path / "cli")]) == 0
    assert main(["predict", str(grid), "--gpu", "L4", "--only", "model=test_resnet", "--results",
                 str(tmp_path / "cli")]) == 0
    for found, kind in ((estimated[0], "estimate"), (predicted[0], "predicted")):
        ours, theirs = rows(found.runs_file), rows(tmp_path / "cli" / "smoke" / kind / "runs.csv")
        figures = [c for c in ours.columns if c.endswith(("_bytes", "samples_per_s")) and ours[c].notna().any()]
        assert figures and ours[["cell_id", *figures]].equals(theirs[["cell_id", *figures]])
    assert {row["model"] for row in predicted[0].accumulation} == {"test_resnet"}
    assert predicted[0].accumulation_file == found.runs_file.parent / "accumulation.csv"

    report = bench.probe_report("test_resnet", gpus=["L4", "T4"], image_size=32)
    capsys.readouterr()
    assert main(["probe", "test_resnet", "--gpu", "L4", "--gpu", "T4", "--image-size", "32"]) == 0
    out = capsys.readouterr().out
    assert [answer.budget.source for answer in report.answers] == ["L4 (24 GiB)", "T4 (16 GiB)"]
    for answer in report.answers:
        assert f"predicted largest micro-batch: {answer.result.predicted.largest} " in out
        assert answer.agreement is not None and answer.agreement.describe()[:40] in out


def test_an_unknown_gpu_or_a_filter_no_cell_matches_is_refused_before_anything_is_predicted(tmp_path):
    grid = REPO / "experiments" / "smoke.toml"
    with pytest.raises(OptionError, match="--gpu X100: not a catalog key"):
        bench.predict_grids([grid], gpus=["X100"], results_root=tmp_path)
    with pytest.raises(OptionError, match="no cell of .*smoke.toml matches; its optimizer values: sgd"):
        bench.predict_grids([grid], only={"optimizer": "lion"}, results_root=tmp_path)
    assert not list(tmp_path.rglob("*.csv"))
