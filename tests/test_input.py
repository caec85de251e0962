"""The input pipeline: the generated set, loader batches, input wait, bad data dirs, corrupt files, orphans."""

from __future__ import annotations

import hashlib
import io
import json
import multiprocessing
import os
import shutil
import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import measured_columns, paragraphs, read_rows, tiny_grid
from PIL import Image

from bench.cli import main as bench_main
from bench.api import load_for_device
from bench.commands.grids import data_for
from bench.errors import DataDirError
from bench.grid.cell import Cell
from bench.grid.spec import load_grid
from bench.measure.device import detect_device
from bench.measure.peak import PeakFlops
from bench.results.read import read_runs
from bench.results.store import RunsFile
from bench.run.cell_input import (
    MicroBatchFeeder,
    open_input,
)
from bench.run.cell_measurement import CellTask
from bench.train.data import (
    CorruptImageError,
    LoaderConfig,
    discover,
    make_loader,
    open_data,
)
from bench.train.imagenet_like import (
    GeneratedSetSpec,
    ensure_generated_set,
    set_statistics,
)
from bench.train.models import build_model
from bench.train.step import accumulate_gradients, train_step

TINY = GeneratedSetSpec(images=24, classes=4, seed=1, size_scale=0.25)
"""24 small JPEGs (about 125 x 94 px): generated in a fraction of a second."""
CPU = torch.device("cpu")


@pytest.fixture(scope="session")
def tiny_set(tmp_path_factory) -> Path:
    return ensure_generated_set(TINY, tmp_path_factory.mktemp("cache"))


def feeder_for(root: Path, *, workers: int = 0, channels_last: bool = False, size: int = 32, micro_batch: int = 4,
               seed: int = 0) -> MicroBatchFeeder:
    config = LoaderConfig(image_size=size, micro_batch=micro_batch, workers=workers, channels_last=channels_last,
                          seed=seed)
    return MicroBatchFeeder(make_loader(discover(root), config), CPU, channels_last=channels_last, image_size=size)


def digests(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.glob("*/*.JPEG"))}


def cell(**changes) -> Cell:
    base = Cell(experiment="input", profile="cpu", model="test_vit", image_size=32, micro_batch=4, accum_steps=2,
                precision="fp32", checkpointing="off", optimizer="sgd", channels_last=False, warmup_steps=1,
                measured_steps=3)
    return replace(base, **changes)


# ---------------------------------------------------------------- the generated set


def test_two_generations_are_identical_in_files_order_and_bytes(tmp_path, tiny_set):
    again = ensure_generated_set(TINY, tmp_path / "other")
    assert json.loads((again / "manifest.json").read_text())["files"] == \
        json.loads((tiny_set / "manifest.json").read_text())["files"]
    assert digests(again) == digests(tiny_set)
    assert discover(again).paths.tolist() == discover(tiny_set).paths.tolist()


def test_the_same_seed_reads_the_files_in_the_same_order(tmp_path, tiny_set):
    def order(root: Path, seed: int) -> list[bytes]:
        data = discover(root)
        loader = make_loader(data, LoaderConfig(image_size=32, micro_batch=4, seed=seed))
        indices = iter(loader.batch_sampler)
        return [data.paths[i] for _ in range(12) for i in next(indices)]  # two passes over the 24 files

    again = ensure_generated_set(TINY, tmp_path / "other")
    assert order(tiny_set, 3) == order(again, 3)
    assert order(tiny_set, 3) != order(tiny_set, 4)
    first_pass = order(tiny_set, 3)[:24]
    assert sorted(first_pass) == sorted(discover(tiny_set).paths.tolist())  # every file once per pass


def test_another_seed_gives_other_images(tmp_path, tiny_set):
    other = ensure_generated_set(replace(TINY, seed=2), tmp_path)
    assert digests(other) != digests(tiny_set)


def test_a_generated_set_is_reused_not_regenerated(tmp_path):
    first = ensure_generated_set(TINY, tmp_path)
    stamp = (first / "manifest.json").stat().st_mtime_ns
    second = ensure_generated_set(TINY, tmp_path)
    assert second == first and (second / "manifest.json").stat().st_mtime_ns == stamp


