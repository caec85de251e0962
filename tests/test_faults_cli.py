"""The fault suite, second pass: what users throw at every command family.

Each case runs in this process through `bench.cli.main(argv)`, twice: as text (exit 2, one line on
stderr, no traceback) and with `--format json` (exit 2, one `{"error", "file", "key"}` object on
stdout). Both times nothing is written in the working folder or the results folders given, and no
runs file changes. A few cases that need real processes (concurrency, signals) are slow-marked at
the end. docs/reliability.md gives the counts.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import CPU_ROWS, CPU_TAG, REPO, bench_in_process, read_rows, tiny_grid
from test_faults import GRID_CASES

from bench.cli import main
from bench.errors import OptionError
from bench.grid.spec import load_grid
from bench.results.read import MAX_RUNS_FILE_BYTES, read_runs
from bench.results.schema import COLUMNS
from bench.results.store import RunsFile

ROWS = CPU_ROWS
SMOKE = REPO / "experiments" / "smoke.toml"
CATALOG = (REPO / "bench" / "data" / "instances.csv").read_text()
SKYPILOT = REPO / "tests" / "data" / "skypilot" / "aws_vms_v7_excerpt.csv"

# Bad values for each kind of number an option takes; every one must be refused by that kind.
BAD_POSITIVE = ["nan", "NaN", "-nan", "inf", "-inf", "Infinity", "-1", "-0.5", "0", "-0", "0.0", "5e-324", "1e-310",
                "1e308", "1e309", "-1e308", "abc", "", "  ", "1,5", "0x10", "1e", "--", "1.2.3", "1e13"]
BAD_WHOLE = ["nan", "inf", "-1", "0", "-0", "1.5", "1e3", "abc", "", " ", "5e-324", "1e308", "9" * 5000, "0x10",
             "1,000", "10000000000000", "+-1", "one"]
BAD_NON_NEGATIVE = ["nan", "inf", "-inf", "-1", "-1e-9", "5e-324", "1e308", "1e13", "abc", ""]
BAD_FRACTION = ["nan", "inf", "0", "-0", "-1", "1.5", "1.0000001", "2", "1e308", "5e-324", "abc", ""]
BAD_IMAGE_SIZE = ["0", "-1", "4097", "100000", "1e308", "nan", "32.5", "abc", "", "9" * 5000]
BAD_GPUS = ["A100", "a100", "H100", "h100-80", "RTX4090", "4090", "nvidia", "", " ", "A100-40GB ", "H200x", "TPU-v5",
            "../gpus.csv", "A100-40GB;rm"]


def _numbers(option: str, values: list[str]) -> list[list[str]]:
    """`--option value` and `--option=value` (argparse takes `-inf` only in the second form)."""
    return [arg for value in values for arg in ([option, value], [f"{option}={value}"])]


def _snapshot(*roots: Path) -> dict[str, str]:
    """Every file under `roots`, by path, with a hash of its bytes (symlinks by their target)."""
    found = {}
    for root in roots:
        for path in [root, *root.rglob("*")] if root.exists() else []:
            if path.is_symlink():
                found[str(path)] = "-> " + os.readlink(path)
            elif path.is_file():
                found[str(path)] = hashlib.sha1(path.read_bytes()).hexdigest()
            else:
                found[str(path)] = "dir"
    return found


@pytest.fixture
def work(tmp_path, monkeypatch):
    """An empty working folder (the current directory) and a results folder holding committed rows."""
    folder = tmp_path / "work"
    folder.mkdir()
    monkeypatch.chdir(folder)
    rows = tmp_path / "results" / "resnet50" / CPU_TAG
    rows.mkdir(parents=True)
    shutil.copy(ROWS, rows / "runs.csv")
    (tmp_path / "empty").mkdir()
    (tmp_path / "a-file").write_text("not a folder\n")
    handler = signal.getsignal(signal.SIGTERM)  # `bench run` installs its own
    yield tmp_path
    signal.signal(signal.SIGTERM, handler)


def refused(argv: list[str], root: Path, capsys, names: str | None = None) -> None:
    """`argv` is bad input in text and in JSON: exit 2, one line (or one JSON object), nothing written."""
    before = _snapshot(root)
    code = main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2, (argv, captured.err[-500:])
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    if names is not None:
        assert names in lines[0], lines[0]
    code = main([*argv, "--format", "json"])
    captured = capsys.readouterr()
    assert code == 2, (argv, captured.err[-500:])
    answer = json.loads(captured.out)
    assert set(answer) == {"error", "file", "key"} and answer["error"] == lines[0].split(": ", 1)[1], answer
    assert _snapshot(root) == before, argv


def _ids(cases: list[list[str]]) -> list[str]:
    return [" ".join(case)[:60] for case in cases]


# --- CLI numbers and names, per command family -----------------------------------------------------

PLAN_CASES = [*_numbers("--effective-batch", BAD_WHOLE), *_numbers("--image-size", BAD_IMAGE_SIZE),
              *_numbers("--budget-usd", BAD_POSITIVE), *_numbers("--deadline-hours", BAD_POSITIVE),
              *_numbers("--top", BAD_WHOLE), *_numbers("--dataset-size", BAD_WHOLE),
              *_numbers("--epochs", BAD_POSITIVE), *_numbers("--scaling-efficiency", BAD_FRACTION),
              *_numbers("--headroom", BAD_NON_NEGATIVE), *(["--gpu", name] for name in BAD_GPUS),
              ["--provider", "AWS"], ["--provider", "amazon"], ["--provider", ""], ["--precision", "fp64"],
              ["--checkpointing", "last-2"], ["--optimizer", "adam"], ["--predict", "sometimes"]]
COST_CASES = [*_numbers("--dataset-size", BAD_WHOLE), *_numbers("--epochs", BAD_POSITIVE),
              *_numbers("--scaling-efficiency", BAD_FRACTION), *_numbers("--headroom", BAD_NON_NEGATIVE),
              ["--provider", "AWS"], ["--provider", "gcpp"], ["--provider", "azure "], ["--provider", ""]]
PROBE_CASES = [*_numbers("--memory-gib", BAD_POSITIVE), *_numbers("--memory-limit-gib", BAD_POSITIVE),
               *_numbers("--timeout-s", BAD_POSITIVE), *_numbers("--accum-steps", BAD_WHOLE),
               *_numbers("--image-size", BAD_IMAGE_SIZE), *(["--gpu", name] for name in BAD_GPUS),
               *(["--checkpointing", value] for value in ("last-0", "last-1000", "last-" + "9" * 5000, "last-",
                                                          "some", "LAST-1", "last-01", "")),
               ["--precision", "fp64"], ["--optimizer", "adam"], ["--attention", "flash"]]

MEASURE_CASES = [*_numbers("--micro-batch", [*BAD_WHOLE, "65537", "1000000000000"]),
                 *_numbers("--accum-steps", [*BAD_WHOLE, "65537", "100000"]),
                 *_numbers("--measured-steps", [*BAD_WHOLE, "10001", "1000000"]),
                 *_numbers("--warmup-steps", ["0", "-1", "10001", "1.5", "abc"]),
                 *_numbers("--timeout-s", [*BAD_POSITIVE, "86401", "1e9"]),
                 *_numbers("--quiet-wait-s", ["-1", "nan", "inf", "86401", "abc", ""]),
                 *_numbers("--memory-limit-gib", BAD_POSITIVE),
                 ["--micro-batch", "256", "--accum-steps", "512"],  # a product past a grid's effective_batch bound
                 ["--experiment", "../up"], ["--experiment", "a/b"], ["--precision", "fp64"]]
"""`bench measure` takes what a grid file takes, with the same bounds (`RunSettings`, `MAX_PAIR_VALUE`)."""


def _folder_cases(root: Path) -> list[list[str]]:
    """A file where a folder is expected, an empty folder, a missing one, a catalog that is not one."""
    return [[str(root / "a-file")], [str(root / "empty")], [str(root / "missing")],
            [str(root / "results" / "resnet50" / CPU_TAG), "--catalog", str(root / "missing.csv")],
            [str(root / "results" / "resnet50" / CPU_TAG), "--catalog", str(root / "empty")],
            [str(root / "results" / "resnet50" / CPU_TAG), "--catalog", str(root / "a-file")]]


def test_each_command_family_has_at_least_100_cases():
    counts = {"plan": len(PLAN_CASES), "cost": len(COST_CASES), "probe": len(PROBE_CASES),
              "estimate": len(GRID_CASES), "predict": len(GRID_CASES), "measure": len(MEASURE_CASES), "runs files": len(RUNS_FILE_CASES),
              "catalogs": 2 * len(CATALOG_CASES) + len(SKYPILOT_CASES)}  # each catalog through `catalog` and `cost`
    assert min(counts.values()) >= 100, counts


@pytest.mark.parametrize("extra", PLAN_CASES, ids=_ids(PLAN_CASES))
def test_plan_refuses_bad_input(extra, work, capsys):
    rows = str(work / "results" / "resnet50" / CPU_TAG)
    refused(["plan", "resnet50", rows, "--effective-batch", "256", "--allow-cpu-projection", *extra], work, capsys)


@pytest.mark.parametrize("extra", COST_CASES, ids=_ids(COST_CASES))
def test_cost_refuses_bad_input(extra, work, capsys):
    refused(["cost", str(work / "results" / "resnet50" / CPU_TAG), "--allow-cpu-projection", *extra],
            work, capsys)


@pytest.mark.parametrize("index", range(6))
def test_cost_and_plan_refuse_a_file_an_empty_folder_and_a_bad_catalog(index, work, capsys):
    case = _folder_cases(work)[index]
    refused(["cost", *case, "--allow-cpu-projection"], work, capsys)
    refused(["plan", "resnet50", *case, "--effective-batch", "256", "--allow-cpu-projection"], work, capsys)


@pytest.mark.parametrize("extra", PROBE_CASES, ids=_ids(PROBE_CASES))
def test_probe_refuses_bad_input(extra, work, capsys):
    refused(["probe", "test_resnet", *extra], work, capsys)


@pytest.mark.parametrize("extra", MEASURE_CASES, ids=_ids(MEASURE_CASES))
def test_measure_refuses_what_a_grid_file_refuses(extra, work, capsys):
    options = {"--micro-batch": ["--micro-batch", "2"]}
    base = [] if "--micro-batch" in extra else options["--micro-batch"]
    refused(["measure", "test_resnet", "--image-size", "32", "--results", str(work / "results"), *base, *extra],
            work, capsys)


def test_measure_caps_a_cpu_cell_at_half_the_available_memory_unless_told(monkeypatch, capsys):
    from bench.commands import measure
    from bench.measure.device import DeviceInfo
    from bench.units import GIB

    monkeypatch.setattr("bench.measure.host.available_memory_bytes", lambda: 20 * GIB)
    cpu = DeviceInfo("cpu", "a CPU", ("fp32",), 2)
    assert measure._memory_limit_gib(SimpleNamespace(memory_limit_gib=None), cpu) == pytest.approx(10.0)
    assert "10.0 GiB" in capsys.readouterr().err
    assert measure._memory_limit_gib(SimpleNamespace(memory_limit_gib=3.0), cpu) == 3.0
    gpu = DeviceInfo("cuda", "NVIDIA H200", ("fp32",), 2)
    assert measure._memory_limit_gib(SimpleNamespace(memory_limit_gib=None), gpu) is None  # the card is its own cap
    monkeypatch.setattr("bench.measure.host.available_memory_bytes", lambda: None)
    with pytest.raises(OptionError, match="--memory-limit-gib: required here"):
        measure._memory_limit_gib(SimpleNamespace(memory_limit_gib=None), cpu)


@pytest.mark.parametrize("model", ["resnet-50", "resnet50." + "a" * 200, "resnet50.a/b", "", "../resnet50",
                                   "not_a_model_at_all"])
def test_probe_and_plan_refuse_a_model_name_naming_it(model, work, capsys):
    refused(["probe", model, "--gpu", "A100-40GB"], work, capsys)
    refused(["plan", model, "--effective-batch", "256"], work, capsys)


def _grid_file(work: Path, content: bytes | None) -> Path:
    path = work / "grid.toml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    return path


@pytest.mark.parametrize("case", GRID_CASES, ids=[case[0] for case in GRID_CASES])
def test_estimate_refuses_a_malformed_grid_file(case, work, capsys):
    name, content, key = case
    path = _grid_file(work, content)
    refused(["estimate", str(path), "--profile", "cpu", "--results", str(work / "results")], work, capsys,
            names=key)


@pytest.mark.parametrize("case", GRID_CASES, ids=[case[0] for case in GRID_CASES])
def test_predict_refuses_a_malformed_grid_file(case, work, capsys):
    name, content, key = case
    path = _grid_file(work, content)
    refused(["predict", str(path), "--results", str(work / "results")], work, capsys, names=key)


@pytest.mark.parametrize("command", [["estimate", str(SMOKE), "--profile", "cpu"], ["predict", str(SMOKE), "--gpu", "H200"]],
                         ids=["estimate", "predict"])
@pytest.mark.parametrize("results", ["a-file", "a-file/below"])
def test_estimate_and_predict_refuse_a_file_where_the_results_folder_is_expected(command, results, work, capsys):
    refused([*command, "--results", str(work / results)], work, capsys, names="Not a directory")


@pytest.mark.parametrize("gpu", BAD_GPUS)
def test_predict_refuses_an_unknown_gpu_with_the_keys_it_may_mean(gpu, work, capsys):
    refused(["predict", str(SMOKE), "--gpu", gpu, "--results", str(work / "results")], work, capsys, names="--gpu")


def test_a_gpu_name_short_of_a_key_gets_the_keys_it_may_mean(work, capsys):
    for argv in (["probe", "resnet50", "--gpu", "A100"], ["plan", "resnet50", "--effective-batch", "8", "--gpu", "A100"]):
        assert main(argv) == 2
        assert "did you mean A100-40GB, A100-80GB" in capsys.readouterr().err


# --- runs files ---------------------------------------------------------------------------------------

_BAD_BY_TYPE = {"int": ["eight", "8.5", "1e400x"], "float": ["fast", "1.2.3"], "bool": ["yes", "1"], "json": ["{"]}


def _runs_file_cases() -> list[tuple[str, str, str]]:
    """(case id, what to do to the committed rows, the column or line the message names)."""
    header = ROWS.read_text().split("\n", 1)[0].split(",")
    cases = [(f"{name}={value}", f"field {name} {value}", f"column {name}")
             for name, column in COLUMNS.items() if name in header for value in _BAD_BY_TYPE.get(column.type, [])]
    cases += [(f"cell_id={value}", f"field cell_id {value}", "column cell_id")
              for value in ("../../etc", "", " x", "a b", "-x", "x" * 700, "a/b", "a;b")]
    cases += [(f"status={value}", f"field status {value}", "column status") for value in ("fine", "", "OK", "None")]
    cases += [("extra field", "extra field", "fields"),
              ("missing field", "missing field", "fields"), ("unknown column", "unknown column", "column"),
              ("NUL in a field", "field model a\x00b", None), ("invalid UTF-8", "bytes \xff", "UTF-8"),
              ("unclosed quote", 'line "x', "line")]
    return cases


RUNS_FILE_CASES = _runs_file_cases()


def _spoil(runs: Path, how: str) -> None:
    lines = runs.read_text().splitlines()
    header = lines[0].split(",")
    kind, _, rest = how.partition(" ")
    if kind == "field":
        name, _, value = rest.partition(" ")
        import csv
        import io

        row = next(csv.reader([lines[1]]))
        row[header.index(name)] = value
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="").writerow(row)
        lines.append(buffer.getvalue())
    elif how == "repeat":
        lines.append(lines[1])
    elif how == "extra field":
        lines.append(lines[1] + ",surplus")
    elif how == "missing field":
        lines.append(lines[1].rsplit(",", 3)[0])
    elif how == "unknown column":
        lines[0] = lines[0] + ",colour"
    elif kind == "line":
        lines.append(rest)
    if kind == "bytes":
        runs.write_bytes(("\n".join(lines) + "\n").encode() + b"\xff\xfe,x\n")
    else:
        runs.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("case", RUNS_FILE_CASES, ids=[case[0][:50] for case in RUNS_FILE_CASES])
def test_report_refuses_a_spoilt_runs_file_naming_line_and_column(case, work, capsys):
    name, how, names = case
    runs = work / "results" / "resnet50" / CPU_TAG / "runs.csv"
    _spoil(runs, how)
    refused(["report", str(runs.parent)], work, capsys, names=names)


def test_a_cell_measured_again_reads_as_its_last_row(work):
    """`--force` appends: a cell's second row is its row, at the end, and the count of cells is unchanged."""
    runs = work / "results" / "resnet50" / CPU_TAG / "runs.csv"
    before = read_runs(runs)
    _spoil(runs, "field samples_per_s 12345.5")  # the first row's cell again, with another speed
    after = read_runs(runs)
    assert len(after) == len(before) and after.cell_id.iloc[-1] == before.cell_id.iloc[0]
    assert after.samples_per_s.iloc[-1] == 12345.5 and list(after.cell_id[:-1]) == list(before.cell_id[1:])


