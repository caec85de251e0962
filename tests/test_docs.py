"""The documentation: its examples run, its links resolve, nothing points outside the repository."""

from __future__ import annotations

import re
import subprocess

import pytest
from conftest import REPO

DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES_BEING_WRITTEN = {"docs/speed.md", "docs/reliability.md"}
"""Linked from the README and the index while other branches write them."""


def _python_blocks(path):
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.S | re.M)


@pytest.mark.serial  # measure_cell starts a cell's process
def test_the_api_page_runs(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    blocks = _python_blocks(REPO / "docs" / "api.md")
    assert len(blocks) >= 5
    namespace: dict = {"__name__": "docs_api"}
    for block in blocks:
        exec(compile(block, "docs/api.md", "exec"), namespace)  # noqa: S102 - the docs' own examples
    printed = capsys.readouterr().out
    # the outputs the page quotes in its comments are what the blocks printed
    for block in blocks:
        for quoted in re.findall(r"^# (.+)$", block, flags=re.M):  # a whole-line comment quotes output
            assert quoted in printed, f"docs/api.md quotes {quoted!r}, the block printed:\n{printed}"


def _links(path):
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
        if not re.match(r"[a-z]+://", target):
            yield target


@pytest.mark.parametrize("path", [REPO / "README.md", *DOCS], ids=lambda p: p.name)
def test_links_resolve(path):
    missing = []
    for target in _links(path):
        resolved = (path.parent / target).resolve()
        relative = resolved.relative_to(REPO).as_posix() if resolved.is_relative_to(REPO) else str(resolved)
        if not resolved.exists() and relative not in PAGES_BEING_WRITTEN:
            missing.append(target)
    assert not missing


def test_every_page_starts_with_its_question():
    for path in DOCS:
        title = path.read_text().splitlines()[0]
        assert title.startswith("# ") and ("?" in title or ":" in title), path.name


def test_readme_is_short_and_opens_with_the_two_commands():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 200
    assert any(line.startswith("make bench-resnet") for line in lines[:6])
    assert any(line.startswith("make test") for line in lines[:6])


def test_nothing_refers_outside_the_repository():
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    offending = []
    for name in tracked:
        if not name.endswith((".md", ".py", ".toml", ".sh", ".txt", ".cfg")) or name == "tests/test_docs.py":
            continue
        text = (REPO / name).read_text(errors="replace")
        offending += [f"{name}: {hit}" for hit in re.findall(r"\.\./shared|DESIGN\.md|shared/seeds", text)]
    assert not offending
