"""The fault suite, third pass (#41 items 5-8, 13, 19): no data read wrong, no file moved or left behind.

A runs file with CR line endings is refused naming them, never set aside whole; a header naming a column twice is
refused; every column holds what the grid's axis allows (and numbers are finite), checked on read; SIGTERM ends
every command as Ctrl-C does (one line, exit 130, no lock left); a disk-cache entry whose value does not validate is
ignored with one warning and recomputed; a byte-order mark is tolerated in grids, catalogs and runs files.
In-process through `bench.cli.main` and the API.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
from pathlib import Path

import pytest
from conftest import CPU_ROWS, CPU_TAG, REPO
from test_faults_cli import ROWS, SKYPILOT, SMOKE, refused, work  # noqa: F401 - `work` is a fixture

from bench.cli import main
from bench.grid.spec import cell_bounds, load_grid
from bench.measure.device import detect_device
from bench.results.read import read_runs

def _runs(root: Path) -> Path:
    return root / "results" / "resnet50" / CPU_TAG / "runs.csv"


def _reader(command: str, root: Path) -> tuple[Path, list[str]]:
    """The runs file `command` reads (the committed rows) and its arguments: `claims` reads its own folders."""
    runs = _runs(root)
    if command == "claims":
        folder = root / "results" / "claims_leak" / detect_device("cpu").tag
        folder.mkdir(parents=True)
        runs = Path(shutil.copy(runs, folder / "runs.csv"))
    return runs, {"report": ["report", str(runs.parent)],
                  "cost": ["cost", str(runs.parent), "--allow-cpu-projection"],
                  "plan": ["plan", "resnet50", str(runs.parent), "--effective-batch", "256", "--allow-cpu-projection"],
                  "claims": ["claims", "--results", str(root / "results")]}[command]


def _smoke_runs(root: Path, data: bytes) -> Path:
    """The smoke grid's runs file under `root/results`, holding `data`."""
    folder = root / "results" / "smoke" / detect_device("cpu").tag
    folder.mkdir(parents=True)
    (folder / "runs.csv").write_bytes(data)
    return folder / "runs.csv"


def _run_refuses(path: Path, root: Path, capsys, names: str) -> None:
    """`bench run` of the smoke grid exits 2 with one line naming `names`, before any cell, the file unchanged and
    nothing set aside beside it."""
    before = path.read_bytes()
    assert main(["run", str(SMOKE), "--device", "cpu", "--results", str(root / "results")]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "Traceback" not in error and names in error, error
    assert path.read_bytes() == before and sorted(p.name for p in path.parent.iterdir()) == ["runs.csv"]


# --- item 5: CR-only line endings -----------------------------------------------------------------------

@pytest.mark.parametrize("command", ["report", "cost", "claims"])
def test_a_runs_file_with_cr_line_endings_is_refused_naming_them(command, work, capsys):
    runs, argv = _reader(command, work)
    runs.write_bytes(runs.read_bytes().replace(b"\n", b"\r"))
    refused(argv, work, capsys, names="carriage return")


def test_run_never_sets_aside_a_runs_file_with_cr_line_endings(work, capsys):
    """Before: the whole file (header and rows) was taken for one torn line, moved aside, and every cell measured
    again."""
    path = _smoke_runs(work, ROWS.read_bytes().replace(b"\n", b"\r"))
    _run_refuses(path, work, capsys, "carriage return")


# --- item 6: a column twice -----------------------------------------------------------------------------

def _with_column_twice(runs: Path, name: str) -> None:
    lines = runs.read_text().splitlines()
    index = lines[0].split(",").index(name)
    lines = [line + "," + line.split(",")[index] for line in lines]  # no quoted field before it in these rows
    runs.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("name", ["cell_id", "model", "samples_per_s"])
@pytest.mark.parametrize("command", ["report", "cost", "claims"])
def test_a_header_naming_a_column_twice_is_refused(name, command, work, capsys):
    runs, argv = _reader(command, work)
    _with_column_twice(runs, name)
    refused(argv, work, capsys, names=f"column {name!r} appears twice")


def test_run_refuses_a_header_naming_a_column_twice(work, capsys):
    path = _smoke_runs(work, ROWS.read_bytes())
    _with_column_twice(path, "cell_id")
    _run_refuses(path, work, capsys, "appears twice")


# --- item 7: every column within its axis's bounds, numbers finite ---------------------------------------

def _bound_cases() -> list[tuple[str, str]]:
    header = ROWS.read_text().split("\n", 1)[0].split(",")
    cases = [(name, str(value)) for name, (low, high) in cell_bounds().items() if name in header
             for value in (low - 1, high + 1)]
    cases += [("micro_batch", value) for value in ("1e300", "-8", "1e400", "inf", "nan")]
    cases += [(name, value) for name in ("samples_per_s", "step_time_median_ms", "duration_s", "mfu_pct")
              for value in ("inf", "-inf", "nan", "NaN", "1e400", "-1e400", "Infinity")]
    cases += [(name, value) for name in ("peak_memory_bytes", "param_count", "cpu_threads")
              for value in ("-1", "1e400", "9" * 30, "nan")]
    return cases


BOUND_CASES = _bound_cases()


def _with_field(runs: Path, name: str, value: str) -> None:
    """The first row once more, with `name` set to `value` (an appended line: the line the message names)."""
    import csv
    import io

    lines = runs.read_text().splitlines()
    row = next(csv.reader([lines[1]]))
    row[lines[0].split(",").index(name)] = value
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="").writerow(row)
    runs.write_text("\n".join([*lines, buffer.getvalue()]) + "\n")


