"""The memory estimator: equal to the CPU runner's tracked measurement, and the CUDA share on top."""

from __future__ import annotations

import pytest
from conftest import REPO, bench_in_process, measured_columns, read_rows, tiny_grid

from bench.grid.cell import Cell
from bench.measure.device import DeviceInfo
from bench.measure.peak import PeakFlops
from bench.memory.allocator import CUDA_BLOCK_BYTES, CUDA_SEGMENT_BYTES, whole_segments
from bench.memory.estimate import WORKSPACE_ALLOWANCE_BYTES, estimate_cell
from bench.memory.fake_models import FakeModels
from bench.results.schema import ESTIMATE_COLUMNS
from bench.run.cell_measurement import CellTask
from bench.units import MIB

CPU = DeviceInfo("cpu", "test cpu", ("fp32", "bf16", "fp16"), 2)


def _cell(model: str, precision: str, checkpointing: str, optimizer: str, accum_steps: int,
          micro_batch: int = 4) -> Cell:
    return Cell(experiment="t", profile="cpu", model=model, image_size=32, micro_batch=micro_batch,
                accum_steps=accum_steps, precision=precision, checkpointing=checkpointing, optimizer=optimizer,
                channels_last=False, warmup_steps=1, measured_steps=1)


@pytest.mark.parametrize("model, precision, checkpointing, optimizer, accum_steps", [
    ("test_vit", "bf16", "full", "adamw", 4),
    ("test_vit", "fp32", "off", "sgd", 1),
    ("test_resnet", "fp32", "off", "adamw", 4),
    ("test_resnet", "bf16", "full", "sgd", 1),
    ("test_vit", "fp32", "off", "adamw8bit", 2),
])
@pytest.mark.serial
def test_estimate_equals_the_cpu_runners_tracked_measurement(model, precision, checkpointing, optimizer,
                                                             accum_steps):
    # Equal to 4 digits, mostly to the byte: a few real CPU kernels allocate a little more than
    # their fake counterparts (seen: 256 bytes of 6 MB, bf16 ResNet with checkpointing).
    cell = _cell(model, precision, checkpointing, optimizer, accum_steps)
    measured = measured_columns(CellTask(cell, CPU, PeakFlops(None, "not measured"), None))
    estimate = estimate_cell(cell, "cpu")
    assert estimate.tracked_peak_bytes == pytest.approx(measured["peak_tracked_bytes"], rel=1e-4, abs=0)
    assert estimate.peak_bytes == estimate.tracked_peak_bytes and estimate.peak_allocated_bytes is None
    for name in ("params", "buffers", "optimizer_state"):
        assert estimate.traced.tracked_peak_bytes[name] == measured[f"tracked_{name}_bytes"], name
    assert estimate.params_bytes == measured["params_bytes"]
    assert estimate.traced.grads_bytes == measured["grads_bytes"]
    assert estimate.traced.optimizer_state_bytes == measured["optimizer_state_bytes"]


@pytest.mark.slow
def test_cached_fake_models_start_every_cell_fresh():
    shared = FakeModels()
    estimate_cell(_cell("test_vit", "fp32", "off", "adamw", 2), "cpu", shared)  # leaves state behind, if any
    sgd = _cell("test_vit", "fp32", "off", "sgd", 2)
    assert estimate_cell(sgd, "cpu", shared).traced == estimate_cell(sgd, "cpu").traced