def test_rows_record_the_sets_name_size_and_seed(tiny_set):
    columns = discover(tiny_set).columns
    assert columns["data_source"] == "generated" and columns["data_set"] == TINY.name
    assert columns["data_images"] == 24 and columns["data_seed"] == 1
    assert columns["data_bytes"] == sum(p.stat().st_size for p in tiny_set.glob("*/*.JPEG"))


def test_a_copied_tree_is_a_plain_dir_without_a_seed(tmp_path, tiny_set):
    shutil.copytree(tiny_set, tmp_path / "train", ignore=shutil.ignore_patterns("manifest.json"))
    columns = discover(tmp_path / "train").columns
    assert columns["data_source"] == "dir" and columns["data_seed"] is None and columns["data_images"] == 24


def test_full_size_images_follow_imagenets_sizes(tmp_path):
    # Eight files at ImageNet's scale: long side mostly 500 px, JPEG tens of KB to a few hundred.
    root = ensure_generated_set(GeneratedSetSpec(images=8, classes=2, seed=0), tmp_path)
    stats = set_statistics(root)
    assert stats["width_px"]["median"] == 500 or stats["height_px"]["median"] == 500
    assert 40_000 < stats["file_bytes"]["mean"] < 250_000


# ---------------------------------------------------------------- batches and the step


@pytest.mark.parametrize("channels_last", [False, True])
def test_batches_shape_dtype_and_memory_format(tiny_set, channels_last):
    check_batches(feeder_for(tiny_set, channels_last=channels_last), channels_last)


@pytest.mark.serial
@pytest.mark.parametrize("channels_last", [False, True])
def test_batches_from_a_worker_process(tiny_set, channels_last):
    check_batches(feeder_for(tiny_set, workers=1, channels_last=channels_last), channels_last)


def check_batches(feeder: MicroBatchFeeder, channels_last: bool) -> None:
    try:
        batches = list(feeder.step(2))
    finally:
        feeder.close()
    assert len(batches) == 2
    for images, labels in batches:
        assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32
        assert labels.shape == (4,) and labels.dtype == torch.int64 and int(labels.max()) < 4
        assert images.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
        assert -3 < float(images.mean()) < 3  # normalised, not 0..255


def test_a_step_fetches_one_micro_batch_at_a_time_and_records_its_wait(tiny_set):
    feeder = feeder_for(tiny_set)
    step = feeder.step(2)
    assert len(step) == 2 and step.samples == 8 and feeder.micro_wait_ms == []
    iterator = iter(step)
    next(iterator)
    assert len(feeder.micro_wait_ms) == 1 and feeder.step_wait_ms == []
    next(iterator)
    with pytest.raises(StopIteration):
        next(iterator)
    assert len(feeder.step_wait_ms) == 1 and feeder.step_wait_ms[0] == pytest.approx(sum(feeder.micro_wait_ms))
    with pytest.raises(RuntimeError, match="once"):
        list(step)


@pytest.mark.slow
def test_the_step_gives_the_same_gradients_from_a_lazy_step_as_from_a_list(tiny_set):
    def gradients(lazy: bool, normalization: str) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = build_model("test_vit", 32)
        feeder = feeder_for(tiny_set, seed=5)
        torch.manual_seed(1)  # the augmentation draws from the training process's RNG without workers
        batches = feeder.step(3) if lazy else list(feeder.step(3))
        accumulate_gradients(model, batches, "fp32", normalization=normalization)
        return [p.grad.clone() for p in model.parameters()]

    for normalization in ("accum_steps", "samples"):
        for lazy_grad, list_grad in zip(gradients(True, normalization), gradients(False, normalization)):
            assert torch.equal(lazy_grad, list_grad)