@pytest.mark.slow
def test_a_runs_file_past_the_size_bound_is_refused_before_it_is_read(work, capsys):
    runs = work / "results" / "resnet50" / CPU_TAG / "runs.csv"
    with runs.open("r+b") as handle:  # sparse: 200 MB on the file system's books, nothing on the disk
        handle.truncate(200 * 10**6)
    assert runs.stat().st_size > MAX_RUNS_FILE_BYTES
    refused(["report", str(runs.parent)], work, capsys, names="MiB")
    refused(["cost", str(runs.parent), "--allow-cpu-projection"], work, capsys, names="MiB")


@pytest.mark.parametrize("variant", ["BOM", "CRLF", "older schema", "BOM and CRLF"])
def test_a_runs_file_as_spreadsheets_and_older_versions_write_it_reads_the_same_rows(variant, tmp_path):
    text = ROWS.read_text()
    lines = text.splitlines()
    if "older" in variant:  # the columns of the first schema only: later axes read at their defaults
        import csv
        import io

        from bench.grid.cell import extra_axis_defaults

        rows = list(csv.reader(lines))
        keep = [i for i, name in enumerate(rows[0]) if name not in extra_axis_defaults()]
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerows([[row[i] for i in keep] for row in rows])
        lines = buffer.getvalue().splitlines()
    data = ("\r\n" if "CRLF" in variant else "\n").join(lines) + "\n"
    path = tmp_path / "runs.csv"
    path.write_bytes(("\ufeff" if "BOM" in variant else "").encode() + data.encode())
    read, clean = read_runs(path), read_runs(ROWS)
    assert list(read.cell_id) == list(clean.cell_id)
    assert (read.samples_per_s.fillna(-1) == clean.samples_per_s.fillna(-1)).all()