@pytest.mark.slow
def test_cuda_estimate_adds_block_rounding_inputs_and_workspace():
    cell = _cell("test_vit", "bf16", "off", "adamw", 2)
    cpu, cuda = estimate_cell(cell, "cpu"), estimate_cell(cell, "cuda")
    assert cpu.peak_allocated_bytes is None and cpu.peak_reserved_bytes is None
    # Every tracked storage is a whole number of 512-byte blocks, so the tracked peak grows.
    assert cuda.tracked_peak_bytes % CUDA_BLOCK_BYTES == 0
    assert cuda.tracked_peak_bytes > cpu.tracked_peak_bytes
    images_bytes = 4 * 3 * 32 * 32 * 4
    assert cuda.inputs_bytes == images_bytes + CUDA_BLOCK_BYTES  # int64 labels: 32 bytes, one block
    assert cuda.peak_allocated_bytes == cuda.tracked_peak_bytes + cuda.inputs_bytes + WORKSPACE_ALLOWANCE_BYTES
    # Reserved: whole segments, at least the allocated peak (the replay of the step's allocations, fragmentation and all).
    assert cuda.peak_reserved_bytes % CUDA_SEGMENT_BYTES == 0
    assert cuda.peak_reserved_bytes >= cuda.peak_allocated_bytes


@pytest.mark.slow
def test_cuda_reserved_counts_the_allocators_segments():
    # test_vit's activations at micro-batch 256 are 1-10 MiB tensors, which the caching allocator serves from 20 MiB
    # segments: reserved runs well past the allocated peak in whole segments (bench.memory.allocator).
    cuda = estimate_cell(_cell("test_vit", "fp32", "off", "adamw", 1, micro_batch=256), "cuda")
    assert cuda.peak_reserved_bytes - whole_segments(cuda.peak_allocated_bytes) >= 10 * MIB


@pytest.mark.slow
def test_peak_grows_with_the_micro_batch_and_falls_with_checkpointing():
    peaks = [estimate_cell(_cell("test_vit", "fp32", "off", "sgd", 1, micro_batch=mb), "cuda").peak_bytes
             for mb in (8, 16, 32)]
    assert peaks[0] < peaks[1] < peaks[2]
    full = estimate_cell(_cell("test_vit", "fp32", "full", "sgd", 1, micro_batch=32), "cuda").peak_bytes
    assert full < peaks[2]


@pytest.mark.slow
def test_estimate_command_writes_rows_and_chart(tmp_path, capfd):
    results = tmp_path / "results"
    done = bench_in_process(capfd, "estimate", "experiments/smoke.toml", "--results", str(results))
    assert done.returncode == 0, done.stderr
    folder = results / "smoke" / "estimate"
    assert (folder / "runs.csv").read_text().splitlines()[0] == ",".join(ESTIMATE_COLUMNS)
    rows = read_rows(folder / "runs.csv")
    assert len(rows) == 4 and {r["status"] for r in rows} == {"estimated"}
    assert {r["profile"] for r in rows} == {"cuda"} and {r["device_type"] for r in rows} == {"cuda"}
    assert all("H200" in r["fits_gpus"].split(";") and "not modelled" in r["estimate_method"] for r in rows)
    assert (folder / "memory_estimate.png").stat().st_size > 0

    cpu = bench_in_process(capfd, "estimate", "experiments/smoke.toml", "--results", str(results), "--profile", "cpu")
    assert cpu.returncode == 0, cpu.stderr
    rows = read_rows(folder / "runs.csv")
    assert sorted(r["profile"] for r in rows) == ["cpu"] * 4 + ["cuda"] * 4  # the CUDA rows are kept
    assert all(r["fits_gpus"] == "" and r["peak_allocated_bytes"] == "" for r in rows if r["profile"] == "cpu")


def test_estimate_of_a_missing_grid_is_one_line_and_exit_2(tmp_path, capfd):
    result = bench_in_process(capfd, "estimate", str(tmp_path / "nowhere.toml"))
    assert result.returncode == 2
    assert result.stderr.strip() == f"bench: {tmp_path / 'nowhere.toml'}: no such grid file"


@pytest.mark.slow  # a real warm-up step beside a fake one, three times: 3.3 s on 2 Xeon cores
@pytest.mark.parametrize("optimizer, precision, zero_grad", [("adamw", "bf16", "none"), ("sgd", "fp32", "zeros"),
                                                             ("adamw", "fp32", "zeros")])
