"""The figures the README and docs/grids.md quote about the committed CPU run are the rows' own: a
re-measurement that changes them fails here until the text says what the rows say."""

from __future__ import annotations

import re

import pandas as pd
import pytest
from conftest import REPO

from bench.results.read import read_runs

GRIDS_PAGE = REPO / "docs" / "grids.md"


def _quoted_runs_file() -> str:
    """The committed CPU runs file docs/grids.md names, whichever machine measured it."""
    (path,) = set(re.findall(r"results/resnet50/cpu-[\w.-]+/runs\.csv", GRIDS_PAGE.read_text()))
    return path


@pytest.fixture(scope="module")
def figures() -> dict[str, str]:
    rows = read_runs(REPO / _quoted_runs_file())
    ok = rows[rows.status == "ok"]
    return {
        "cells": f"{len(rows)} cells",
        "cell time": f"{round(float(rows.duration_s.sum())):,} s of cell time",
        "ok": f"{len(ok)} of {len(rows)} cells ok",
        "within 10 %": f"{int((ok.step_time_ci95_rel <= 0.10).sum())} with the median's 95 % interval under 10 %",
        "within target": f"{int(ok.ci95_target_met.astype('boolean').fillna(False).sum())} within the "
                         f"{100 * ok.ci95_target_rel.max():g} % target",
    }


def _readme_row() -> str:
    (row,) = [line for line in (REPO / "README.md").read_text().splitlines()
              if line.startswith("| `make bench-resnet` on a CPU")]
    return row


@pytest.mark.parametrize("name", ["cells", "cell time", "ok", "within 10 %", "within target"])
def test_the_readme_quotes_the_committed_cpu_rows(figures, name):
    assert figures[name] in _readme_row(), (figures[name], _readme_row())


@pytest.mark.parametrize("name", ["cells", "cell time", "within target"])
def test_the_grids_page_quotes_the_committed_cpu_rows(figures, name):
    text = " ".join(GRIDS_PAGE.read_text().split())  # its lines wrap anywhere
    assert figures[name] in text, figures[name]


def test_the_committed_cpu_rows_were_timed_alone():
    rows = read_runs(REPO / _quoted_runs_file())
    assert not rows.loaded.astype("boolean").fillna(True).any()  # every row measured its foreign load, none loaded
    assert pd.to_numeric(rows.foreign_load_cores).max() < 0.25