@pytest.mark.slow
def test_report_reads_a_runs_file_linked_from_outside_and_leaves_the_target_alone(work, capsys):
    outside = work / "outside.csv"
    shutil.copy(ROWS, outside)
    folder = work / "results" / "linked" / CPU_TAG
    folder.mkdir(parents=True)
    (folder / "runs.csv").symlink_to(outside)
    before = outside.read_bytes()
    assert main(["cost", str(folder), "--allow-cpu-projection", "--format", "json"]) == 0
    assert outside.read_bytes() == before


def test_run_refuses_a_runs_file_linked_from_outside_before_measuring(work, capsys):
    from bench.measure.device import detect_device

    outside = work / "outside.csv"
    shutil.copy(ROWS, outside)
    folder = work / "results" / "smoke" / detect_device("cpu").tag
    folder.mkdir(parents=True)
    (folder / "runs.csv").symlink_to(outside)
    before = outside.read_bytes()
    assert main(["run", str(REPO / "experiments" / "smoke.toml"), "--device", "cpu",
                 "--results", str(work / "results")]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "symbolic link" in error and "Traceback" not in error
    assert outside.read_bytes() == before and sorted(p.name for p in folder.iterdir()) == ["runs.csv"]


@pytest.mark.serial  # it measures a cell: alone, not beside the parallel tests (the CPU peak waits for quiet)
def test_run_writes_a_runs_file_of_an_earlier_version_under_todays_header_keeping_every_row(work, capsys):
    import csv
    import io

    from bench.measure.device import detect_device
    from bench.results.read import read_text
    from bench.results.schema import COLUMNS

    rows = list(csv.reader(ROWS.read_text().splitlines()))
    keep = [i for i, name in enumerate(rows[0]) if name not in ("foreign_load_cores", "run_id")]  # added later
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows([[row[i] for i in keep] for row in rows])
    grid = work / "one.toml"
    grid.write_text(textwrap.dedent(tiny_grid("one", pairs="[[4, 1]]")))
    folder = work / "results" / "one" / detect_device("cpu").tag
    folder.mkdir(parents=True)
    (folder / "runs.csv").write_text(buffer.getvalue())
    before = read_text(folder / "runs.csv").rows
    assert main(["run", str(grid), "--device", "cpu", "--results", str(work / "results")]) == 0
    note = f"{folder / 'runs.csv'}: written by an earlier version of bench; rewritten under today's header"
    assert note in capsys.readouterr().err
    after = read_text(folder / "runs.csv")
    assert after.header == list(COLUMNS) and after.rows[:len(before)] == before  # every earlier row as it was
    assert [row["status"] for row in after.rows[len(before):]] == ["ok"] and after.rows[-1]["run_id"]
    assert sorted(p.name for p in folder.iterdir()) == ["runs.csv"]  # no temporary or side file left


# --- catalogs -----------------------------------------------------------------------------------------

_CATALOG_BAD = {"provider": [""], "instance": [""], "gpu": ["A100", "", "TPU"], "gpu_count": ["0", "-1", "1.5", "x", ""],
                "gpu_memory_gb": ["0", "-40", "nan", "inf", "x"],
                "usd_per_hour": ["0", "-1", "nan", "inf", "-inf", "x", "", "1e999"],
                "spot_usd_per_hour": ["0", "-1", "nan", "inf", "x"], "region": [""],
                "observed": ["2024-13", "2024-02-31", "2999-01", "24-09", "x", ""], "valid_until": ["2024-13", "x"],
                "source": [""], "vcpus": ["0", "-1", "1.5", "x"]}


def _catalog_cases() -> list[tuple[str, str, str]]:
    header = CATALOG.splitlines()[0].split(",")
    cases = [(f"{column}={value}", column, value) for column, values in _CATALOG_BAD.items() for value in values]
    assert {column for _, column, _ in cases} <= set(header)
    cases += [("missing column", "drop", "usd_per_hour"), ("unknown column", "add", "colour"),
              ("empty file", "empty", ""), ("header only", "header", ""), ("duplicated instance", "repeat", ""),
              ("not UTF-8", "bytes", ""), ("extra field", "extra", "")]
    return cases


CATALOG_CASES = _catalog_cases()


def _catalog_file(tmp_path: Path, how: str, value: str) -> Path:
    import csv
    import io

    rows = list(csv.reader(CATALOG.splitlines()))
    header = rows[0]
    if how in header:
        rows[1][header.index(how)] = value
    elif how == "drop":
        index = header.index(value)
        rows = [row[:index] + row[index + 1:] for row in rows]
    elif how == "add":
        rows = [rows[0] + [value]] + [row + ["red"] for row in rows[1:]]
    elif how == "repeat":
        rows.append(rows[1])
    elif how == "extra":
        rows[1].append("surplus")
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows[:1] if how == "header" else rows)
    path = tmp_path / "catalog.csv"
    data = b"" if how == "empty" else buffer.getvalue().encode() + (b"\xff\n" if how == "bytes" else b"")
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("case", CATALOG_CASES, ids=[case[0] for case in CATALOG_CASES])
def test_a_bad_instance_catalog_is_refused_by_catalog_cost_and_plan(case, work, capsys):
    name, how, value = case
    path = _catalog_file(work, how, value)
    refused(["catalog", "--instances", "--catalog", str(path)], work, capsys, names=str(path))
    refused(["cost", str(work / "results" / "resnet50" / CPU_TAG), "--allow-cpu-projection",
             "--catalog", str(path)], work, capsys, names=str(path))