def test_the_bounds_family_covers_every_bounded_column():
    header = ROWS.read_text().split("\n", 1)[0]
    assert {name for name, _ in BOUND_CASES} >= {name for name in cell_bounds() if name in header.split(",")}
    assert len(BOUND_CASES) >= 50


@pytest.mark.parametrize("name,value", BOUND_CASES, ids=[f"{n}={v[:20]}" for n, v in BOUND_CASES])
def test_a_value_past_its_columns_bounds_is_refused_naming_file_line_and_column(name, value, work, capsys):
    runs = _runs(work)
    _with_field(runs, name, value)
    line = len(runs.read_text().splitlines())
    refused(["report", str(runs.parent)], work, capsys, names=f"{runs}: line {line}, column {name}:")


@pytest.mark.parametrize("command", ["cost", "plan", "claims"])
def test_micro_batch_past_the_grids_bound_stops_every_reader(command, work, capsys):
    """Before: ZeroDivisionError, TypeError or "cannot safely cast" tracebacks in cost, plan and report."""
    runs, argv = _reader(command, work)
    _with_field(runs, "micro_batch", "1e300")
    refused(argv, work, capsys, names="column micro_batch")


def test_run_appends_nothing_to_a_file_with_an_infinite_number(work, capsys):
    path = _smoke_runs(work, ROWS.read_bytes())
    _with_field(path, "samples_per_s", "inf")
    _run_refuses(path, work, capsys, "column samples_per_s")


def test_the_grids_own_bounds_are_the_readers(tmp_path):
    """One source of truth: a row at each bound reads; the grid refuses one past it as the reader does."""
    from bench.results.schema import COLUMNS

    for name, (low, high) in cell_bounds().items():
        assert (COLUMNS[name].minimum, COLUMNS[name].maximum) == (low, high), name
    assert cell_bounds()["micro_batch"] == (1, 65_536) and cell_bounds()["image_size"] == (1, 4096)


# --- item 8: SIGTERM -------------------------------------------------------------------------------------

class _Killed(Exception):
    """What the test's own SIGTERM handler raises: the command did not install its policy."""


def test_measure_on_sigterm_says_so_exits_130_and_leaves_no_lock(work, capsys, monkeypatch):
    """Before: `bench measure` died of the signal (exit 143) with no message, `.bench-run.lock` left behind."""
    import bench.run.grid_runner

    def terminated_mid_cell(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM was not handled")

    monkeypatch.setattr(bench.run.grid_runner, "run_grid", terminated_mid_cell)
    previous = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(_Killed()))
    try:
        code = main(["measure", "test_vit", "--image-size", "32", "--micro-batch", "2", "--accum-steps", "1",
                     "--device", "cpu", "--memory-limit-gib", "4", "--results", str(work / "results")])
        assert signal.getsignal(signal.SIGTERM) is not previous  # main put the caller's handler back ...
    finally:
        restored = signal.signal(signal.SIGTERM, previous)
    assert restored.__name__ == "<lambda>"  # ... which is the test's
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 130 and error[-1].startswith("bench: interrupted"), error
    assert not (work / "results" / ".bench-run.lock").exists()


