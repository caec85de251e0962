"""Shared helpers: grid files written on the fly, the `bench` command answered in this process."""

from __future__ import annotations

import csv
import itertools
import multiprocessing.process
import os
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch  # noqa: F401 - loaded before the tests: its first import runs ldconfig, a process the guard below refuses
from matplotlib import font_manager  # noqa: F401 - likewise: on a new install its first import builds the font cache with fc-list

REPO = Path(__file__).resolve().parent.parent
# Measured rows the tests own (tests/data/cpu_rows/README.md): no test depends on which machines' folders lie under
# results/, and a re-measurement changes no test but the one that checks the committed rows.
CPU_ROWS = REPO / "tests" / "data" / "cpu_rows" / "runs.csv"
CPU_TAG = "cpu-rows"  # the device folder tests copy CPU_ROWS under (results/<study>/<device>/runs.csv)


@pytest.fixture(scope="session", autouse=True)
def _the_suites_own_cache_folder(request, tmp_path_factory):
    """The suite's own cache folder (timm's names, traces, this machine's quiet CPU peaks), shared with every process
    a test starts: the user's cache answers no test, and no test writes into it. It lives in pytest's cache
    (`.pytest_cache/`, which git ignores), so the next run starts warm, as a developer's commands do; a fresh clone
    starts cold. Entries are keyed by what they depend on (bench.cache). A test about the cache sets its own."""
    saved = os.environ.get("BENCH_CACHE_DIR")
    cache = getattr(request.config, "cache", None)  # None under `-p no:cacheprovider`: this session's own then
    folder = cache.mkdir("bench-cache") if cache is not None else tmp_path_factory.mktemp("cache")
    os.environ["BENCH_CACHE_DIR"] = str(folder)
    yield
    if saved is None:
        os.environ.pop("BENCH_CACHE_DIR", None)
    else:
        os.environ["BENCH_CACHE_DIR"] = saved


@pytest.fixture(autouse=True)
def _processes_only_in_slow_tests(request, monkeypatch):
    """A test that starts a process (a cell, torchrun, the `bench` command) must be marked `serial` (or `slow`, where
    it starts one only on a cold cache), so that `make test-fast` leaves it out: unmarked, it fails here instead of
    running slowly."""
    if request.node.get_closest_marker("slow"):
        return

    def refuse(*args, **kwargs):
        raise AssertionError("this test starts a process: mark it @pytest.mark.slow")

    class GitOnly(subprocess.Popen):  # git (provenance) is a quick read; interpreters and torchrun are not
        def __init__(self, args, *rest, **kwargs):
            program = args[0] if isinstance(args, (list, tuple)) else str(args).split()[0]
            if Path(str(program)).name != "git":
                refuse()
            super().__init__(args, *rest, **kwargs)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    monkeypatch.setattr(subprocess, "Popen", GitOnly)


@pytest.fixture
def write_grid(tmp_path):
    """Write a grid file from TOML text; returns its path."""
    def write(text: str, name: str = "grid.toml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path
    return write


def bench_in_process(capfd, *args: str) -> subprocess.CompletedProcess:
    """`bench ARGS` through `bench.cli.main` in this process, answered as `subprocess.run` answers: for a test about
    what the command does, not about a fresh interpreter (which costs 3-5 s of importing torch, and a `bench run` as
    much again to start its cells' fork server; here the session's server, once started, forks every test's cells).
    The signal handlers `bench run` installs are put back. The server keeps the environment of the test that started
    it: a test that sets a variable around the command starts the server first (`bench.run.start_cell_server`)."""
    from bench.cli import main

    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = main(list(args))
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(["bench", *args], code, out, err)


def measured_columns(task) -> dict:
    """The measured columns of `task`'s cell (a `bench.run.cell_measurement.CellTask`), measured in this process and
    built as the runner builds them from what a cell's process sends back."""
    from bench.results.rows import one_process_columns
    from bench.run.cell_measurement import measured_outcome

    outcome = measured_outcome(task)
    return outcome if isinstance(outcome, dict) else one_process_columns(outcome, task.cell, task.flops, task.peak)


def paragraphs(text: str, prefix: str) -> list[str]:
    """The lines of console `text` that start with `prefix`, each joined with its wrapped continuation lines (those
    indented four more spaces), as one line: what `bench plan` wraps at 120 characters reads back whole."""
    lines, found = text.splitlines(), []
    for index, line in enumerate(lines):
        if line.startswith(prefix):
            rest = itertools.takewhile(lambda more: more.startswith(" " * 4), lines[index + 1:])
            found.append(" ".join([line, *(more.strip() for more in rest)]))
    return found


def read_rows(path: Path) -> list[dict]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def tiny_grid(name: str, *, model: str = "test_vit", image_size: int = 32, effective_batch: int = 4,
              pairs: str = "[[4, 1], [2, 2]]", extra_run: str = "") -> str:
    return f"""
        [experiment]
        name = "{name}"

        [grid]
        model = ["{model}"]
        image_size = [{image_size}]
        effective_batch = {effective_batch}
        pairs = {pairs}
        precision = ["fp32"]
        optimizer = ["sgd"]

        [run]
        warmup_steps = 1
        measured_steps = 2
        timeout_s = 120
        adaptive_timing = false
        quiet_wait_s = 0
        {extra_run}
    """


def pytest_collection_modifyitems(config, items):
    """A test is `slow` by its own `@pytest.mark.slow` (or its module's `pytestmark`); a doctest, which takes no
    decorator, by a `# slow` comment on one of its examples. A `serial` test is slow too."""
    for item in items:
        if isinstance(item, pytest.DoctestItem) and any("# slow" in example.source for example in item.dtest.examples):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("serial"):
            item.add_marker(pytest.mark.slow)