def _skypilot_cases() -> list[tuple[str, str]]:
    header = SKYPILOT.read_text().splitlines()[0].split(",")
    from bench.cost.skypilot import READ

    cases = [(f"missing {column}", f"drop {column}") for column in header if column in READ]
    cases += [("empty", "empty"), ("header only", "header"), ("not UTF-8", "bytes"), ("extra field", "extra"),
              ("a directory", "dir")]
    cases += [(f"--observed {value}", f"observed {value}") for value in
              ("2999-01-01", "2026-13", "x", "", "2026-02-30", "26-01", "2026/01/01")]
    cases += [(f"--today {value}", f"today {value}") for value in ("2999-01-01", "2026-13-01", "x", "", "tomorrow")]
    return cases


SKYPILOT_CASES = _skypilot_cases()


@pytest.mark.parametrize("case", SKYPILOT_CASES, ids=[case[0] for case in SKYPILOT_CASES])
def test_a_bad_skypilot_import_is_refused(case, work, capsys):
    import csv
    import io

    name, how = case
    kind, _, value = how.partition(" ")
    rows = list(csv.reader(SKYPILOT.read_text().splitlines()))
    if kind == "drop":
        index = rows[0].index(value)
        rows = [row[:index] + row[index + 1:] for row in rows]
    elif kind == "extra":
        rows[1].append("surplus")
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows[:1] if kind == "header" else rows)
    path = work / "aws" / "vms.csv"
    path.parent.mkdir()
    if kind == "dir":
        path.mkdir()
    else:
        path.write_bytes(b"" if kind == "empty" else buffer.getvalue().encode() + (b"\xff\n" if kind == "bytes" else b""))
    observed = value if kind == "observed" else "2026-11-30"
    argv = ["catalog", "import", str(path), f"--observed={observed}", "--out", str(work / "merged.csv")]
    refused(argv + ([f"--today={value}"] if kind == "today" else []), work, capsys)


