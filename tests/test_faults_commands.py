"""The fault suite, third pass (#41 items 9-12, 14, 16-18, 20): commands that answered bad input with a traceback,
wrote where they promised not to, or accepted what another command refuses.

Each case runs in this process through `bench.cli.main(argv)`; a refused one is checked as in
`tests/test_faults_cli.py` (`refused`): exit 2, one line on stderr (and one JSON object with `--format json`), no
traceback, nothing written. docs/reliability.md lists the promises.
"""

from __future__ import annotations

import builtins
import csv
import errno
import io
import os
import shutil
import time
from pathlib import Path

import pytest
from conftest import CPU_TAG, REPO
from test_faults_cli import SKYPILOT, _catalog_file, _snapshot, refused, work  # noqa: F401 - `work` is a fixture

from bench.cli import main

SMOKE = REPO / "experiments" / "smoke.toml"
GRID = """\
[experiment]
name = "faults"

[grid]
model = {model}
image_size = {image_size}
effective_batch = 8
pairs = [[8, 1]]
precision = ["fp32"]
checkpointing = {checkpointing}

[run]
timeout_s = {timeout_s}
"""


def _grid(work: Path, model: str = '["test_vit"]', image_size: str = "[32]", checkpointing: str = '["off"]',
          timeout_s: str = "120") -> Path:
    path = work / "work" / "grid.toml"
    path.write_text(GRID.format(model=model, image_size=image_size, checkpointing=checkpointing, timeout_s=timeout_s))
    return path