def test_a_loader_step_trains_with_the_harness_step(tiny_set):
    torch.manual_seed(0)
    model = build_model("test_vit", 32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss = train_step(model, optimizer, feeder_for(tiny_set).step(2), "fp32")
    assert torch.isfinite(loss)


def test_synthetic_input_is_the_original_behaviour():
    with open_input(cell(channels_last=True), CPU) as source:
        batches = source.step(3)
        assert len(batches) == 3 and batches[0] is batches[2]
        assert batches[0][0].is_contiguous(memory_format=torch.channels_last)
        assert source.measured() is None


@pytest.mark.serial
def test_a_loader_cell_in_process_records_its_input(tiny_set):
    device = detect_device("cpu")
    threads = torch.get_num_threads()
    try:
        outcome = measured_columns(CellTask(cell(input="loader"), device, PeakFlops(None, "not measured in this test"), None,
                                            data=discover(tiny_set)))
    finally:
        torch.set_num_threads(threads)
    assert outcome["status"] == "ok", outcome
    waits = json.loads(outcome["input_wait_ms"])
    assert len(waits) == 3 and all(w > 0 for w in waits)
    assert outcome["input_wait_median_ms"] > 0 and outcome["input_wait_p90_ms"] >= outcome["input_wait_median_ms"]
    assert outcome["loader_samples_per_s"] > 0 and outcome["loader_cpu_ms_per_sample"] > 0
    assert isinstance(outcome["input_bound"], bool) and outcome["data_images"] == 24


# ---------------------------------------------------------------- the grid's axes


def test_synthetic_cells_keep_the_default_worker_count(write_grid):
    path = write_grid(tiny_grid("input", extra_run="") + """
        [profile.cpu.grid]
        input = ["synthetic", "loader"]
        loader_workers = [2, 4]
    """)
    cells = load_grid(path, "cpu").cells
    assert sorted((c.input, c.loader_workers) for c in cells if c.micro_batch == 4) == \
        [("loader", 2), ("loader", 4), ("synthetic", 0)]
    plain = load_grid(write_grid(tiny_grid("input")), "cpu").cells  # the same grid without the two axes
    assert {c.cell_id for c in cells if c.input == "synthetic"} == {c.cell_id for c in plain}
    assert "-input_loader-loader_workers_2-" in next(c for c in cells if c.loader_workers == 2).cell_id


def test_a_loader_row_gets_its_configurations_synthetic_speed_when_read(tmp_path):
    runs = RunsFile(tmp_path / "runs.csv")
    synthetic, loader = cell(), cell(input="loader", loader_workers=2)
    orphan = cell(input="loader", micro_batch=2, accum_steps=4)  # no synthetic row at 2x4
    fewer_threads = cell(input="loader", loader_workers=1, micro_batch=8, accum_steps=1)
    synthetic_8x1 = cell(micro_batch=8, accum_steps=1)
    for c, rate, threads in ((loader, "80.0", "2"), (orphan, "50.0", "2"), (synthetic, "100.0", "2"),
                             (synthetic_8x1, "90.0", "2"), (fewer_threads, "70.0", "1")):
        runs.write({"cell_id": c.cell_id, **c.to_dict(), "status": "ok", "samples_per_s": rate, "cpu_threads": threads})
    synthetic_rate = read_runs(runs.path).set_index("cell_id").synthetic_samples_per_s
    assert synthetic_rate[loader.cell_id] == 100.0
    # None at 2x4; 1 thread is not comparable with 2; a synthetic row has no reference
    assert synthetic_rate[[orphan.cell_id, fewer_threads.cell_id, synthetic.cell_id]].isna().all()


# ---------------------------------------------------------------- bad input


def one_line_error(path: Path) -> str:
    with pytest.raises(DataDirError) as info:
        open_data(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"--data-dir {path}")
    return message


def test_missing_dir(tmp_path):
    assert "does not exist" in one_line_error(tmp_path / "nope")


def test_file_instead_of_dir(tmp_path):
    (tmp_path / "f").write_text("x")
    assert "not a directory" in one_line_error(tmp_path / "f")


def test_empty_dir(tmp_path):
    assert "is empty" in one_line_error(tmp_path)


def test_images_without_class_folders(tmp_path, tiny_set):
    for source in list(tiny_set.glob("*/*.JPEG"))[:3]:
        shutil.copy(source, tmp_path / source.name)
    assert "no class folders" in one_line_error(tmp_path)


def test_class_folder_without_jpegs(tmp_path, tiny_set):
    shutil.copytree(tiny_set, tmp_path / "train")
    (tmp_path / "train" / "zzz_empty").mkdir()
    (tmp_path / "train" / "zzz_empty" / "notes.txt").write_text("x")
    assert "hold no .jpg/.jpeg" in one_line_error(tmp_path / "train")


def test_parent_of_the_tree(tmp_path, tiny_set):
    shutil.copytree(tiny_set, tmp_path / "train")
    assert "pass the split itself" in one_line_error(tmp_path)


def test_bench_run_with_a_bad_data_dir_is_one_line_exit_2_and_writes_nothing(tmp_path, write_grid, capsys):
    grid = write_grid(tiny_grid("bad_data"))
    results = tmp_path / "results"
    handler = signal.getsignal(signal.SIGTERM)  # `bench run` turns SIGTERM into Ctrl-C
    try:
        code = bench_main(["run", str(grid), "--device", "cpu", "--results", str(results),
                           "--data-dir", str(tmp_path / "missing")])
    finally:
        signal.signal(signal.SIGTERM, handler)
    error = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in error and "--data-dir" in error and "does not exist" in error
    assert not results.exists()


def test_the_data_dir_is_checked_only_when_asked_for_or_needed(write_grid, tiny_set):
    grids = load_for_device([write_grid(tiny_grid("plain"))], detect_device("cpu"))
    assert data_for(grids, None) is None
    assert len(data_for(grids, tiny_set)) == 24


def test_corrupt_jpeg_mid_run_names_the_file(tmp_path, tiny_set):
    victim = corrupt_copy(tiny_set, tmp_path)
    check_corrupt_file_is_named(feeder_for(tmp_path / "train"), victim)


@pytest.mark.serial
def test_corrupt_jpeg_in_a_worker_names_the_file(tmp_path, tiny_set):
    victim = corrupt_copy(tiny_set, tmp_path)
    check_corrupt_file_is_named(feeder_for(tmp_path / "train", workers=1), victim)


def corrupt_copy(tiny_set: Path, tmp_path: Path) -> Path:
    shutil.copytree(tiny_set, tmp_path / "train")
    victim = sorted((tmp_path / "train").glob("*/*.JPEG"))[5]
    victim.write_bytes(victim.read_bytes()[:300])  # truncated mid-scan
    return victim


def check_corrupt_file_is_named(feeder: MicroBatchFeeder, victim: Path) -> None:
    with pytest.raises(CorruptImageError) as info:
        for _ in range(6):  # one pass: every file is read once
            feeder.micro_batch()
    feeder.close()
    message = str(info.value)
    assert "\n" not in message and str(victim) in message


def test_png_named_jpeg_is_decoded_not_rejected(tmp_path, tiny_set):
    root = tmp_path / "train"
    shutil.copytree(tiny_set, root)
    victim = sorted(root.glob("*/*.JPEG"))[0]
    buffer = io.BytesIO()
    Image.open(victim).save(buffer, "PNG")  # as ImageNet's n02105855_2933.JPEG
    victim.write_bytes(buffer.getvalue())
    classes = len([folder for folder in root.iterdir() if folder.is_dir()])
    feeder = feeder_for(root)
    seen = 0
    for _ in range(6):  # one pass: every file is read once, the PNG among them
        images, labels = feeder.micro_batch()
        # decoded like any JPEG: an RGB sample at the grid's size, finite, with its folder's label
        assert images.shape == (4, 3, 32, 32) and torch.isfinite(images).all()
        assert labels.shape == (4,) and 0 <= labels.min() and labels.max() < classes
        seen += len(labels)
    feeder.close()
    assert seen == len(list(root.glob("*/*.JPEG")))


def test_gpu_decode_without_a_gpu_is_a_skipped_row(tiny_set):
    device = detect_device("cpu")
    outcome = measured_columns(CellTask(cell(input="loader_gpu_decode", loader_workers=1), device,
                                        PeakFlops(None, "not measured in this test"), None, data=discover(tiny_set)))
    assert outcome["status"] == "skipped" and "needs CUDA" in outcome["error_message"]


# ---------------------------------------------------------------- cells run by the runner (processes)


@pytest.mark.serial
def test_loader_cells_write_their_input_columns_and_a_corrupt_file_is_an_error_row(tmp_path, write_grid, tiny_set):
    from bench.run.grid_runner import RunOptions, run_grid

    grid = load_grid(write_grid(tiny_grid("input", pairs="[[4, 1], [2, 2]]") + """
        [profile.cpu.grid]
        input = ["synthetic", "loader"]
        loader_workers = [0, 1]
    """), "cpu")
    device = detect_device("cpu")
    rows = run_grid(grid, device, RunOptions(results_root=tmp_path / "results", data=discover(tiny_set)))
    assert len(rows) == 6 and {row["status"] for row in rows} == {"ok"}, [r["error_message"] for r in rows]
    # the synthetic cell's rate beside each loader row is derived when the file is read, never written back
    as_read = read_runs(tmp_path / "results" / "input" / device.tag / "runs.csv").set_index("cell_id")
    for row in rows:
        if row["input"] == "synthetic":
            assert row["input_wait_ms"] == "" and row["data_images"] == ""
            continue
        assert len(json.loads(row["input_wait_ms"])) == 2 and float(row["input_wait_median_ms"]) > 0
        synthetic = next(r for r in rows if r["input"] == "synthetic" and r["micro_batch"] == row["micro_batch"])
        # With a worker the step gave up a thread (2 cores here): not comparable, left empty.
        same_threads = row["cpu_threads"] == synthetic["cpu_threads"]
        assert row["synthetic_samples_per_s"] == ""
        derived = as_read.synthetic_samples_per_s[row["cell_id"]]
        assert derived == float(synthetic["samples_per_s"]) if same_threads else derived != derived  # NaN: not comparable
        assert row["data_set"] == TINY.name and row["data_seed"] == "1" and int(row["host_rss_main_bytes"]) > 0
        assert row["host_cpu_model"] and float(row["loader_cpu_ms_per_sample"]) > 0

    victim = corrupt_copy(tiny_set, tmp_path)
    rows = run_grid(grid, device, RunOptions(results_root=tmp_path / "corrupt", data=discover(tmp_path / "train"),
                                             force=True))
    failed = [row for row in rows if row["status"] != "ok"]
    assert failed and all(row["input"] == "loader" and row["error_type"] == "CorruptImageError"
                          and str(victim) in row["error_message"] for row in failed)
    assert all(row["status"] == "ok" for row in rows if row["input"] == "synthetic")  # the grid went on
    assert len(read_rows(tmp_path / "corrupt" / "input" / device.tag / "runs.csv")) == 6


def _cell_with_workers(root: str, workers: int, report) -> None:
    """A stand-in cell: a loader with workers, fed from until the cell is killed."""
    feeder = feeder_for(Path(root), workers=workers)
    feeder.micro_batch()
    report.send(feeder.worker_pids())
    while True:
        feeder.micro_batch()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.serial
def test_a_killed_cell_leaves_no_loader_workers(tiny_set):
    context = multiprocessing.get_context("fork")  # the cell forks its workers, as in the runner
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_cell_with_workers, args=(str(tiny_set), 2, sender))
    process.start()
    sender.close()
    pids = receiver.recv()
    assert len(pids) == 2
    os.kill(process.pid, signal.SIGKILL)
    process.join()
    deadline = time.monotonic() + 2.0  # DataLoader's own watchdog alone can take 5 s
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    survivors = [pid for pid in pids if _alive(pid)]
    for pid in survivors:  # this test's own leftovers
        os.kill(pid, signal.SIGKILL)
    assert not survivors