@pytest.mark.slow
def test_a_skypilot_file_of_50000_rows_imports_in_one_pass(work, capsys):
    """Many rows are read, not refused: the import counts them, and a dry run writes nothing."""
    lines = SKYPILOT.read_text().splitlines()
    body = lines[1:]
    path = work / "aws" / "vms.csv"
    path.parent.mkdir()
    path.write_text("\n".join([lines[0], *(body[i % len(body)] for i in range(50_000))]) + "\n")
    before = _snapshot(work)
    assert main(["catalog", "import", str(path), "--observed", "2026-11-30", "--dry-run"]) == 0
    assert "50000 rows" in capsys.readouterr().out
    assert _snapshot(work) == before


# --- every command takes --format json ------------------------------------------------------------------

def test_every_command_takes_format_json_and_answers_bad_input_in_json(capsys):
    from bench.cli import _parser, subcommand_parsers

    for sub, _ in subcommand_parsers(_parser()):
        if any(a.dest == "handler" or a.default is not None for a in sub._actions) and sub.get_default("handler"):
            assert any("--format" in a.option_strings for a in sub._actions), sub.prog
    assert main(["catalog", "--format", "json", "--gpus", "--instances"]) == 2
    answer = json.loads(capsys.readouterr().out)
    assert answer["key"] == "--instances" and "not allowed with" in answer["error"]