# --- item 13: the disk cache's values ---------------------------------------------------------------------

@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("BENCH_NO_CACHE", raising=False)
    return tmp_path / "cache"


def _spoil_entry(folder: Path, value: object | bytes) -> None:
    (entry,) = folder.glob("*.json")
    if isinstance(value, bytes):
        entry.write_bytes(value)
        return
    stored = json.loads(entry.read_text())
    stored["value"] = value
    entry.write_text(json.dumps(stored))  # NaN as JSON's NaN, as Python writes it


def _tiny_cell(**fields):
    from bench.grid.cell import Cell

    return Cell(experiment="e", profile="cuda", model="test_resnet", image_size=32, micro_batch=2, accum_steps=1,
                precision="fp32", checkpointing="off", optimizer="sgd", channels_last=False, warmup_steps=1,
                measured_steps=1, **fields)


@pytest.mark.parametrize("value", [float("nan"), -1, 0, True, "1e9", None, [1], float("inf")],
                         ids=["nan", "-1", "0", "true", "text", "null", "list", "inf"])
def test_a_stored_peak_that_is_no_byte_count_is_recomputed_with_one_warning(value, cache, capsys):
    """Before: a stored peak of NaN, -1 or true gave a wrong fits / does-not-fit answer."""
    from bench.memory.probe import estimated_peak_bytes

    fresh, traced = estimated_peak_bytes(_tiny_cell(), "cuda")
    assert traced
    _spoil_entry(cache / "traces", value)
    capsys.readouterr()
    again, traced = estimated_peak_bytes(_tiny_cell(), "cuda")
    assert (again, traced) == (fresh, True)
    assert capsys.readouterr().err.count("warning: ignoring cache file") == 1


_ESTIMATE = {name: 1 for name in ("target", "params_bytes", "param_count", "inputs_bytes", "workspace_bytes",
                                   "attention", "reserved_bytes")} | {"traced": {}}
_TRACE = {"peak_bytes": 100, "allocated_peak_bytes": 100, "param_count": 10, "estimate": _ESTIMATE, "ops": None}


@pytest.mark.parametrize("value", [{}, float("nan"), "row", [], {**_TRACE, "estimate": None},
                                   {k: v for k, v in _TRACE.items() if k != "ops"}, {**_TRACE, "param_count": True},
                                   {**_TRACE, "peak_bytes": -1}, {**_TRACE, "peak_bytes": float("nan")},
                                   {**_TRACE, "allocated_peak_bytes": -1},
                                   {**_TRACE, "estimate": {"traced": {}}}, {**_TRACE, "estimate": {**_ESTIMATE, "traced": 5}}],
                         ids=["empty", "nan", "text", "list", "no-estimate", "no-ops", "bool-params", "negative-peak",
                              "nan-peak", "negative-allocated-peak", "estimate-fields-missing", "traced-not-dict"])
def test_a_trace_entry_that_is_no_trace_is_recomputed_with_one_warning(value, cache, capsys):
    """Before: an estimate-rows entry of {} or NaN was a traceback in `bench estimate`; every command reads the one
    trace cache now (`bench.memory.traces`)."""
    from bench.memory.estimate_grid import estimated_row

    fresh = estimated_row(_tiny_cell(), "cuda")
    _spoil_entry(cache / "traces", value)
    capsys.readouterr()
    assert estimated_row(_tiny_cell(), "cuda") == fresh
    assert capsys.readouterr().err.count("warning: ignoring cache file") == 1