# ---------------------------------------------------------------- feeding a GPU (bench plan, bench cost)


def _loader_rows():
    import pandas as pd

    def row(input_: str, workers: int, ms: float | None, status: str = "ok", size: int = 32) -> dict:
        return {"status": status, "input": input_, "loader_workers": workers, "loader_cpu_ms_per_sample": ms,
                "host_cpu_model": "Test CPU", "image_size": size, "data_set": "imagenet_like-test"}

    return pd.DataFrame([row("loader", 1, 2.0), row("loader", 2, 3.0), row("loader", 2, 2.5),
                         row("loader", 2, 9.0, status="error"), row("synthetic", 0, None),
                         row("loader_gpu_decode", 2, 0.4), row("loader", 4, 4.0, size=224)])


def test_bench_cost_of_a_renamed_estimate_or_prediction_folder_looks_for_no_loader_rows_in_it(tmp_path):
    """Only the runner's files hold loader rows; an estimate's or a prediction's, whatever its folder is called, is
    not read as one (it used to be, unless the folder was named `predicted`: `bench cost` stopped on its columns)."""
    from bench.cost.feeding import load_loader_costs
    from bench.results.schema import ESTIMATE_COLUMNS, PREDICTED_COLUMNS

    folders = []
    for name, columns in (("my_predictions", PREDICTED_COLUMNS), ("my_estimates", ESTIMATE_COLUMNS)):
        folders.append(tmp_path / name)
        folders[-1].mkdir()
        (folders[-1] / "runs.csv").write_text(",".join(columns) + "\n")
    assert load_loader_costs(folders) == []


