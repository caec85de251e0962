"""The package metadata agrees with the code: the Python it declares can run it, extras are optional."""

from __future__ import annotations

import ast
import re
import sys
import tomllib

import pytest

from conftest import REPO

# Standard-library modules and names newer than 3.9, with the version that added them. A use of one
# raises the floor `requires-python` must declare.
NEWER_MODULES = {"tomllib": (3, 11), "graphlib": (3, 9), "zoneinfo": (3, 9)}
NEWER_NAMES = {("typing", "Self"): (3, 11), ("typing", "LiteralString"): (3, 11), ("typing", "Never"): (3, 11),
               ("typing", "assert_never"): (3, 11), ("typing", "Required"): (3, 11),
               ("typing", "NotRequired"): (3, 11), ("enum", "StrEnum"): (3, 11), ("datetime", "UTC"): (3, 11),
               ("typing", "override"): (3, 12), ("itertools", "batched"): (3, 12),
               ("typing", "TypeAlias"): (3, 10), ("typing", "ParamSpec"): (3, 10),
               ("itertools", "pairwise"): (3, 10), ("typing", "TypeGuard"): (3, 10)}


def _declared() -> tuple[int, int]:
    spec = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    major, minor = re.fullmatch(r">=\s*(\d+)\.(\d+)", spec.split(",")[0].strip()).groups()
    return int(major), int(minor)


def _sources():
    for path in sorted((REPO / "bench").rglob("*.py")) + sorted((REPO / "scripts").glob("*.py")):
        yield path, path.read_text()


def _needed(tree: ast.AST) -> list[tuple[tuple[int, int], str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(NEWER_MODULES[a.name.split(".")[0]], a.name) for a in node.names
                      if a.name.split(".")[0] in NEWER_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module:
            top = node.module.split(".")[0]
            if top in NEWER_MODULES:
                found.append((NEWER_MODULES[top], node.module))
            found += [(NEWER_NAMES[(node.module, a.name)], f"{node.module}.{a.name}") for a in node.names
                      if (node.module, a.name) in NEWER_NAMES]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            key = (node.value.id, node.attr)
            if key in NEWER_NAMES:
                found.append((NEWER_NAMES[key], f"{key[0]}.{key[1]}"))
    return found


def test_requires_python_covers_the_newest_stdlib_the_code_uses():
    declared = _declared()
    too_new = [f"{path.relative_to(REPO)}: {name} needs Python {v[0]}.{v[1]}"
               for path, text in _sources() for v, name in _needed(ast.parse(text)) if v > declared]
    assert not too_new, f"requires-python >={declared[0]}.{declared[1]}, but: {too_new}"


def test_the_code_parses_as_the_declared_python():
    """Syntax newer than requires-python (a `type` alias, PEP 695 generics, ...) fails here."""
    declared = _declared()
    failing = []
    for path, text in _sources():
        try:
            ast.parse(text, feature_version=declared)
        except SyntaxError as exc:
            failing.append(f"{path.relative_to(REPO)}:{exc.lineno}: {exc.msg}")
    assert not failing


def test_the_floor_is_the_one_the_code_needs():
    """tomllib (3.11) is used, so the floor is 3.11: neither lower (broken installs) nor higher for no reason."""
    needed = max(v for _, text in _sources() for v, _ in _needed(ast.parse(text)))
    assert _declared() == needed == (3, 11)
    assert sys.version_info[:2] >= _declared()


@pytest.mark.parametrize("extra, package", [("slurm", "submitit"), ("cloud", "skypilot")])
def test_executors_are_extras_that_the_dev_install_still_tests(extra, package):
    """A user of the harness alone installs neither; `make install` takes both, so the SLURM path runs and a written
    SkyPilot task is parsed by SkyPilot itself in the tests, with the pinned versions of constraints.txt."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not any(dep.startswith(package) for dep in project["dependencies"])
    assert any(dep.startswith(package) for dep in project["optional-dependencies"][extra])
    assert "'.[dev,slurm,cloud]'" in (REPO / "Makefile").read_text()
    assert re.search(rf"^{package}==", (REPO / "constraints.txt").read_text(), re.MULTILINE)
