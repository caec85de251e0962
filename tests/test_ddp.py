"""DDP on CPU: gloo, 2 processes, tiny models. All-reduce counts, gradients against one large
batch, a rank that dies, and the rows a data-parallel grid writes."""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import replace

import pandas as pd
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import bench_in_process, read_rows, tiny_grid

from bench.errors import GridFileError
from bench.grid.cell import Cell
from bench.grid.spec import load_grid, with_world_size
from bench.measure.cpu import threads_per_rank
from bench.measure.device import DeviceInfo
from bench.measure.memory import TracedStep
from bench.measure.peak import PeakFlops
from bench.results.read import read_runs
from bench.results.rows import TRACKED_CATEGORIES, AllreduceMeasurement, ProcessMeasurement
from bench.results.store import RunsFile
from bench.run import start_cell_server
from bench.run.cell_measurement import CellTask
from bench.run.ddp_launch import aggregate
from bench.run.ddp_rank import FAIL_EXIT_CODE, FAIL_RANK_ENV, DdpDistribution
from bench.train.models import build_model, synthetic_batch
from bench.train.step import accumulate_gradients

WORLD_SIZE, ACCUM_STEPS, GLOBAL_BATCH = 2, 4, 16


def _global_batch() -> tuple[torch.Tensor, torch.Tensor]:
    return synthetic_batch(GLOBAL_BATCH, 32, channels_last=False, device="cpu", seed=1)


def _fresh_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("test_vit", 32)  # LayerNorm: accumulation is exact up to rounding