def test_the_loader_cost_comes_from_ok_cpu_decoding_loader_rows_per_image_size():
    from bench.cost.feeding import loader_cost_for, loader_costs

    costs = loader_costs(_loader_rows())
    small, large = sorted(costs, key=lambda c: c.image_size)
    assert (small.cpu_ms_per_sample, small.rows, small.workers, small.image_size) == (2.5, 3, (1, 2), 32)
    assert (large.cpu_ms_per_sample, large.rows) == (4.0, 1)
    assert loader_cost_for(costs, 224) == (large, "")
    cost, note = loader_cost_for([small], 224)
    assert cost is small and "measured at 32 px, used for 224 px" in note and "errs low" in note
    assert loader_cost_for([], 224) is None


def _plan_for(vcpus: int | None, costs: list) -> str:
    from bench.cost.catalog import Instance
    from bench.planner.ranking import PlanRequest, make_plan
    from bench.planner.render import plan_text
    from bench.cost.price import Assumptions, MeasuredRow

    row = MeasuredRow(dict(status="ok", cell_id="r", experiment="e", profile="cuda", model="resnet50", image_size=224,
                      micro_batch=128, accum_steps=1, precision="bf16", checkpointing="off", optimizer="adamw", device_type="cuda",
                      device_name="NVIDIA H200", samples_per_s=3000.0, mfu_pct=None, model_flops_per_sample=None,
                      peak_memory_bytes=2**34))
    h200 = Instance(provider="test", instance="h200x8", gpu="H200", gpu_count=8, gpu_memory_gb=141,
                    usd_per_hour=40.0, region="r", observed="2025-01", source="made up", vcpus=vcpus)
    loader_row = row.with_columns(cell_id="l", input="loader", samples_per_s=2000.0)
    plan = make_plan([row, loader_row], (h200,), PlanRequest(model="resnet50", effective_batch=1024), Assumptions())
    return plan_text(replace(plan, catalog="made-up catalog", loader_costs=tuple(costs),
                             loader_source="results/input_pipeline/test"), 5)


