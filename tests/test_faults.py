"""The fault suite: hostile and unlucky input, and what the harness does with it.

Every bad input is one line and exit 2, with nothing written anywhere; a full or read-only disk
loses no row silently; readers never change a runs file; one runner per results folder; a name
cannot leave the results root; a grid killed at random points loses and doubles no row.
docs/reliability.md states the figures these tests check.
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import CPU_ROWS, REPO, bench_in_process, read_rows

import bench.results.store as store
from bench.cli import main
from bench.errors import ResultsFileError
from bench.grid.spec import load_grid
from bench.measure.device import detect_device
from bench.results.lock import LOCK_NAME, runner_lock
from bench.results.read import read_runs
from bench.results.store import RowNotWritten, RunsFile, preflight, results_folder

SMOKE = (REPO / "experiments" / "smoke.toml").read_text()


# --- malformed grid files ----------------------------------------------------------------------

def _set(key: str, value: str) -> str:
    """The smoke grid with the line `key = ...` replaced by `key = value` (a [run] key it leaves unset: added)."""
    text, count = re.subn(rf"(?m)^{key} = .*$", lambda _: f"{key} = {value}", SMOKE)
    if count == 0 and key in RUN_KEYS_UNSET_IN_SMOKE:
        text, count = SMOKE.replace("[run]\n", f"[run]\n{key} = {value}\n", 1), 1
    assert count == 1, key
    return text


RUN_KEYS_UNSET_IN_SMOKE = ("target_ci95_rel", "timing_budget_s", "threads")


def _drop(key: str) -> str:
    return re.sub(rf"(?m)^{key} = .*\n", "", SMOKE)


def _rename(key: str, typo: str) -> str:
    return re.sub(rf"(?m)^{key} = ", f"{typo} = ", SMOKE)


def _add(section: str, line: str) -> str:
    return SMOKE.replace(f"[{section}]\n", f"[{section}]\n{line}\n", 1)


BAD_VALUES = {
    "grid.image_size": ['["32"]', "[32.0]", "[true]", "[0]", "[-1]", "[100000000]", "[]", "[[32]]",
                        "9223372036854775807", "[32, 32]", '"32"'],
    "grid.effective_batch": ['"8"', "8.0", "true", "0", "-8", "1000000000", "[8]"],
    "grid.pairs": ['[[8, "1"]]', "[[8.0, 1]]", "[[8, 1, 1]]", "[[3, 1]]", "[[8, 1], [8, 1]]", "[]", "[[0, 8]]",
                   "[[8, true]]", '"8x1"', "[[16, 4096]]"],
    "grid.precision": ['["fp64"]', "[32]", "[]", '["FP32"]'],
    "grid.checkpointing": ['["last-0"]', '["some"]', "[1]", '["last-x"]'],
    "grid.optimizer": ['["adam"]', "[true]", '["sgd", "sgd"]'],
    "grid.channels_last": ['["yes"]', "[1]", '["false"]', "[false, false]"],
    "grid.model": ["[1]", "[]", '["not_a_timm_model_xyz"]', '["test_vit", "test_vit"]', '["resnet-50"]'],
    "run.warmup_steps": ["0", '"1"', "1.5", "true", "100000"],
    "run.measured_steps": ["0", "-1", '"5"', "1000000"],
    "run.timeout_s": ["inf", "nan", "-1", "0", '"120"', "true", "1e9", "-inf"],
    "run.target_ci95_rel": ["0", "-0.05", "1.5", "nan", '"5%"'],
    "run.timing_budget_s": ["0", "-1", "inf", "1e9", '"60"'],
    "run.adaptive_timing": ['"yes"', "1", "[true]"],
    "run.threads": ["0", "-2", "1.5", '"2"', "100000"],
    "run.quiet_wait_s": ["-1", "nan", "inf", '"120"', "1e9"],
    "experiment.name": ['".."', '"."', '"a/b"', '"a\\\\b"', f'"{"a" * 300}"', '""', '"-x"', '".hidden"', '"a b"',
                        "1", '"../../etc"', '"smoke\\u0000"'],
}
EXTRA_AXES = {
    "grid.world_size": ["[0]", "[2000]", '["2"]'],
    "grid.trace_steps": ["[0]", "[1000]"],
    "grid.loader_workers": ["[-1]", "[1000]"],
    "grid.allocator": ['["x"]'],
    "grid.compile": ["[true]"],
    "grid.input": ['["disk"]'],
    "grid.ddp_sync": ['["sometimes"]'],
    "grid.loss_tracking": ['["float"]'],
    "grid.zero_grad": ['["ones"]'],
    "grid.aux_loss": ['["on"]'],
    "grid.attention": ['["flash"]'],
    "grid.model_kwargs": ['["[1]"]'],
    "grid.in_chans": ["[0]"],
    "grid.image_width": ["[-1]"],
    "grid.num_classes": ["[0]"],
    "run.seed": ["-1", "1099511627776", '"0"'],
}
TYPOS = {"grid.model": "modle", "grid.image_size": "image_sise", "grid.precision": "precison",
         "grid.effective_batch": "effective_bach", "grid.pairs": "pars", "experiment.name": "nmae",
         "run.warmup_steps": "warmup_step", "grid.optimizer": "optimiser"}
REQUIRED = ("grid.model", "grid.image_size", "grid.precision", "grid.effective_batch", "grid.pairs", "experiment.name")


def _grid_cases() -> list[tuple[str, bytes | None, str | None]]:
    """(case id, file bytes (None: a directory), the key the message must name (None: the file only))."""
    cases: list[tuple[str, bytes | None, str | None]] = []
    for dotted, values in BAD_VALUES.items():
        key = dotted.split(".")[1]
        cases += [(f"{dotted}={value[:20]}", _set(key, value).encode(), dotted) for value in values]
    for dotted, values in EXTRA_AXES.items():
        section, key = dotted.split(".")
        cases += [(f"{dotted}={value}", _add(section, f"{key} = {value}").encode(), dotted) for value in values]
    for dotted, typo in TYPOS.items():
        section, key = dotted.split(".")
        cases.append((f"typo {typo}", _rename(key, typo).encode(), f"{section}.{typo}"))
    cases += [(f"missing {dotted}", _drop(dotted.split(".")[1]).encode(), dotted) for dotted in REQUIRED]
    cases += [
        ("unknown grid key", _add("grid", 'colour = ["red"]').encode(), "grid.colour"),
        ("unknown run key", _add("run", "speed = 1").encode(), "run.speed"),
        ("unknown experiment key", _add("experiment", 'owner = "me"').encode(), "experiment.owner"),
        ("unknown section", (SMOKE + "\n[extras]\nx = 1\n").encode(), "extras"),
        ("top-level key", ("x = 1\n" + SMOKE).encode(), "x"),
        ("typo section", SMOKE.replace("[grid]", "[grdi]").encode(), "grdi"),
        ("no experiment", SMOKE.replace("[experiment]\n", "[other]\n").encode(), "other"),
        ("unknown profile", (SMOKE + "\n[profile.gpu.grid]\nimage_size = [16]\n").encode(), "profile.gpu"),
        ("profile bad value", (SMOKE + '\n[profile.cpu.grid]\nimage_size = ["x"]\n').encode(),
         "profile.cpu.grid.image_size"),
        ("profile bad run", (SMOKE + "\n[profile.cpu.run]\ntimeout_s = -1\n").encode(), "profile.cpu.run.timeout_s"),
        ("profile unknown key", (SMOKE + "\n[profile.cpu]\nextra = 1\n").encode(), "profile.cpu.extra"),
        ("profile inf", (SMOKE + "\n[profile.cpu.run]\ntimeout_s = inf\n").encode(), "profile.cpu.run.timeout_s"),
        ("exclude bad value", _add("grid", "exclude = [{ image_size = \"x\" }]").encode(), "grid.exclude"),
        ("exclude unknown key", _add("grid", 'exclude = [{ colour = "red" }]').encode(), "grid.exclude"),
        ("exclude not a list", _add("grid", 'exclude = "x"').encode(), "grid.exclude"),
        ("exclude everything", _add("grid", 'exclude = [{ precision = "fp32" }]').encode(), "grid.exclude"),
        ("too many cells", _set("image_size", str(list(range(1, 4000)))).encode(), "grid"),
        ("invalid TOML", b"[grid\nmodel = 1\n", None),
        ("unfinished value", b"[experiment]\nname = \n", None),
        ("duplicate TOML key", (SMOKE + '\n[experiment]\nname = "x"\n').encode(), None),
        ("invalid UTF-8", b"\xff\xfe[experiment]\n", None),
        ("UTF-8 cut mid-character", SMOKE.encode() + "# caf\u00e9".encode()[:-1], None),
        ("NUL bytes", b"\x00" * 64, None),
        ("empty file", b"", "experiment"),
        ("deep nesting", b"a = " + b"[" * 100_000 + b"]" * 100_000 + b"\n", None),
        ("deep tables", b"a = " + b"{b = " * 5_000 + b"1" + b"}" * 5_000 + b"\n", None),
        ("a directory", None, None),
    ]
    return cases


GRID_CASES = _grid_cases()


def test_every_key_a_grid_file_may_set_has_a_malformed_case():
    """Each axis a user can list under [grid], each [run] setting and each required key is refused by
    at least one case above (by name), so a validation lost on any of them fails here."""
    from bench.grid.cell import axes
    from bench.grid.spec import RunSettings

    named = {key for _, _, key in GRID_CASES if key}
    settable = ({f"grid.{name}" for name in axes()} | {f"run.{name}" for name in RunSettings.model_fields} | set(REQUIRED)
                | {"grid.effective_batch", "grid.pairs", "grid.exclude", "experiment.name"})
    assert not settable - named, sorted(settable - named)


@pytest.fixture
def keep_sigterm():
    """`bench run` installs a SIGTERM handler; the test process gets its own back."""
    handler = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, handler)


@pytest.mark.parametrize("case", GRID_CASES, ids=[case[0] for case in GRID_CASES])
def test_a_malformed_grid_file_is_one_line_exit_2_and_nothing_written(case, tmp_path, monkeypatch, capsys,
                                                                      keep_sigterm):
    name, content, key = case
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    path = tmp_path / "grid.toml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    results = tmp_path / "results"
    began = time.monotonic()
    code = main(["run", str(path), "--results", str(results), "--device", "cpu"])
    spent = time.monotonic() - began
    captured = capsys.readouterr()
    message = captured.err.strip()
    assert code == 2, (name, captured.out, message)
    assert "\n" not in message and "Traceback" not in message, message
    assert str(path) in message, message
    if key is not None:
        assert key in message, message
    assert not results.exists() and not any(work.iterdir())  # nothing written anywhere
    # refused before any cell or model is built (about 5 s for the 4,000-size case on 2 quiet cores); a hang guard,
    # not a speed target: a loaded machine must not fail it
    assert spent < 60, f"{name}: {spent:.1f} s"


def test_a_typo_is_reported_as_unknown_with_its_close_match(write_grid):
    with pytest.raises(Exception, match=r"grid\.modle: unknown key; did you mean model\?"):
        load_grid(write_grid(_rename("model", "modle")), "cpu")


def test_a_huge_grid_is_refused_before_it_is_expanded_unless_allowed(write_grid):
    axes = ("pairs = [[8, 1], [2, 4], [4, 2], [1, 8]]\noptimizer = [\"sgd\", \"adamw\"]\n"
            "checkpointing = [\"off\", \"full\"]\nloss_tracking = [\"detached\", \"item\", \"live_tensor\"]\n"
            "zero_grad = [\"none\", \"zeros\"]\naux_loss = [\"off\", \"attached\", \"detached\"]\n")
    text = _set("image_size", str(list(range(1, 1001))))
    text = re.sub(r"(?m)^(pairs|optimizer|checkpointing) = .*\n", "", text).replace("[run]", axes + "\n[run]")
    path = write_grid(text)
    began = time.monotonic()
    with pytest.raises(Exception, match=r"576,000 cells .* over the limit of 10,000"):
        load_grid(path, "cpu")
    assert time.monotonic() - began < 1.0
    small = write_grid(_set("image_size", "[16, 32]"), "small.toml")
    assert len(load_grid(small, "cpu", max_cells=8).cells) == 8


def test_every_shipped_grid_still_loads():
    for path in sorted((REPO / "experiments").rglob("*.toml")):
        for profile in ("cpu", "cuda"):
            assert load_grid(path, profile, check_models=False).cells


# --- bad command-line input --------------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["cost", str(CPU_ROWS.parent), "--epochs", "nan"],
    ["cost", str(CPU_ROWS.parent), "--epochs", "inf"],
    ["cost", str(CPU_ROWS.parent), "--headroom", "-inf"],
    ["plan", str(CPU_ROWS.parent), "--model", "resnet50", "--effective-batch", "x"],
    ["run", "experiments/smoke.toml", "--timeout-s", "nan"],
    ["run", "experiments/smoke.toml", "--memory-limit-gib", "inf"],
    ["probe", "test_resnet", "--memory-gib", "nan"],
    ["probe", "test_resnet", "--memory-limit-gib", "-1"],
], ids=lambda argv: " ".join(argv[:1] + argv[-2:]))
def test_a_bad_number_on_the_command_line_is_one_line_exit_2(argv, capsys):
    assert main(argv) == 2
    message = capsys.readouterr().err.strip()
    assert "\n" not in message and argv[-2] in message, message


def test_a_results_root_that_is_a_file_is_one_line_before_anything_runs(tmp_path, capsys, keep_sigterm):
    root = tmp_path / "results"
    root.write_text("not a folder")
    assert main(["run", "experiments/smoke.toml", "--results", str(root), "--device", "cpu"]) == 2
    message = capsys.readouterr().err.strip()
    assert str(root) in message and "\n" not in message
    assert root.read_text() == "not a folder"


# --- catalogs ----------------------------------------------------------------------------------

CATALOG = (REPO / "bench" / "data" / "instances.csv").read_text().splitlines()


@pytest.mark.parametrize("column,value", [("usd_per_hour", "inf"), ("usd_per_hour", "nan"), ("observed", "2024-02-31"),
                                          ("observed", "2999-01"), ("spot_usd_per_hour", "-inf"),
                                          ("gpu_count", "1.5")])
def test_a_catalog_value_out_of_bounds_is_one_line_naming_row_and_column(column, value, tmp_path, capsys):
    header = CATALOG[0].split(",")
    fields = CATALOG[1].split(",")
    fields[header.index(column)] = value
    path = tmp_path / "catalog.csv"
    path.write_text("\n".join([CATALOG[0], ",".join(fields)]) + "\n")
    assert main(["catalog", "--catalog", str(path)]) == 2
    message = capsys.readouterr().err.strip()
    assert "\n" not in message and str(path) in message and f"column {column}" in message, message


# --- corrupted runs files, every command -------------------------------------------------------

def _corruptions(header: list[str], line: str) -> dict[str, bytes]:
    """Eleven ways a runs file goes bad, each the committed file plus one bad line (or a bad header)."""
    fields = line.split(",")

    def with_field(column: str, value: str) -> str:
        row = list(fields)
        row[header.index(column)] = value
        return ",".join(row)
    head = ",".join(header)
    return {
        "garbage line": "x,y,z",
        "unclosed quote": line + '\n"' + line,
        "text in a whole-number column": with_field("micro_batch", "eight"),
        "fraction in a whole-number column": with_field("micro_batch", "8.5"),
        "unknown status": with_field("status", "fine"),
        "bad cell id": with_field("cell_id", "../../etc"),
        "bad boolean": with_field("channels_last", "yes"),
        "bad number": with_field("duration_s", "fast"),
        "extra field": line + ",surplus",
        "missing field": ",".join(fields[:-3]),
        "unknown column": head.replace("cell_id", "cell_id_v2", 1),
    }


def _corrupt_folder(tmp_path: Path, corruption: str) -> tuple[Path, Path]:
    """A results root holding measured rows (the tests' own) as claims_leak rows under this machine's device tag,
    with one corruption; returns (root, runs file)."""
    text = CPU_ROWS.read_text()
    lines = text.splitlines()
    bad = _corruptions(lines[0].split(","), lines[1])[corruption]
    corrupted = (bad + "\n" + "\n".join(lines[1:]) + "\n") if corruption == "unknown column" else text + bad + "\n"
    root = tmp_path / "results"
    runs = root / "claims_leak" / detect_device("cpu").tag / "runs.csv"
    runs.parent.mkdir(parents=True)
    runs.write_text(corrupted)
    return root, runs


CORRUPTIONS = list(_corruptions(["cell_id", "micro_batch", "status", "channels_last", "duration_s"],
                                "a,1,ok,false,1.0"))
COMMANDS = {
    "report": lambda root, folder: ["report", str(folder)],
    "cost": lambda root, folder: ["cost", str(folder), "--allow-cpu-projection"],
    "plan": lambda root, folder: ["plan", str(folder), "--model", "resnet50", "--effective-batch", "256",
                                  "--allow-cpu-projection"],
    "claims": lambda root, folder: ["claims", "--results", str(root)],
    "run": lambda root, folder: ["run", "experiments/claims/leak.toml", "--results", str(root),
                                 "--device", "cpu"],
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_a_corrupt_runs_file_is_one_line_naming_file_and_line_in_every_command(corruption, command, tmp_path,
                                                                               monkeypatch, capsys, keep_sigterm):
    monkeypatch.chdir(REPO)
    root, runs = _corrupt_folder(tmp_path, corruption)
    before = runs.read_bytes()
    code = main(COMMANDS[command](root, runs.parent))
    message = capsys.readouterr().err.strip().splitlines()
    assert code == 2, (corruption, command, message)
    assert len(message) == 1 and str(runs) in message[0] and "Traceback" not in message[0], message
    assert "line " in message[0] or "column" in message[0], message
    assert runs.read_bytes() == before  # never modified, not even by `run`


def test_estimate_refuses_a_corrupt_estimate_file_before_estimating(tmp_path, capsys):
    runs = tmp_path / "smoke" / "estimate" / "runs.csv"
    runs.parent.mkdir(parents=True)
    runs.write_text("cell_id,status\nx,y,z\n")
    assert main(["estimate", "experiments/smoke.toml", "--profile", "cpu", "--results", str(tmp_path)]) == 2
    message = capsys.readouterr().err.strip()
    assert "line 2" in message and "\n" not in message


def test_run_says_how_to_set_bad_lines_aside(tmp_path):
    root, runs = _corrupt_folder(tmp_path, "garbage line")
    with pytest.raises(ResultsFileError, match="move that line into a side file"):
        RunsFile(runs).rows()


# --- readers read, only run repairs --------------------------------------------------------------

@pytest.mark.slow
def test_readers_leave_a_torn_last_line_and_only_the_writer_sets_it_aside(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    root, runs = _corrupt_folder(tmp_path, "garbage line")
    lines = runs.read_text().splitlines()
    runs.write_text("\n".join(lines[:-1]) + "\n" + lines[-2][:40])  # the last append cut short
    torn = runs.read_bytes()
    rows = read_runs(runs)
    assert len(rows) == len(lines) - 2 and "incomplete" in capsys.readouterr().err
    for argv in (["report", str(runs.parent)], ["cost", str(runs.parent), "--allow-cpu-projection"]):
        main(argv)
        assert runs.read_bytes() == torn
    note = RunsFile(runs).repair_torn_tail()
    assert "moved to" in note
    (side,) = runs.parent.glob("runs.csv.torn-*")
    assert side.read_text() == lines[-2][:40] and runs.read_bytes() == torn[: -40]


# --- writes that check their result --------------------------------------------------------------

ROW = {"cell_id": "smoke-a-1", "status": "ok", "samples_per_s": 1.5}
SCHEMA = {"cell_id": "", "status": "", "samples_per_s": ""}


@pytest.mark.parametrize("failure", ["short write then ENOSPC", "ENOSPC", "EROFS", "EACCES", "write of 0 bytes"])
def test_a_refused_write_leaves_the_file_as_it_was_and_carries_the_row(failure, tmp_path, monkeypatch):
    runs = RunsFile(tmp_path / "runs.csv", SCHEMA)
    runs.write({**ROW, "cell_id": "smoke-first-1"})
    before = runs.path.read_bytes()
    real_write = os.write

    def refusing(fd, data):
        if failure == "short write then ENOSPC" and len(data) > 4:
            return real_write(fd, bytes(data[: len(data) // 2]))
        if failure == "write of 0 bytes":
            return 0
        code = {"EROFS": errno.EROFS, "EACCES": errno.EACCES}.get(failure, errno.ENOSPC)
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(store.os, "write", refusing)
    with pytest.raises(RowNotWritten) as raised:
        runs.write(ROW)
    monkeypatch.undo()
    assert runs.path.read_bytes() == before  # no torn line, no half row
    assert "smoke-a-1" in raised.value.row_text and "\n" not in str(raised.value)
    assert [p.name for p in tmp_path.iterdir()] == ["runs.csv"]  # no temporary left behind


def test_the_runner_prints_a_row_it_could_not_write(tmp_path, monkeypatch, capsys):
    from bench.run.grid_runner import write_or_show

    runs = RunsFile(tmp_path / "runs.csv", SCHEMA)
    monkeypatch.setattr(store.os, "write", lambda fd, data: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    with pytest.raises(RowNotWritten):
        write_or_show(runs, ROW)
    assert "smoke-a-1,ok,1.5" in capsys.readouterr().out


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES, errno.ENOSPC])
def test_preflight_fails_a_folder_that_cannot_take_rows(code, tmp_path, monkeypatch):
    def refusing(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(store.os, "open", refusing)
    with pytest.raises(ResultsFileError, match="cannot take rows.*nothing was measured"):
        preflight(tmp_path / "smoke" / "cpu")


def test_a_cells_new_row_is_appended_and_read_in_place_of_the_old(tmp_path, monkeypatch):
    """`--force` and `--retry-failed` never overwrite a measurement: the file only grows, and every reader
    takes the cell's last row. Only creating the file goes through a temporary file (of this process's own)."""
    names = []
    real = store.tempfile.mkstemp

    def spy(*args, **kwargs):
        fd, name = real(*args, **kwargs)
        names.append(name)
        return fd, name

    monkeypatch.setattr(store.tempfile, "mkstemp", spy)
    runs = RunsFile(tmp_path / "runs.csv", SCHEMA, history=True)  # as the runner's schema is by default
    runs.write(ROW)
    first = runs.path.read_bytes()
    runs.write({**ROW, "samples_per_s": 2.0})  # the same cell again
    assert runs.path.read_bytes().startswith(first) and len(runs.path.read_bytes()) > len(first)
    assert len(names) == 1 and Path(names[0]).parent == tmp_path
    assert [row["samples_per_s"] for row in runs.rows()] == ["2.0"]
    computed = RunsFile(tmp_path / "estimates.csv", SCHEMA)  # computed rows (estimates): replaced in place
    computed.write(ROW)
    computed.write({**ROW, "samples_per_s": 2.0})
    assert computed.path.read_text().count("smoke-a-1") == 1 and len(names) == 3


# --- names that try to leave the root -------------------------------------------------------------

@pytest.mark.parametrize("name", ["..", ".", "../outside", "a/b", "", "x" * 101, "/etc"])
def test_a_name_cannot_leave_the_results_root(name, tmp_path):
    with pytest.raises(ResultsFileError):
        results_folder(tmp_path, name, "cpu-x")


def test_a_symlink_out_of_the_root_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "smoke").symlink_to(outside)
    with pytest.raises(ResultsFileError, match="resolves outside"):
        results_folder(tmp_path / "results", "smoke", "cpu-x")


# --- one runner per results folder ----------------------------------------------------------------

def test_a_second_runner_exits_2_naming_the_holder(tmp_path, capsys, keep_sigterm):
    with runner_lock(tmp_path):
        assert main(["run", "experiments/smoke.toml", "--results", str(tmp_path), "--device", "cpu"]) == 2
    message = capsys.readouterr().err.strip()
    assert f"pid {os.getpid()}" in message and "--wait" in message and "\n" not in message
    assert not list(tmp_path.glob("smoke*"))  # nothing measured, nothing written


def test_with_wait_a_second_runner_queues_behind_the_first(tmp_path, capsys):
    import threading

    held = threading.Event()

    def first() -> None:
        with runner_lock(tmp_path):
            held.set()
            time.sleep(0.5)

    thread = threading.Thread(target=first)
    thread.start()
    held.wait()
    began = time.monotonic()
    with runner_lock(tmp_path, wait=True):
        waited = time.monotonic() - began
    thread.join()
    assert waited > 0.2 and "waiting for the runner" in capsys.readouterr().err


def test_a_stale_lock_of_a_dead_runner_is_taken_over(tmp_path, capsys):
    dead = 2**22 + 12345  # above the default pid_max: no process has it
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": dead, "host": os.uname().nodename,
                                                  "started_utc": "2026-01-01T00:00:00Z"}))
    with runner_lock(tmp_path):
        holder = json.loads((tmp_path / LOCK_NAME).read_text())
    assert holder["pid"] == os.getpid()
    assert f"pid {dead}" in capsys.readouterr().err


def test_the_lock_file_is_gone_when_the_runner_ends_however_it_ends(tmp_path):
    with runner_lock(tmp_path):
        assert (tmp_path / LOCK_NAME).exists()
    assert not (tmp_path / LOCK_NAME).exists()
    with pytest.raises(RuntimeError), runner_lock(tmp_path):
        raise RuntimeError("a cell went wrong")
    assert list(tmp_path.iterdir()) == []  # a committed results folder is left as it was


def test_a_runner_queued_on_a_removed_lock_file_locks_the_new_one(tmp_path):
    """The first runner removes the file it locked; the one waiting on it must not hold a lock nobody sees."""
    import threading

    held, second_holds, release = threading.Event(), threading.Event(), threading.Event()

    def first() -> None:
        with runner_lock(tmp_path):
            held.set()
            time.sleep(0.3)

    def second() -> None:
        with runner_lock(tmp_path, wait=True):
            second_holds.set()
            release.wait(5)

    one = threading.Thread(target=first)
    one.start()
    held.wait()
    two = threading.Thread(target=second)
    two.start()
    assert second_holds.wait(5)
    try:
        with pytest.raises(ResultsFileError, match="another `bench run`"), runner_lock(tmp_path):
            pass
    finally:
        release.set()
        one.join()
        two.join()
    assert not (tmp_path / LOCK_NAME).exists()


# --- kills and signals ------------------------------------------------------------------------------

def _command(results: Path) -> list[str]:
    return [sys.executable, "-m", "bench", "run", "experiments/smoke.toml", "--results", str(results), "--device", "cpu"]


def _start(results: Path, stderr=subprocess.DEVNULL) -> subprocess.Popen:
    return subprocess.Popen(_command(results), cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr,
                            start_new_session=True)


def _rows_on_disk(results: Path) -> list[dict]:
    found = list(results.glob("smoke/*/runs.csv"))
    return read_rows(found[0]) if found else []


def _wait_for_a_row(results: Path, process: subprocess.Popen, rows_before: int) -> None:
    """Until the runs file holds more than `rows_before` rows or the run has ended: the event, not a fixed sleep."""
    deadline = time.monotonic() + 300
    while len(_rows_on_disk(results)) <= rows_before and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.serial
def test_kills_and_signals_at_random_moments_lose_and_double_no_row_and_ctrl_c_stops_the_run(tmp_path, capfd):
    """One campaign of kills and signals (it replaced test_runner's kill-and-resume run and test_faults_cli's
    SIGTERM/SIGINT campaign): no row is lost or doubled, the rows on disk at each stop stay in the file as they were,
    a SIGTERM or SIGINT stops the run without a traceback and leaves no lock, and Ctrl-C stops a run mid-cell."""
    results = tmp_path / "results"
    chance = random.Random(16)
    kills, on_disk = 0, []
    # SIGTERM and SIGINT at random moments (starting, loading, measuring: each must leave no lock, so they come
    # before the kills, whose lock stays until a run takes it over); SIGKILL while starting, between cells (the
    # moment a row lands) and mid-cell (a random moment after one); then Ctrl-C once mid-cell, then to the end.
    # Each waits on the runs file or a random delay, not on a fixed one.
    moments = [*[(sent, "random") for sent in (signal.SIGTERM, signal.SIGINT) * 3],
               (signal.SIGKILL, "starting"), (signal.SIGKILL, "between cells"), (signal.SIGKILL, "mid-cell")]
    for sent, moment in moments:
        log = tmp_path / f"stopped-{len(on_disk)}.err"
        with log.open("w") as stderr:
            process = _start(results, stderr)
            if moment in ("starting", "random"):  # "starting": before any row of this run
                time.sleep(chance.uniform(0.5, 2) if moment == "starting" else chance.uniform(0.5, 4))
            else:
                _wait_for_a_row(results, process, len(on_disk[-1]) if on_disk else 0)
                time.sleep(chance.uniform(0.2, 1.5) if moment == "mid-cell" else 0)
            if process.poll() is None:
                os.killpg(process.pid, sent)
                kills += 1
            process.wait(timeout=120)
            if sent != signal.SIGKILL:
                _wait_until_gone(process.pid)  # the cell's process might still print
        if sent != signal.SIGKILL:
            assert "Traceback" not in log.read_text(), log.read_text()[-2000:]
            assert not (results / LOCK_NAME).exists()
        on_disk.append(_rows_on_disk(results))
    log = tmp_path / "interrupted.err"
    with log.open("w") as stderr:
        process = _start(results, stderr)
        _wait_for_a_row(results, process, len(on_disk[-1]))
        if process.poll() is None:  # mid-cell: Ctrl-C
            process.send_signal(signal.SIGINT)
            began = time.monotonic()
            process.wait(timeout=30)
            # Under 2 s. The 9.0 and 10.5 s two fresh-clone runs of the whole suite once took was the kernel handing
            # the SIGINT to another thread of the runner while the main one waited on the cell in one long call
            # (test_runner's ctrl_c test reproduces it): a hang guard here, not a limit load can reach.
            assert time.monotonic() - began < 30.0
        process.wait()
        _wait_until_gone(process.pid)  # the cell's process might still print
    assert "Traceback" not in log.read_text() and "BrokenPipeError" not in log.read_text(), log.read_text()[-2000:]
    done = bench_in_process(capfd, *_command(results)[3:])  # the resume: in this process, the cells in their own
    assert done.returncode == 0, done.stderr[-2000:]
    rows = _rows_on_disk(results)
    ids = [row["cell_id"] for row in rows]
    expected = {cell.cell_id for cell in load_grid(REPO / "experiments" / "smoke.toml", "cpu").cells}
    lost, doubled = len(expected - set(ids)), len(ids) - len(set(ids))
    assert (lost, doubled) == (0, 0), (kills, [len(kept) for kept in on_disk], ids)
    assert all(rows[:len(kept)] == kept for kept in on_disk)  # finished rows kept as they were
    assert kills >= 5 and len(on_disk[-1]) >= 1, "the kills came too late or too early to test anything"
    (folder,) = {runs.parent for runs in results.glob("smoke/*/runs.csv")}
    assert not list(folder.glob(".runs.csv.*.tmp")) and not list(folder.glob(".preflight-*"))
    assert {p.name for p in results.iterdir()} <= {"smoke", "peaks"}  # no lock file (peaks: the CPU's, stored once)


def _wait_until_gone(group: int, timeout_s: float = 10.0) -> None:
    """Until no process of the process group `group` is left (the run's cells), or `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


@pytest.mark.serial
def test_two_runners_on_one_folder_the_second_exits_2_naming_the_first(tmp_path, capfd):
    results = tmp_path / "results"
    first = _start(results)
    try:
        deadline = time.monotonic() + 120
        lock = results / LOCK_NAME
        while not (lock.exists() and lock.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        second = bench_in_process(capfd, *_command(results)[3:])
        assert second.returncode == 2, second.stderr
        assert f"pid {first.pid}" in second.stderr and "--wait" in second.stderr
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    shutil.rmtree(results)


# --- out-of-memory in disguise, and the probe's smallest micro-batch --------------------------------

@pytest.mark.parametrize("message", [
    "could not create a primitive",  # oneDNN, a CPU cell under a memory cap
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-contiguous input. "
    "unable to find an engine to execute this computation",
    "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
])
def test_out_of_memory_in_disguise_is_an_oom_row(message):
    from bench.measure.failure import is_out_of_memory
    from bench.results.rows import failure_from

    assert is_out_of_memory(RuntimeError(message)) and failure_from(RuntimeError(message))["status"] == "oom"
    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


def test_the_probe_starts_a_batchnorm_model_at_micro_batch_2_and_says_why():
    from bench.memory.probe import Budget, ProbeConfig, ProbeResult, Search, describe_probe, search_largest

    config = ProbeConfig.of("test_resnet", image_size=32)
    assert config.smallest_micro_batch == 2 and ProbeConfig.of("test_vit", image_size=32).smallest_micro_batch == 1
    tried = search_largest(lambda n: n <= 5, guess=1, smallest=2).trials
    assert min(n for n, _ in tried) == 2
    text = describe_probe(config, Budget(2**30, "test"), ProbeResult(2**30, Search(5, ())))
    assert "starts at micro-batch 2" in text and "BatchNorm" in text
