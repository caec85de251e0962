"""The fault suite, concurrency, in this process: what a runner killed mid-append, a reader racing a writer and
a second runner on the same results root leave behind.

- A runner killed at a random byte of an append (what SIGKILL or a power cut leaves: a last line without its
  newline): every reader reads the rows before it and leaves the file byte-identical; the rerun sets the bytes
  aside and writes the row once.
- A reader while a writer appends and replaces rows: never a half row, never a row lost or doubled.
- A second `bench run` (of this grid or another) under a root whose lock is held: exit 2, one line naming the
  holder, as text and as JSON, nothing written.
- Lock files left by a runner that is gone, or spoilt: taken over; the lock is gone after the block however
  it ends.

The real-process cases (SIGTERM and SIGINT at random moments, `cost` while `run` appends, two grids under one
root) are slow-marked in tests/test_faults_cli.py; the SIGKILL ones in tests/test_faults.py.
"""

from __future__ import annotations

import os
import random
import threading
from pathlib import Path

import pytest
from conftest import REPO, read_rows
import test_faults_cli
from test_faults_cli import ROWS, refused

from bench.grid.spec import load_grid
from bench.results.lock import LOCK_NAME, FolderLocked, runner_lock
from bench.results.read import read_runs
from bench.results.store import RunsFile

work = test_faults_cli.work  # the fixture: an empty working folder beside committed rows

TORN_CASES = 50
RACE_SEEDS = 30


def _lines() -> list[bytes]:
    return ROWS.read_bytes().splitlines(keepends=True)


@pytest.mark.parametrize("seed", range(TORN_CASES))
def test_a_runner_killed_mid_append_loses_no_row_and_the_rerun_writes_it_once(seed, tmp_path, capsys):
    lines = _lines()
    chance = random.Random(seed)
    last = lines[-1]
    cut = chance.randrange(1, len(last) - 1)  # at least one byte written, the newline not
    runs = tmp_path / "runs.csv"
    runs.write_bytes(b"".join(lines[:-1]) + last[:cut])
    before = runs.read_bytes()
    assert len(read_runs(runs)) == len(lines) - 2  # header and the torn line left out
    assert len(RunsFile(runs).rows()) == len(lines) - 2
    assert runs.read_bytes() == before  # readers write nothing
    row = read_rows(ROWS)[-1]
    RunsFile(runs).write(row)  # the rerun of the cell that was cut off
    ids = [r["cell_id"] for r in read_rows(runs)]
    assert ids == [r["cell_id"] for r in read_rows(ROWS)] and len(set(ids)) == len(ids)
    (side,) = tmp_path.glob("runs.csv.torn-*")
    assert side.read_bytes() == last[:cut] and runs.read_bytes().endswith(b"\n")
    assert "interrupted write" in capsys.readouterr().err


# ~2 s a seed on two shared cores: the first two run in `make test-fast`, every seed in `make test`.
@pytest.mark.parametrize("seed", [seed if seed < 2 else pytest.param(seed, marks=pytest.mark.slow)
                                  for seed in range(RACE_SEEDS)])
def test_a_reader_racing_a_writer_never_sees_a_half_row_or_a_row_twice(seed, tmp_path):
    """Appends, and rows of cells written again (appended too: readers take a cell's last row), in random order,
    read all the while."""
    chance = random.Random(seed)
    template = read_rows(ROWS)
    runs = RunsFile(tmp_path / "runs.csv")
    plan = [f"cell-{chance.randrange(12)}" for _ in range(20)]  # repeats replace their row
    done = threading.Event()
    failures: list[BaseException] = []

    def write() -> None:
        try:
            for index, cell in enumerate(plan):
                runs.write({**template[index % len(template)], "cell_id": cell})
        except BaseException as exc:  # noqa: BLE001 - reported by the reader's thread
            failures.append(exc)
        finally:
            done.set()

    writer = threading.Thread(target=write)
    writer.start()
    counts = []
    while not done.is_set():
        if runs.path.exists():
            raw = [row["cell_id"] for row in read_rows(runs.path)]
            assert all(raw), raw  # no half row, even between two appends
            ids = list(read_runs(runs.path)["cell_id"])  # the checked reader raises on a torn or half row
            assert len(ids) == len(set(ids)), ids
            counts.append(len(ids))
    writer.join()
    assert not failures, failures
    assert counts == sorted(counts)  # a replaced row never vanishes, even for a moment
    assert sorted(read_runs(runs.path)["cell_id"]) == sorted(set(plan))


