"""The runs file: rows from an earlier schema stay readable, unknown schemas are refused."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from conftest import REPO

import bench.results.read
import bench.results.store
from bench.results.read import file_schema, read_runs, read_text
from bench.results.rows import checked
from bench.results.schema import SCHEMAS
from bench.results.store import ResultsFileError, RunsFile

OLD = {"cell_id": "", "status": "", "samples_per_s": ""}
NEW = {**OLD, "world_size": "axis added later", "allreduce_ms": "measurement added later"}


def test_an_older_file_reads_with_new_axes_at_their_default_and_takes_rows_under_todays_header(tmp_path,
                                                                                             monkeypatch):
    monkeypatch.setattr(bench.results.read, "extra_axis_defaults", lambda: {"world_size": 1})
    path = tmp_path / "runs.csv"
    RunsFile(path, OLD).write({"cell_id": "a", "status": "ok", "samples_per_s": 10.5})

    runs = RunsFile(path, NEW, history=True)
    assert runs.rows() == [{"cell_id": "a", "status": "ok", "samples_per_s": "10.5",
                            "world_size": "1", "allreduce_ms": ""}]
    note = runs.upgrade_older_header()
    assert note == (f"{path}: written by an earlier version of bench; rewritten under today's header, its rows as "
                    "they were (2 columns added, e.g. world_size)")
    assert path.read_text().splitlines() == [",".join(NEW), "a,ok,10.5,1,"]
    assert runs.upgrade_older_header() is None  # once
    runs.write({"cell_id": "b", "status": "ok", "samples_per_s": 9.0, "world_size": 2, "allreduce_ms": 1.5})
    assert path.read_text().splitlines()[1:] == ["a,ok,10.5,1,", "b,ok,9.0,2,1.5"]


def test_an_older_file_keeps_every_measurement_of_a_cell_measured_twice(tmp_path):
    """A cell measured again is appended: the rewrite under today's header keeps its earlier row too, whether the
    runner rewrites the file before measuring or a row is written to it directly."""
    older = [{"cell_id": "a", "status": "ok", "samples_per_s": 10.5}, {"cell_id": "a", "status": "ok",
                                                                         "samples_per_s": 11.0}]
    for upgrade_first in (True, False):
        path = tmp_path / f"runs-{upgrade_first}.csv"
        for row in older:
            RunsFile(path, OLD, history=True).write(row)
        runs = RunsFile(path, NEW, history=True)
        if upgrade_first:
            runs.upgrade_older_header()
        runs.write({"cell_id": "a", "status": "ok", "samples_per_s": 9.0})
        assert path.read_text().splitlines() == [",".join(NEW), "a,ok,10.5,1,", "a,ok,11.0,1,", "a,ok,9.0,,"]


def test_an_older_file_the_disk_will_not_take_rewritten_stays_as_it_was(tmp_path, monkeypatch):
    path = tmp_path / "runs.csv"
    RunsFile(path, OLD).write({"cell_id": "a", "status": "ok", "samples_per_s": 10.5})
    before = path.read_bytes()

    def full_disk(*args):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(bench.results.store.os, "replace", full_disk)
    with pytest.raises(ResultsFileError, match=f"^{path}: written by an earlier version of bench; its rows could "
                                               "not be rewritten .*No space left on device.*as it was$"):
        RunsFile(path, NEW, history=True).upgrade_older_header()
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["runs.csv"]


def test_a_computed_file_of_an_older_schema_is_recomputed_with_todays_header(tmp_path):
    path = tmp_path / "runs.csv"
    RunsFile(path, OLD, history=False).write({"cell_id": "a", "status": "estimated", "samples_per_s": 10.5})
    RunsFile(path, NEW, history=False).write({"cell_id": "a", "status": "estimated", "samples_per_s": 9.0})
    assert path.read_text().splitlines() == [",".join(NEW), "a,estimated,9.0,,"]


def test_a_file_with_a_column_this_version_does_not_know_is_refused(tmp_path):
    path = tmp_path / "runs.csv"
    RunsFile(path, NEW).write({"cell_id": "a", "status": "ok"})
    with pytest.raises(ResultsFileError, match="'world_size' is not in this version's schema"):
        RunsFile(path, OLD).rows()


COMMITTED = sorted((REPO / "results").glob("*/*/runs.csv"))


@pytest.mark.parametrize("path", COMMITTED, ids=[f"{p.parent.parent.name}/{p.parent.name}" for p in COMMITTED])
def test_a_committed_files_kind_follows_from_its_header_and_fits_its_rows(path):
    schema = file_schema(path)
    statuses = set(read_runs(path, schema.columns).status)
    assert statuses <= set(schema.statuses), (schema.kind, statuses)  # no computed file holds an ok row
    said = "predicted" if "predicted" in statuses else "estimated" if "estimated" in statuses else "measured"
    assert schema.kind == said or (schema.kind, said) == ("autotune", "estimated")


@pytest.mark.slow
def test_report_tells_rows_by_their_header_not_by_the_folder_they_lie_in(tmp_path, capsys):
    from bench.cli import main

    predicted = tmp_path / "resnet50" / "cpu-renamed"
    predicted.mkdir(parents=True)
    shutil.copy(REPO / "results" / "resnet50" / "predicted" / "runs.csv", predicted / "runs.csv")
    assert main(["report", str(predicted)]) == 2
    assert "predicted rows (bench predict)" in capsys.readouterr().err
    estimates = tmp_path / "resnet50" / "predicted"  # estimates in a folder named as a prediction's
    estimates.mkdir()
    shutil.copy(REPO / "results" / "resnet50" / "estimate" / "runs.csv", estimates / "runs.csv")
    assert main(["report", str(estimates)]) == 0
    assert (estimates / "memory_estimate.png").is_file()
    answers = tmp_path / "claims_autotune" / "estimate"  # the auto-tuner's answers: no chart, no report
    answers.mkdir(parents=True)
    shutil.copy(REPO / "results" / "claims_autotune" / "estimate" / "runs.csv", answers / "runs.csv")
    assert main(["report", str(answers)]) == 2
    assert "bench claims reads them" in capsys.readouterr().err and sorted(answers.iterdir()) == [answers / "runs.csv"]


@pytest.mark.parametrize(("kind", "status"), [("measured", "estimated"), ("measured", "predicted"),
                                              ("estimated", "ok"), ("predicted", "ok"), ("predicted", "estimated"),
                                              ("autotune", "ok")])
def test_no_row_is_built_with_another_kinds_outcome(kind, status):
    with pytest.raises(ValueError, match=f"row cannot have status '{status}'"):
        checked(kind, {"cell_id": "a", "status": status})


READ_AS_ANOTHER_KIND = [("measured", "estimated"), ("measured", "predicted"), ("estimated", "ok"),
                        ("estimated", "timeout"), ("predicted", "ok"), ("predicted", "estimated"), ("autotune", "ok"),
                        ("autotune", "error")]


@pytest.mark.parametrize(("kind", "status"), READ_AS_ANOTHER_KIND)
def test_the_reader_refuses_a_row_with_another_kinds_outcome_naming_line_and_column(kind, status, tmp_path):
    """A runs file is read with its kind's statuses (`SCHEMAS`), not every status: an `ok` row in an estimates file
    would otherwise read as a measurement."""
    schema = SCHEMAS[kind]
    path = tmp_path / "runs.csv"
    path.write_text(f"cell_id,status\na-1,{schema.statuses[0]}\na-2,{status}\n")
    allowed = re.escape(", ".join(schema.statuses))
    with pytest.raises(ResultsFileError, match=f"line 3, column status: '{status}' is not one of {allowed};"):
        read_text(path, schema.columns)
    path.write_text(f"cell_id,status\na-1,{schema.statuses[0]}\n")
    assert [row["status"] for row in read_text(path, schema.columns).rows] == [schema.statuses[0]]


def test_no_row_is_built_with_a_column_its_kind_does_not_declare():
    assert checked("predicted", {"cell_id": "a", "gpu": "L4", "status": "predicted"})["gpu"] == "L4"
    with pytest.raises(ValueError, match=r"a measured row has undeclared columns: \['gpu'\]"):
        checked("measured", {"cell_id": "a", "gpu": "L4", "status": "ok"})


def test_a_row_calls_the_harness_dirty_for_changed_code_not_for_re_measured_results(tmp_path):
    from bench.results.provenance import git_state

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)
    (tmp_path / "results" / "resnet50").mkdir(parents=True)
    (tmp_path / "results" / "resnet50" / "runs.csv").write_text("cell_id\nold\n")
    (tmp_path / "step.py").write_text("STEPS = 1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "first")
    (tmp_path / "results" / "resnet50" / "runs.csv").unlink()  # a committed folder being re-measured
    assert git_state(tmp_path)[1] is False
    (tmp_path / "step.py").write_text("STEPS = 2\n")
    assert git_state(tmp_path)[1] is True