def test_plan_states_the_cores_to_feed_the_gpus_it_recommends():
    from bench.cost.feeding import LoaderCost

    cost = LoaderCost(2.5, 2.4, 2.6, 3, 224, "Test CPU", (2, 4, 8), "imagenet_like-test")
    text = _plan_for(96, [cost])
    # 3,000 samples/s x 2.5 ms = 7.5 cores per GPU, + 1 for the training process, x 8 GPUs = 68 vCPUs.
    assert "1 loader-input rows" in text  # left out of the ranking: their CPU cost sizes the feeding
    (feed,) = paragraphs(text, "feeding: ")
    assert "7.5 decoding cores per GPU" in feed and "68 vCPUs; it has 96" in feed and "Test CPU" in feed
    assert "CANNOT FEED" not in text
    starved = _plan_for(32, [cost])
    assert "CANNOT FEED" in starved and "it has 32: it CANNOT FEED its GPUs" in starved


def test_plan_says_so_when_no_loader_rows_exist():
    text = _plan_for(96, [])
    assert "no loader rows (input = loader) in results/input_pipeline/test" in text
    assert text.count("feeding:") == 1 and "are not estimated" in " ".join(text.split())  # once, not again below


def test_cost_lines_carry_the_feeding_columns_and_loader_rows_are_not_priced():
    from bench.cost.catalog import Instance
    from bench.cost.feeding import LoaderCost
    from bench.cost.outputs import markdown, record
    from bench.cost.price import Assumptions, MeasuredRow, Workload, price_rows

    row = MeasuredRow(dict(status="ok", cell_id="r", experiment="e", profile="cuda", model="m", image_size=224,
                      micro_batch=64, accum_steps=2, precision="bf16", checkpointing="off", optimizer="adamw", device_type="cuda",
                      device_name="NVIDIA L4", samples_per_s=400.0, mfu_pct=None, model_flops_per_sample=None,
                      peak_memory_bytes=2**33))
    g6 = Instance(provider="aws", instance="g6.xlarge", gpu="L4", gpu_count=1, gpu_memory_gb=24, usd_per_hour=0.8,
                  region="r", observed="2025-01", source="made up", vcpus=4)
    table = price_rows([row, row.with_columns(cell_id="l", input="loader")], (g6,), Workload(), Assumptions())
    assert [refusal.row.cell_id for refusal in table.refused] == ["l"]
    cost = LoaderCost(10.0, 10.0, 10.0, 1, 224, "Test CPU", (4,), "set")  # 400 samples/s x 10 ms = 4 cores
    (line,) = table.priced
    values = record(line, 1.0, [cost], strategy=table.strategy(line.row))
    assert (values["cores_to_feed_per_gpu"], values["vcpus_needed"], values["instance_vcpus"],
            values["vcpus_feed_gpus"]) == (4.0, 5, 4, False)
    assert "CANNOT FEED" in markdown(table, "t", "c", [cost])