def _grids() -> list[Path]:
    """Every committed grid a CPU runs with synthetic input (a loader grid makes its data set before the lock)."""
    found = []
    for path in sorted((REPO / "experiments").rglob("*.toml")):
        grid = load_grid(path, "cpu")
        if all(cell.input == "synthetic" for cell in grid.cells):
            found.append(path)
    return found


GRIDS = _grids()
ROOTS = ["plain", "relative", "trailing slash", "dot-dot", "symlink"]


def _root_as(work: Path, how: str) -> str:
    root = work / "results"
    if how == "relative":
        return os.path.relpath(root)
    if how == "trailing slash":
        return str(root) + "/"
    if how == "dot-dot":
        return str(root / "resnet50" / "..")
    if how == "symlink":
        (work / "linked").symlink_to(root)
        return str(work / "linked")
    return str(root)


@pytest.mark.parametrize("how", ROOTS)
def test_a_second_runner_on_the_same_root_however_spelt_is_refused(how, work, capsys):
    with runner_lock(work / "results"):
        refused(["run", str(REPO / "experiments" / "smoke.toml"), "--results", _root_as(work, how)], work, capsys,
                names=f"pid {os.getpid()}")


@pytest.mark.parametrize("grid", GRIDS, ids=[str(p.relative_to(REPO / "experiments")) for p in GRIDS])
def test_a_run_of_another_grid_under_a_held_root_is_refused_before_any_cell(grid, work, capsys):
    with runner_lock(work / "results"):
        refused(["run", str(grid), "--results", str(work / "results")], work, capsys, names="another `bench run`")


STALE = {"a dead pid": b'{"pid": 999999999, "host": "%s", "started_utc": "2026-01-01T00:00:00+00:00"}',
         "garbage": b"\xff\xfe not json", "empty": b"", "a JSON list": b"[1, 2]", "a pid of text": b'{"pid": "x"}',
         "another host's pid": b'{"pid": 1, "host": "elsewhere"}', "a negative pid": b'{"pid": -5}',
         "a huge pid": b'{"pid": 99999999999999999999999}', "a NUL byte": b"\x00"}


@pytest.mark.parametrize("content", STALE, ids=list(STALE))
def test_a_lock_file_without_a_live_holder_is_taken_over_and_removed_after(content, tmp_path, capsys):
    import socket

    lock = tmp_path / LOCK_NAME
    lock.write_bytes(STALE[content].replace(b"%s", socket.gethostname().encode()))
    with runner_lock(tmp_path):
        assert lock.exists()
        with pytest.raises(FolderLocked):  # held now, by this block
            with runner_lock(tmp_path):
                pass
    assert not lock.exists()
    err = capsys.readouterr().err
    assert "taking over" in err or content != "a dead pid", err
    assert "Traceback" not in err


@pytest.mark.parametrize("ending", [KeyboardInterrupt, SystemExit, RuntimeError, MemoryError, GeneratorExit])
def test_the_lock_is_gone_however_the_runner_ends(ending, tmp_path):
    with pytest.raises(ending), runner_lock(tmp_path):
        raise ending()
    assert not (tmp_path / LOCK_NAME).exists()
    with runner_lock(tmp_path):  # and the next runner takes the root at once
        pass


def test_the_concurrency_family_has_at_least_100_cases():
    counts = TORN_CASES + RACE_SEEDS + len(ROOTS) + len(GRIDS) + len(STALE) + 5
    assert counts >= 100, counts


def test_a_torn_line_is_set_aside_once_even_when_two_writers_find_it(tmp_path):
    """Two writers of one file (two grids of the same name would be refused by the lock; the API can): the torn
    bytes are kept once, every row once."""
    lines = _lines()
    runs = tmp_path / "runs.csv"
    runs.write_bytes(b"".join(lines[:-1]) + lines[-1][:10])
    rows = read_rows(ROWS)
    first, second = RunsFile(runs), RunsFile(runs)
    first.write(rows[-1])
    second.write({**rows[0], "cell_id": "another-cell"})
    assert len(list(tmp_path.glob("runs.csv.torn-*"))) == 1
    ids = [r["cell_id"] for r in read_rows(runs)]
    assert len(ids) == len(set(ids)) == len(lines)