def test_catalog_answers_in_json(capsys):
    assert main(["catalog", "--format", "json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["command"] == "catalog" and answer["gpus"] and answer["instances"]["shown"]


# --- concurrency ----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_readers_never_see_a_half_row_while_the_writer_appends(tmp_path):
    runs = RunsFile(tmp_path / "runs.csv")
    template = read_rows(ROWS)
    done = threading.Event()
    seen: list[int] = []

    def append() -> None:
        for index in range(60):
            runs.write({**template[index % len(template)], "cell_id": f"cell-{index}"})
        done.set()

    writer = threading.Thread(target=append)
    writer.start()
    while not done.is_set():
        if runs.path.exists():
            seen.append(len(read_runs(runs.path)))  # raises on a torn or half row
    writer.join()
    assert seen == sorted(seen) and len(read_runs(runs.path)) == 60


def _run_args(results: Path, grid: Path = SMOKE) -> list[str]:
    return ["run", str(grid), "--results", str(results), "--device", "cpu"]


@pytest.mark.serial
def test_report_and_cost_while_run_appends_then_a_second_grid_under_the_same_root(tmp_path, capfd):
    results = tmp_path / "results"
    process = subprocess.Popen([sys.executable, "-m", "bench", *_run_args(results)], cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        answered = 0
        while process.poll() is None and not answered:  # one answer from a folder being appended to
            found = list(results.glob("smoke/*/runs.csv"))
            if found:
                cost = bench_in_process(capfd, "cost", str(found[0].parent), "--allow-cpu-projection", "--format",
                                        "json")  # a reader in this process, the writer in its own
                assert cost.returncode in (0, 2) and "Traceback" not in cost.stderr, cost.stderr[-2000:]
                answered += cost.returncode == 0
            time.sleep(0.5)
    finally:
        process.wait(timeout=600)
    assert process.returncode == 0 and answered >= 1
    other = tmp_path / "other.toml"  # a second grid, one cell, under the same root
    other.write_text(SMOKE.read_text().replace('name = "smoke"', 'name = "other"')
                     .replace('model = ["test_vit", "test_resnet"]', 'model = ["test_vit"]')
                     .replace("pairs = [[8, 1], [2, 4]]", "pairs = [[8, 1]]"))
    second = bench_in_process(capfd, *_run_args(results, other))
    assert second.returncode == 0, second.stderr[-2000:]
    (smoke,) = results.glob("smoke/*/runs.csv")
    (one,) = results.glob("other/*/runs.csv")
    assert len(read_rows(smoke)) == len(load_grid(SMOKE, "cpu").cells) and len(read_rows(one)) == 1


@pytest.mark.slow
def test_claims_in_json_reads_and_writes_nothing(tmp_path, capsys):
    """`bench claims --format json` answers from the rows; CLAIMS.md and every other file stay as they were."""
    shutil.copytree(REPO / "results", tmp_path / "results")
    before = _snapshot(tmp_path / "results")
    assert main(["claims", "--results", str(tmp_path / "results"), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["written"] == []
    assert _snapshot(tmp_path / "results") == before


def test_a_model_that_refuses_the_input_is_one_line_naming_model_input_and_exception(work, capsys):
    """A size below a ViT's patch is refused by its bound, naming the option; a model that passes the bounds and
    still refuses the input (a stem larger than the image, a backbone that returns features) is one line naming
    the model, the input tried and the exception (`bench plan`'s refusals: the next test)."""
    refused(["probe", "test_vit", "--gpu", "H200", "--image-size", "4"], work, capsys,
            names="--image-size 4: not allowed for test_vit, its patch is 16: a side below one patch has no patch")
    refused(["probe", "test_vit", "--gpu", "H200", "--checkpointing", "last-7"], work, capsys,
            names="--checkpointing last-7: not allowed for test_vit, it has 6 blocks")
    assert main(["probe", "test_convnext", "--image-size", "2", "--gpu", "H200", "--format", "json"]) == 2
    answer = json.loads(capsys.readouterr().out)
    assert answer["key"] == "MODEL" and "test_convnext" in answer["error"], answer
    assert "2x3x2x2" in answer["error"] and "Kernel size" in answer["error"], answer  # the input tried, the exception
    refused(["probe", "test_resnet", "--gpu", "H200", "--model-kwargs", '{"features_only": true}'], work, capsys,
            names="not an image classifier for this input")
    grid = work / "tiny.toml"  # in a grid file the same size is refused when the grid is validated (its key named)
    grid.write_text(SMOKE.read_text().replace('model = ["test_vit", "test_resnet"]', 'model = ["test_vit"]')
                    .replace("image_size = [32]", "image_size = [4]"))
    refused(["estimate", str(grid), "--profile", "cpu", "--results", str(work / "estimates")], work, capsys,
            names="grid.image_size[0]: 4 is not allowed for test_vit, its patch is 16")


@pytest.mark.serial  # a cold plan checks the model in the fork server's child its traces then fork from
def test_a_plan_refuses_a_model_its_child_process_checked_in_one_line(work, capsys):
    """A cold plan checks the model in a child process (the parent then never imports torch): a size below a ViT's
    patch, or a model that is not a classifier, is still one line naming the option or the model, exit 2."""
    refused(["plan", "test_vit", "--effective-batch", "8", "--image-size", "4"], work, capsys,
            names="--image-size 4: not allowed for test_vit, its patch is 16: a side below one patch has no patch")
    refused(["plan", "test_resnet", "--effective-batch", "8", "--model-kwargs", '{"features_only": true}'], work,
            capsys, names="not an image classifier for this input")