# ---------------------------------------------------------------- the report


@pytest.mark.slow
def test_a_report_with_loader_rows_draws_synthetic_and_loader_side_by_side(tmp_path):
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_report import _row as report_row

    from bench.report import build_report

    folder = tmp_path / "input_pipeline" / "nvidia-h200"
    runs = RunsFile(folder / "runs.csv")
    for micro, accum in ((8, 1), (2, 4)):
        synthetic = report_row(micro, accum) | {"cpu_threads": 2}
        runs.write(synthetic)
        for workers, wait_ms in ((2, 40.0), (8, 1.0)):
            loader = synthetic | {
                "cell_id": f"{synthetic['cell_id']}-loader-{workers}", "input": "loader", "loader_workers": workers,
                "step_time_median_ms": synthetic["step_time_median_ms"] + wait_ms,
                "samples_per_s": synthetic["samples_per_s"] * 0.9, "synthetic_samples_per_s": synthetic["samples_per_s"],
                "input_wait_ms": json.dumps([wait_ms] * 3), "input_wait_median_ms": wait_ms,
                "input_wait_p90_ms": wait_ms * 1.2, "input_wait_pct": 10.0, "input_bound": wait_ms > 10,
                "loader_samples_per_s": 900.0, "loader_cpu_ms_per_sample": 2.5, "host_rss_main_bytes": 2**31,
                "host_rss_workers_bytes": 2**30, "pinned_peak_bytes": 2**26, "host_cpu_model": "Test CPU",
                "host_cpus": 16, "data_source": "generated", "data_set": "imagenet_like-test", "data_images": 1024,
                "data_bytes": 117_000_000, "data_seed": 0}
            runs.write(loader)
        runs.write(synthetic | {"cell_id": f"{synthetic['cell_id']}-gpu", "input": "loader_gpu_decode",
                                "loader_workers": 2, "status": "skipped", "error_type": "LoaderUnavailable"})
    written = {path.name for path in build_report(folder)}
    assert "input_pipeline.png" in written
    report = (folder / "REPORT.md").read_text()
    assert "## Input pipeline" in report and "imagenet_like-test (1,024 images" in report
    assert "Test CPU (16 cores)" in report and "![input_pipeline](input_pipeline.png)" in report
    table_lines = [line for line in report.splitlines() if line.startswith("| m ") and "| loader |" in line]
    assert len(table_lines) == 4 and any("| 10.0 |" in line for line in table_lines)  # 10 % lost to input


def test_the_gpu_decoding_path_gives_the_same_batches_run_on_the_cpu(tiny_set):
    # Workers only read the files; the training process decodes the micro-batch (nvjpeg on a GPU;
    # here the same calls on the CPU) and crops, flips and normalises it there.
    config = LoaderConfig(image_size=32, micro_batch=4, decode="gpu", channels_last=True)
    feeder = MicroBatchFeeder(make_loader(discover(tiny_set), config), CPU, channels_last=True, image_size=32,
                              gpu_decode=True)
    images, labels = feeder.micro_batch()
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32 and labels.dtype == torch.int64
    assert images.is_contiguous(memory_format=torch.channels_last) and -3 < float(images.mean()) < 3


def test_bench_data_make_prints_the_set_against_imagenets_figures(tmp_path, capsys):
    assert bench_main(["data", "make", "--images", "6", "--classes", "2", "--seed", "3",
                       "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    (root,) = tmp_path.glob("imagenet_like-v1-6img-2cls-seed3-*")
    assert f"{root}: 6 images" in out and "469.0" in out and "387.0" in out and "Ehrlich" in out
    assert bench_main(["data", "make", "--classes", "2000", "--cache-dir", str(tmp_path)]) == 2