def test_the_fake_warm_up_leaves_what_a_real_warm_up_step_leaves(optimizer, precision, zero_grad):
    """The estimator's warm-up steps the optimizer on zero gradients instead of running a forward and backward (a
    third of a trace): the optimizer state and the gradients it leaves must be a real warm-up step's."""
    from bench.memory.estimate import fake_step
    from bench.train.setup import cell_batch, cell_model, cell_optimizer
    from bench.train.step import train_step

    cell = Cell(experiment="e", profile="cpu", model="test_resnet", image_size=32, micro_batch=2, accum_steps=1,
                precision=precision, checkpointing="off", optimizer=optimizer, channels_last=False, warmup_steps=1,
                measured_steps=1, zero_grad=zero_grad)

    def left(model, opt) -> tuple:
        state = [sorted((k, tuple(v.shape), v.dtype) for k, v in opt.state[p].items() if hasattr(v, "shape"))
                 for p in model.parameters()]
        return state, [None if p.grad is None else (tuple(p.grad.shape), p.grad.dtype) for p in model.parameters()]

    with fake_step(cell, "cpu", FakeModels()) as step:
        fake = left(step.model, step.optimizer)
    model = cell_model(cell, "cpu")
    real_optimizer = cell_optimizer(cell, model)
    train_step(model, real_optimizer, [cell_batch(cell, "cpu")], precision, zero_grad=zero_grad)
    assert fake == left(model, real_optimizer) and fake[0][0]  # the state exists


@pytest.mark.serial  # starts the second tracing process
def test_a_long_grid_is_traced_from_both_ends_and_estimated_as_one_process_does(tmp_path, monkeypatch, write_grid):
    """From `BOTH_ENDS_MIN_CELLS` cells, a child of the fork server traces the grid from its last cell back while the
    estimate goes forward (`tracing_from_both_ends`): the rows are the ones a single process writes."""
    import os

    import bench.isolation
    from bench.grid.spec import load_grid
    from bench.memory.estimate_grid import estimate_grid
    from bench.memory.traces import BOTH_ENDS_MIN_CELLS

    grid = load_grid(write_grid(tiny_grid("both_ends", effective_batch=8, pairs="[[8, 1], [2, 4]]").replace(
        'precision = ["fp32"]\n        optimizer = ["sgd"]',
        'precision = ["fp32", "bf16"]\n        optimizer = ["sgd", "adamw"]')), "cuda")
    assert len(grid.cells) >= BOTH_ENDS_MIN_CELLS
    started = []
    real_fork_server = bench.isolation.fork_server
    monkeypatch.setattr(bench.isolation, "fork_server", lambda: started.append(True) or real_fork_server())
    figures = []
    for run, cores in enumerate((2, 1)):
        monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / f"cache-{run}"))
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, cores=cores: set(range(cores)))
        rows = read_rows(estimate_grid(grid, tmp_path / f"results-{run}"))
        figures.append([{k: v for k, v in row.items() if k not in ("started_utc", "duration_s")} for row in rows])
    assert started == [True]  # the second process, in the 2-core run only
    assert figures[0] == figures[1] and len(figures[0]) == len(grid.cells)


def test_estimate_starts_the_tracing_server_first_only_for_a_grid_it_traces_from_both_ends(monkeypatch, tmp_path):
    """The fork server is started before the command's own imports only where a child of it will trace the grid's
    far end: a small grid, or a file that does not load (the command reports it), starts no process."""
    import bench.isolation
    from bench.commands.memory import _start_far_end_early

    started = []
    monkeypatch.setattr(bench.isolation, "start_fork_server_early", lambda *modules: started.append(modules))
    monkeypatch.setattr("bench.measure.host.usable_cpus", lambda: 2)
    monkeypatch.delenv("BENCH_NO_CACHE", raising=False)
    for files, expected in (([REPO / "experiments" / "smoke.toml"], []),
                            ([tmp_path / "missing.toml"], []),
                            ([REPO / "experiments" / "smoke.toml", REPO / "experiments" / "resnet50.toml"],
                             [("bench.memory.estimate",)])):
        started.clear()
        _start_far_end_early(files, "cuda")
        assert started == expected, files