def refused_as_text(argv: list[str], root: Path, capsys, names: str) -> None:
    """`refused` for a command whose JSON answer is a read and so is not refused (`claims`): text only."""
    before = _snapshot(root)
    code = main(argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and names in lines[0], lines
    assert _snapshot(root) == before, argv


# --- item 9: a filter that matches nothing ------------------------------------------------------------------------

@pytest.mark.parametrize("only", [["image_size=abc"], ["model=resnet50"], ["precision=bf16"],
                                  ["model=test_vit", "image_size=64"]], ids=" ".join)
def test_predict_with_a_filter_matching_no_cell_is_one_line_naming_the_filter(only, work, capsys):
    """Was a FileNotFoundError traceback (the empty prediction wrote no rows to read back)."""
    argv = ["predict", str(SMOKE), "--results", str(work / "results"), *(f"--only={o}" for o in only)]
    refused(argv, work, capsys, names="--only")


# --- item 10: --today before any price ----------------------------------------------------------------------------

@pytest.mark.parametrize("day", ["0001-01-01", "0001-06-30", "1999-12-31"])
def test_catalog_and_its_import_refuse_a_today_before_any_price(day, work, capsys):
    """Was `ValueError: year 0 is out of range` (six months before 0001-01-01 is no date)."""
    refused(["catalog", f"--today={day}"], work, capsys, names="--today")
    path = work / "aws" / "vms.csv"
    path.parent.mkdir(exist_ok=True)
    shutil.copy(SKYPILOT, path)
    refused(["catalog", "import", str(path), "--observed", "2026-11-30", "--dry-run", f"--today={day}"], work, capsys,
            names="--today")


# --- item 11: destinations that cannot be written -----------------------------------------------------------------

@pytest.fixture
def read_only(monkeypatch):
    """`read_only(folder)`: from then on, creating or writing anything under `folder` fails with EACCES, as in a
    read-only folder (modes alone would not do: the tests may run as root, whom a mode does not stop)."""
    def refuse(folder: Path) -> None:
        folder = Path(folder).resolve()

        def under(path) -> bool:
            return isinstance(path, (str, os.PathLike)) and Path(os.path.abspath(path)).is_relative_to(folder)

        def denied(path) -> OSError:
            return PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

        def guarded_open(original):
            def open_(file, mode="r", *args, **kwargs):
                if under(file) and set(str(mode)) & set("wax+"):
                    raise denied(file)
                return original(file, mode, *args, **kwargs)
            return open_

        os_open, mkdir = os.open, os.mkdir

        def open_fd(path, flags, *args, **kwargs):
            if under(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
                raise denied(path)
            return os_open(path, flags, *args, **kwargs)

        def make_dir(path, *args, **kwargs):
            if under(path):
                raise denied(path)
            return mkdir(path, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", guarded_open(builtins.open))
        monkeypatch.setattr(io, "open", guarded_open(io.open))
        monkeypatch.setattr(os, "open", open_fd)
        monkeypatch.setattr(os, "mkdir", make_dir)
    return refuse


def _claims_root(work: Path, pattern: str = "claims_*") -> Path:
    """A results root holding the committed claims rows (the autotune rows included), or those matching `pattern`."""
    root = work / "claims-results"
    for folder in (REPO / "results").glob(pattern):
        shutil.copytree(folder, root / folder.name)
    return root


def _spoilt_destinations(work: Path) -> list[tuple[str, list[str], Path]]:
    """(name, argv, the folder the command writes into) for each command that writes, both spoilt ways."""
    rows = work / "results" / "resnet50" / CPU_TAG
    merged = work / "out"
    merged.mkdir()
    skypilot = work / "aws" / "vms.csv"
    skypilot.parent.mkdir()
    shutil.copy(SKYPILOT, skypilot)
    return [("report", ["report", str(rows)], rows),
            ("cost", ["cost", str(rows), "--allow-cpu-projection"], rows / "cost"),
            ("catalog import", ["catalog", "import", str(skypilot), "--observed", "2026-11-30",
                                "--out", str(merged / "merged.csv")], merged),
            ("plan", ["plan", "test_resnet", "--effective-batch", "8", "--image-size", "32", "--gpu", "A100-40GB",
                      "--launch-spec", str(merged / "task.yaml")], merged)]


@pytest.mark.parametrize("command", ["report", "cost", "catalog import", "plan"])
def test_a_read_only_destination_is_one_line_before_anything_is_written(command, work, read_only, capsys):
    """Were PermissionError tracebacks (`run`, `measure`, `estimate` and `predict` already refused cleanly)."""
    name, argv, folder = next(case for case in _spoilt_destinations(work) if case[0] == command)
    folder.mkdir(exist_ok=True)
    read_only(folder)
    refused(argv, work, capsys, names="cannot take")


@pytest.mark.parametrize("command", ["estimate", "predict"])
def test_estimate_and_predict_into_a_read_only_root_refuse_as_the_others_do(command, work, read_only, capsys):
    """Were one line already, but a different one ("the row could not be written ... printed below")."""
    read_only(work / "results")
    refused([command, str(SMOKE), "--results", str(work / "results")], work, capsys, names="cannot take")


def test_claims_into_a_read_only_root_is_one_line_before_anything_is_estimated(work, read_only, capsys):
    root = _claims_root(work)
    (root / "claims").mkdir(exist_ok=True)
    read_only(root / "claims")
    refused_as_text(["claims", "--results", str(root)], work, capsys, names="cannot take")


@pytest.mark.parametrize("command", ["cost", "plan"])
def test_a_file_where_the_destination_folder_should_be_is_one_line(command, work, capsys):
    """Were FileExistsError tracebacks."""
    name, argv, folder = next(case for case in _spoilt_destinations(work) if case[0] == command)
    if folder.exists():
        folder.rmdir()
    folder.write_text("a file, not a folder\n")
    refused(argv, work, capsys, names="cannot take")


def test_claims_with_a_file_where_its_folder_should_be_is_one_line(work, capsys):
    root = _claims_root(work)
    (root / "claims").write_text("a file, not a folder\n")
    refused_as_text(["claims", "--results", str(root)], work, capsys, names="cannot take")


def test_a_launch_spec_named_as_an_existing_folder_is_one_line(work, capsys):
    (work / "task.yaml").mkdir()
    refused(["plan", "test_resnet", "--effective-batch", "8", "--image-size", "32", "--launch-spec",
             str(work / "task.yaml")], work, capsys, names="--launch-spec")


# --- item 12: one set of bounds for `measure` and a grid -----------------------------------------------------------
# `measure --measured-steps 1000000` (a pydantic ValidationError before 3ab6bbe) is one of MEASURE_CASES in
# tests/test_faults_cli.py (`test_measure_refuses_what_a_grid_file_refuses`), with 10001 and the grid's other bounds.


# --- item 14: `claims --format json` is a read --------------------------------------------------------------------

@pytest.mark.slow  # in-process, but evaluating every claim takes some 30 s
def test_claims_in_json_computes_and_writes_no_autotune_rows(work, monkeypatch, capsys):
    """Was: the missing autotune rows estimated (minutes) and written to claims_autotune/estimate/runs.csv."""
    import bench.claims.autotune

    root = _claims_root(work, "claims_allocator")  # one folder of claims rows, no autotune rows: evaluated quickly

    def estimated(*args, **kwargs):
        raise AssertionError("a JSON answer estimated the autotune rows")

    monkeypatch.setattr(bench.claims.autotune, "probe_from_estimate", estimated)
    before = _snapshot(root)
    assert main(["claims", "--results", str(root), "--format", "json"]) == 0
    assert _snapshot(root) == before
    assert not (root / "claims_autotune").exists()


# --- item 16: a long axis is refused by its size, at once ---------------------------------------------------------

def test_a_50000_name_axis_is_refused_by_the_cell_limit_in_seconds(work, capsys):
    """Was 20 s: the repeated-value check compared every name with those before it, before the size was checked."""
    names = ", ".join(f'"model_{index}"' for index in range(50_000))
    path = _grid(work, model=f"[{names}]")
    began = time.monotonic()
    refused(["list", str(path), "--profile", "cuda"], work, capsys, names="50,000 cells")
    assert time.monotonic() - began < 8, "two refusals (text, JSON) of a 50,000-name grid"


def test_the_cell_limit_is_checked_before_repeats(work, capsys):
    names = ", ".join(f'"model_{index}"' for index in range(20_000))
    path = _grid(work, model=f'[{names}, "model_0"]')
    refused(["list", str(path), "--profile", "cuda"], work, capsys, names="20,001 cells")


def test_repeats_are_found_in_linear_time():
    from bench.grid.spec import _no_repeats

    values = [f"model_{index}" for index in range(50_000)]
    began = time.monotonic()
    with pytest.raises(ValueError, match=r"\[50000\] 'model_7' repeats \[7\]"):
        _no_repeats([*values, "model_7"])
    assert time.monotonic() - began < 2


# --- item 17: `list` validates as `run` does ----------------------------------------------------------------------

LIST_REFUSES = [
    ("a ViT side its patch does not divide", {"image_size": "[40]"}, "grid.image_size[0]"),
    ("last-7 on a 6-block ViT", {"checkpointing": '["last-7"]'}, "grid.checkpointing[0]"),
    ("Swin at 30 px", {"model": '["swin_tiny_patch4_window7_224"]', "image_size": "[30]"}, "grid.image_size[0]"),
]


@pytest.mark.parametrize("profile", ["cuda", "cpu"])
@pytest.mark.parametrize("case", LIST_REFUSES, ids=[case[0] for case in LIST_REFUSES])
def test_list_refuses_what_run_and_estimate_refuse(case, profile, work, capsys):
    """Was: `list` exit 0 on grids `run`, `estimate` and `predict` refuse (the model's bounds were theirs alone)."""
    _, keys, key = case
    path = _grid(work, **keys)
    refused(["list", str(path), "--profile", profile], work, capsys, names=key)
    refused(["estimate", str(path), "--results", str(work / "results")], work, capsys, names=key)


# --- item 18: subnormal time-outs, a model named twice ------------------------------------------------------------

@pytest.mark.parametrize("timeout_s", ["5e-324", "1e-310"])
def test_a_grid_refuses_a_subnormal_timeout_as_the_command_line_does(timeout_s, work, capsys):
    path = _grid(work, timeout_s=timeout_s)
    refused(["list", str(path), "--profile", "cuda"], work, capsys, names="run.timeout_s")
    refused(["run", str(SMOKE), "--results", str(work / "results"), f"--timeout-s={timeout_s}"], work, capsys,
            names="--timeout-s")


def test_a_model_with_a_trailing_dot_is_refused_not_measured_again(work, capsys):
    """Was: `test_vit.` and `test_vit` two models of one grid, every cell measured twice."""
    path = _grid(work, model='["test_vit", "test_vit."]')
    refused(["list", str(path), "--profile", "cuda"], work, capsys, names="grid.model[1]")
    refused(["measure", "test_vit.", "--micro-batch", "2", "--image-size", "32", "--results",
             str(work / "results")], work, capsys, names="test_vit.")


# --- item 20: catalog values within bounds ------------------------------------------------------------------------

CATALOG_BOUNDS = [("gpu_count", "100000000000000000000"), ("gpu_count", "65"), ("usd_per_hour", "1e308"),
                  ("usd_per_hour", "10001"), ("spot_usd_per_hour", "1e308"),
                  ("vcpus", "100000"), ("instance", "p4d\x0024xlarge"), ("instance", "p4d\x1b[2J"),
                  ("region", "us\x00east"), ("provider", "a" * 41), ("source", "s" * 1001)]


@pytest.mark.parametrize("case", CATALOG_BOUNDS, ids=[f"{c}={v[:12]!r}" for c, v in CATALOG_BOUNDS])
def test_a_catalog_value_out_of_bounds_is_refused_naming_file_line_and_column(case, work, capsys):
    """Were accepted: a 1e20-GPU instance listed, a $1e308/hour price printed `usd_per_run inf`."""
    column, value = case
    path = _catalog_file(work, column, value)
    refused(["catalog", "--instances", "--catalog", str(path)], work, capsys, names=f"column {column}")
    refused(["cost", str(work / "results" / "resnet50" / CPU_TAG), "--allow-cpu-projection", "--catalog", str(path)],
            work, capsys, names=str(path))


SKYPILOT_BOUNDS = [("AcceleratorCount", "1e20"), ("AcceleratorCount", "128"), ("Price", "1e308"), ("Price", "inf"),
                   ("SpotPrice", "nan"), ("vCPUs", "inf"), ("vCPUs", "1e9"), ("InstanceType", "p4d\x0024xlarge")]


@pytest.mark.parametrize("case", SKYPILOT_BOUNDS, ids=[f"{c}={v!r}" for c, v in SKYPILOT_BOUNDS])
def test_a_skypilot_value_out_of_bounds_is_refused_naming_file_line_and_column(case, work, capsys):
    column, value = case
    rows = list(csv.reader(SKYPILOT.read_text().splitlines()))
    header = rows[0]
    line = next(index for index, row in enumerate(rows) if index and row[header.index("AcceleratorName")] == "A100")
    rows[line][header.index(column)] = value
    path = work / "aws" / "vms.csv"
    path.parent.mkdir()
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    path.write_text(buffer.getvalue())
    refused(["catalog", "import", str(path), "--observed", "2026-11-30", "--dry-run"], work, capsys,
            names=f"{path}: line {line + 1}, column {column}")
