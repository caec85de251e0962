"""The throughput model's headline figures that the README and docs/speed.md quote are the generated validation
pages' own (`bench predict --validate`, `make bench-speed`): a refit that moves them fails here until the text says
what the pages say."""

from __future__ import annotations

import re

import pytest
from conftest import REPO

from bench.speed.params import load_model_file

SPEED = REPO / "docs" / "speed"


def _text(path) -> str:
    return " ".join(path.read_text().split())  # hand-written lines wrap anywhere


def _find(pattern: str, path) -> tuple[str, ...]:
    match = re.search(pattern, _text(path))
    assert match, (pattern, path.name)
    return match.groups()


@pytest.fixture(scope="module")
def generated() -> dict[str, tuple[str, ...]]:
    """Median and p90 (or one figure) per headline, as the generated pages print them."""
    validation, hopper = SPEED / "validation.md", SPEED / "hopper_blackwell.md"
    all_rows = _find(r"\*\*Leave-one-GPU-out\*\* [^:]*: median \*\*([\d.]+) %\*\*, p90 \*\*([\d.]+) %\*\* over (\d+) rows",
                     validation)
    (training,) = [line.split(" | ") for line in (SPEED / "targets.md").read_text().splitlines()
                   if line.startswith("| all | all |")]
    return {
        "all rows": all_rows,
        "training rows": (training[2], training[3], training[4]),
        "by source": (training[5], training[6]),
        "by family": _find(r"\*\*Leave-one-family-out\*\* [^:]*: median \*\*([\d.]+) %\*\*, p90 \*\*([\d.]+) %\*\*",
                           validation),
        "coverage": _find(r"held out by source: \*\*([\d.]+) %\*\*", validation),
        "projected": _find(r"off by median \*\*([\d.]+) %\*\*, p90 \*\*([\d.]+) %\*\*", validation),
        "hopper": _find(r"Median \|error\| \(largest\): LOGO ([\d.]+) %", hopper)
        + _find(r"Cross-GPU ratios\*\* [^:]*: median \|error\| ([\d.]+) % \(LOGO\)", hopper),
    }


def test_the_speed_page_quotes_the_generated_validation(generated):
    page = _text(REPO / "docs" / "speed.md")
    median, p90, rows = generated["all rows"]
    quoted = [f"## Method (model {load_model_file().version})",
              f"all {rows} rows: median **{median} %**, p90 **{p90} %**",
              "Training rows only ({}): **{} %** and **{} %**".format(*generated["training rows"]),
              "training rows: median **{} %**, p90 **{} %**".format(*generated["by source"]),
              "**Leave-one-family-out**: median **{} %**, p90 **{} %**".format(*generated["by family"]),
              "**{} %** held out by source".format(*generated["coverage"]),
              "off by median **{} %**, p90 **{} %**".format(*generated["projected"]),
              "median {} %".format(generated["hopper"][0]), "median {} %".format(generated["hopper"][1])]
    assert [q for q in quoted if q not in page] == []


def test_the_readme_quotes_the_generated_validation(generated):
    readme = _text(REPO / "README.md")
    median, p90, rows = generated["all rows"]
    quoted = [f"the model ({load_model_file().version})", f"{median} % median and {p90} % p90 over {rows} rows",
              "{1} % and {2} % on the {0} training rows".format(*generated["training rows"]),
              "leave-one-family-out {} % / {} %".format(*generated["by family"]),
              "leave-one-source-out {} % / {} %".format(*generated["by source"]),
              "held the truth {} % of the time".format(*generated["coverage"]),
              "{} % median, {} % p90 across public pairs of GPUs".format(*generated["projected"]),
              "they are {} % off, ratios between them {} %".format(*generated["hopper"])]
    assert [q for q in quoted if q not in readme] == []