def test_a_cache_entry_that_is_not_utf8_is_ignored_with_one_warning(cache, capsys):
    """Before: UnicodeDecodeError, which a probe reported as the model failing its synthetic step."""
    from bench.memory.probe import estimated_peak_bytes

    fresh, _ = estimated_peak_bytes(_tiny_cell(), "cuda")
    _spoil_entry(cache / "traces", b'{"key": "\xff\xfe"}')
    capsys.readouterr()
    assert estimated_peak_bytes(_tiny_cell(), "cuda") == (fresh, True)
    err = capsys.readouterr().err
    assert err.count("warning: ignoring cache file") == 1 and "not UTF-8" in err


@pytest.mark.parametrize("value", [{}, {"blocks": "6", "full_checkpointing": True, "patch": [16, 16], "pads": False},
                                   {"blocks": 6, "full_checkpointing": 1, "patch": [16, 16], "pads": False},
                                   {"blocks": 6, "full_checkpointing": True, "patch": [0, 16], "pads": False},
                                   {"blocks": -1, "full_checkpointing": True, "patch": None, "pads": False}],
                         ids=["empty", "text-blocks", "int-flag", "zero-patch", "negative-blocks"])
def test_stored_model_bounds_that_do_not_validate_are_rebuilt(value, cache, capsys):
    from bench.train import model_bounds as module

    module._cached_bounds.cache_clear()
    fresh = module.model_bounds("test_vit")
    _spoil_entry(cache / "model-bounds", value)
    module._cached_bounds.cache_clear()
    capsys.readouterr()
    assert module.model_bounds("test_vit") == fresh
    assert capsys.readouterr().err.count("warning: ignoring cache file") == 1
    module._cached_bounds.cache_clear()


# --- item 19: a byte-order mark ----------------------------------------------------------------------------

def test_a_grid_file_with_a_bom_reads_as_without(tmp_path, capsys):
    """Before: "not valid TOML: Invalid statement (at line 1, column 1)"."""
    with_bom = tmp_path / "smoke.toml"
    with_bom.write_bytes(b"\xef\xbb\xbf" + SMOKE.read_bytes())
    assert load_grid(with_bom, "cpu").cells == load_grid(SMOKE, "cpu").cells
    assert main(["list", str(with_bom), "--profile", "cpu"]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_a_skypilot_catalog_with_a_bom_imports_as_without(tmp_path, capsys):
    """Before: "missing column(s) InstanceType" (the BOM glued to the first column's name)."""
    with_bom = tmp_path / SKYPILOT.name
    with_bom.write_bytes(b"\xef\xbb\xbf" + SKYPILOT.read_bytes())
    answers = []
    for path in (SKYPILOT, with_bom):
        assert main(["catalog", "import", str(path), "--provider", "aws", "--observed", "2026-11-30",
                     "--dry-run"]) == 0, \
            capsys.readouterr().err
        answers.append(capsys.readouterr().out.replace(str(path), "<file>"))
    assert answers[0] == answers[1] and "rows" in answers[0]


def test_a_runs_file_with_a_bom_reads_the_same_rows(tmp_path):
    with_bom = tmp_path / "runs.csv"
    with_bom.write_bytes(b"\xef\xbb\xbf" + ROWS.read_bytes())
    assert read_runs(with_bom).equals(read_runs(ROWS))


def test_docs_list_the_promises():
    text = (REPO / "docs" / "reliability.md").read_text()
    assert "tests/test_faults_data.py" in text


def test_an_overflowed_fp16_gradient_norm_is_a_measurement_not_a_bad_value(tmp_path):
    """fp16 without a loss scale overflows: the row's grad_norm of inf is what was measured, and reads back; the
    bounds of #41 item 7 refuse inf only where no measurement can be one (the GPU check's fp16 dry run found it)."""
    from bench.results.read import read_text

    runs = tmp_path / "runs.csv"
    text = CPU_ROWS.read_text().splitlines()
    header = text[0].split(",")
    row = next(csv.reader([text[1]]))
    row[header.index("grad_norm")] = "inf"
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows([header, row])
    runs.write_text(buffer.getvalue())
    assert read_runs(runs).grad_norm.iloc[0] == float("inf")
    assert read_text(runs).rows[0]["grad_norm"] == "inf"
