"""Shared helpers: grid files written on the fly, the `bench` command run as a user runs it."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def write_grid(tmp_path):
    """Write a grid file from TOML text; returns its path."""
    def write(text: str, name: str = "grid.toml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path
    return write


def run_bench(*args: str, cwd: Path = REPO, **kwargs) -> subprocess.CompletedProcess:
    """`bench ARGS` in a fresh interpreter, as from the command line."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=cwd, capture_output=True,
                          text=True, env=env, timeout=600, **kwargs)


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
        {extra_run}
    """