def _rank_gradients(rank: int, port: int, out_dir: str) -> None:
    """One rank: its half of the batch in K micro-batches under DDP, with and without no_sync."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    images, labels = (part.chunk(WORLD_SIZE)[rank] for part in _global_batch())
    micro_batches = list(zip(images.chunk(ACCUM_STEPS), labels.chunk(ACCUM_STEPS)))
    result = {}
    for sync in ("no_sync", "every_step"):
        distribution = DdpDistribution(rank, rank, torch.device("cpu"), sync)
        model = distribution.wrap(_fresh_model())
        accumulate_gradients(model, micro_batches, "fp32", no_sync=distribution.no_sync)
        result[sync] = {"synced_backwards": distribution.meter.synced_backwards,
                        "bucket_calls": distribution.meter.bucket_calls,
                        "grads": {name: p.grad for name, p in model.module.named_parameters()}}
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def ddp_ranks(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("ddp")
    mp.spawn(_rank_gradients, args=(_free_port(), str(out_dir)), nprocs=WORLD_SIZE, join=True)
    return [torch.load(out_dir / f"rank{rank}.pt") for rank in range(WORLD_SIZE)]


@pytest.mark.serial
def test_one_synchronising_all_reduce_per_step_with_no_sync_and_k_without(ddp_ranks):
    for rank in ddp_ranks:
        assert rank["no_sync"]["synced_backwards"] == 1
        assert rank["every_step"]["synced_backwards"] == ACCUM_STEPS
        # One bucket holds the whole model: the bucket count is the backward count.
        assert rank["no_sync"]["bucket_calls"] == 1 and rank["every_step"]["bucket_calls"] == ACCUM_STEPS


@pytest.mark.serial
def test_ddp_gradients_equal_the_single_process_large_batch_gradients(ddp_ranks):
    model = _fresh_model()
    accumulate_gradients(model, [_global_batch()], "fp32")
    large = {name: p.grad for name, p in model.named_parameters()}
    for rank in ddp_ranks:
        for sync in ("no_sync", "every_step"):
            grads = rank[sync]["grads"]
            worst = max(((grads[k] - large[k]).norm() / large[k].norm().clamp_min(1e-12)).item() for k in large)
            assert worst < 1e-5, (sync, worst)


@pytest.mark.serial
def test_a_ddp_grid_writes_per_rank_memory_global_throughput_scaling_and_all_reduce_counts(write_grid, tmp_path, capfd):
    grid = write_grid(tiny_grid("ddp", effective_batch=6, pairs="[[2, 3]]",
                                extra_run="").replace('optimizer = ["sgd"]',
                                                      'optimizer = ["sgd"]\nworld_size = [1, 2]\n'
                                                      'ddp_sync = ["no_sync", "every_step"]'))
    results = tmp_path / "results"
    ran = bench_in_process(capfd, "run", str(grid), "--results", str(results))
    assert ran.returncode == 0, ran.stderr
    (runs,) = results.glob("ddp/*/runs.csv")
    rows = {(r["world_size"], r["ddp_sync"]): r for r in read_rows(runs)}
    assert set(rows) == {("1", "no_sync"), ("2", "no_sync"), ("2", "every_step")}
    assert {r["status"] for r in rows.values()} == {"ok"}, [r["error_message"] for r in rows.values()]
    single, synced_once, synced_always = rows["1", "no_sync"], rows["2", "no_sync"], rows["2", "every_step"]
    assert {r["scaling_efficiency"] for r in rows.values()} == {""}  # derived when read, never written back
    efficiency = read_runs(runs).set_index("cell_id").scaling_efficiency
    assert pd.isna(efficiency[single["cell_id"]]) and single["allreduce_calls_per_step"] == ""
    assert single["global_samples_per_s"] == single["samples_per_s"]
    for row in (synced_once, synced_always):
        assert row["global_batch"] == "12" and row["effective_batch"] == "6"
        assert int(row["cpu_threads"]) == threads_per_rank(2)
        assert int(row["peak_memory_max_rank_bytes"]) >= int(row["peak_memory_min_rank_bytes"]) > 0
        assert row["peak_memory_bytes"] == row["peak_memory_max_rank_bytes"]
        assert float(row["global_samples_per_s"]) == pytest.approx(2 * float(row["samples_per_s"]))
        expected = float(row["global_samples_per_s"]) / (2 * float(single["samples_per_s"]))
        assert efficiency[row["cell_id"]] == pytest.approx(expected)
        assert float(row["allreduce_ms_per_step"]) > 0
    assert float(synced_once["synced_backwards_per_step"]) == 1
    assert float(synced_always["synced_backwards_per_step"]) == 3  # K
    assert float(synced_always["allreduce_calls_per_step"]) == 3


@pytest.mark.serial
def test_a_rank_that_dies_is_an_error_row_and_the_grid_goes_on(write_grid, tmp_path, monkeypatch, capfd):
    grid = write_grid(tiny_grid("dies", pairs="[[4, 1], [2, 2]]").replace(
        'optimizer = ["sgd"]',
        'optimizer = ["sgd"]\nworld_size = [1, 2]\nexclude = [{ world_size = 2, micro_batch = 2 }]'))
    results = tmp_path / "results"
    began = time.monotonic()
    start_cell_server()  # the session's fork server, if this test starts it, must not keep the variable for later cells
    monkeypatch.setenv(FAIL_RANK_ENV, "1")  # rank 1 exits abruptly before its timed steps (torchrun passes it on)
    ran = bench_in_process(capfd, "run", str(grid), "--results", str(results))
    assert ran.returncode == 0, ran.stderr
    assert time.monotonic() - began < 240
    rows = read_rows(next(results.glob("dies/*/runs.csv")))
    assert [(r["world_size"], r["micro_batch"], r["status"]) for r in rows] == [
        ("1", "4", "ok"), ("2", "4", "error"), ("1", "2", "ok")]  # the cell after the failure ran
    assert rows[1]["error_type"] == "RankDied"
    assert rows[1]["error_message"].startswith(f"rank 1 exited with code {FAIL_EXIT_CODE}")


def _task(world_size: int = 2) -> CellTask:
    cell = Cell(experiment="e", profile="cpu", model="m", image_size=32, micro_batch=2, accum_steps=2,
                precision="fp32", checkpointing="off", optimizer="sgd", channels_last=False, warmup_steps=1,
                measured_steps=3, world_size=world_size)
    return CellTask(cell, DeviceInfo("cpu", "cpu", ("fp32",), 2), PeakFlops(None, "none"), None)


def _rank_outcome(step_times_ms: list[float], peak: int, allreduce_ms: float) -> ProcessMeasurement:
    traced = TracedStep(grads_bytes=10, tracked_peak_bytes={"total": peak, **dict.fromkeys(TRACKED_CATEGORIES, 0)})
    return ProcessMeasurement(step_times_ms, traced, "tracked_tensors", None, None, params_bytes=10,
                              optimizer_state_bytes=0, param_count=5, host_threads=1, cpu_threads=1,
                              allreduce=AllreduceMeasurement(3, 3, allreduce_ms * len(step_times_ms)))


def test_ranks_combine_into_one_row_paced_by_the_slowest_rank():
    row = aggregate(_task(), {0: _rank_outcome([10, 30, 10], 100, 2.0), 1: _rank_outcome([20, 10, 20], 300, 5.0)},
                    returncode=0)
    assert json.loads(row["step_times_ms"]) == [20, 30, 20]
    assert row["step_time_median_ms"] == 20
    assert row["samples_per_s"] == pytest.approx(4 / 0.020) and row["global_samples_per_s"] == pytest.approx(8 / 0.020)
    assert (row["peak_memory_bytes"], row["peak_memory_max_rank_bytes"], row["peak_memory_min_rank_bytes"]) == (300, 300, 100)
    assert row["activations_peak_bytes"] == 280 and row["allreduce_ms_per_step"] == 5.0 and "rank" not in row


def _torchrun_summary(*failures: tuple[int, int]) -> str:
    return "\n".join(f"[{i}]:\n  time      : 2026-11-29_12:37:18\n  rank      : {rank} (local_rank: {rank})\n"
                     f"  exitcode  : {code} (pid: {100 + rank})" for i, (rank, code) in enumerate(failures))


def test_the_rank_that_failed_first_decides_the_row():
    lost_peer = {"status": "error", "error_type": "RuntimeError", "error_message": "Connection closed by peer"}
    oom = {"status": "oom", "error_type": "OutOfMemoryError", "error_message": "CUDA out of memory"}
    # Both reported: the specific failure, not the collective that lost the rank.
    assert aggregate(_task(), {0: lost_peer, 1: oom}, 1, _torchrun_summary((0, 1), (1, 1))) == {
        "status": "oom", "error_type": "OutOfMemoryError", "error_message": "rank 1: CUDA out of memory"}
    # Rank 0 stopped by torchrun (SIGTERM) after rank 1's error: rank 1's error.
    assert aggregate(_task(), {1: oom}, 1, _torchrun_summary((0, -15), (1, 1)))["status"] == "oom"
    # Rank 1 died without a word; rank 0's error is only the consequence.
    died = aggregate(_task(), {0: lost_peer}, 1, _torchrun_summary((0, 1), (1, 7)))
    assert died["error_type"] == "RankDied" and died["error_message"].startswith("rank 1 exited with code 7")
    assert "rank 0 then failed: RuntimeError" in died["error_message"]
    assert aggregate(_task(), {}, -9, "")["error_message"].startswith("rank(s) 0, 1 ended without a result")


def test_scaling_efficiency_is_derived_on_read_whatever_order_the_rows_came_in(tmp_path):
    cell = _task().cell
    single = replace(cell, world_size=1)
    lonely = replace(cell, micro_batch=4, accum_steps=1)  # no 1-process row of its configuration
    runs = RunsFile(tmp_path / "runs.csv")
    for c, figures in ((cell, {"global_samples_per_s": 300.0}), (lonely, {"global_samples_per_s": 300.0}),
                       (single, {"samples_per_s": 200.0})):  # the baseline last, e.g. a SLURM job ending last
        runs.write({"cell_id": c.cell_id, **c.to_dict(), "status": "ok", **figures})
    efficiency = read_runs(runs.path).set_index("cell_id").scaling_efficiency
    assert efficiency[cell.cell_id] == 0.75
    assert efficiency[[lonely.cell_id, single.cell_id]].isna().all()


def test_world_size_axis_expands_once_per_process_count_and_nproc_overrides_it(write_grid):
    path = write_grid(tiny_grid("axes").replace('optimizer = ["sgd"]', 'optimizer = ["sgd"]\nworld_size = [1, 2]\n'
                                                                       'ddp_sync = ["no_sync", "every_step"]'))
    grid = load_grid(path, "cpu")
    # One process has nothing to synchronise: no every_step twin of the 1-process cell.
    assert [(c.world_size, c.ddp_sync) for c in grid.cells[:3]] == [(1, "no_sync"), (2, "no_sync"), (2, "every_step")]
    assert len(grid.cells) == 6
    assert {(c.world_size, c.ddp_sync) for c in with_world_size(grid, 4).cells} == {(4, "no_sync"), (4, "every_step")}
    assert len(with_world_size(grid, 1).cells) == 2
    with pytest.raises(GridFileError, match=r"grid.world_size\[0\]: 0 is not allowed; must be >= 1"):
        load_grid(write_grid(tiny_grid("bad").replace('optimizer = ["sgd"]', 'optimizer = ["sgd"]\nworld_size = 0'),
                             "bad.toml"), "cpu")

