"""The package's shape: stages import only stages below them; cell ids of committed rows stay put."""

from __future__ import annotations

import ast
import csv
from pathlib import Path

import pytest
from conftest import REPO

from bench.grid.cell import Cell
from bench.grid.spec import load_grid

# The data's path, lowest first. A module may import its own stage or one below it.
STAGES = ("units", "errors", "frames", "isolation", "cache", "grid", "train", "measure", "results", "run", "memory", "speed", "cost",
          "equivalence", "claims", "report", "api", "commands", "cli", "__main__")


def _stage(module: str) -> str:
    """`bench.run.grid_runner` -> "run"; `bench.cli` -> "cli"."""
    return module.split(".")[1]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bench."):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("bench.")}
    return found


def test_no_module_imports_a_stage_above_its_own():
    package = REPO / "bench"
    upward = []
    for path in sorted(package.rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)
        if module in ("bench.__init__", "bench.data.__init__") or _stage(module) == "data":
            continue
        own = STAGES.index(_stage(module))
        upward += [f"{module} imports {target}" for target in _imports(path)
                   if STAGES.index(_stage(target)) > own]
    assert not upward, upward


def test_every_stage_is_listed():
    packages = {path.name for path in (REPO / "bench").iterdir() if path.is_dir() and (path / "__init__.py").exists()}
    modules = {path.stem for path in (REPO / "bench").glob("*.py")} - {"__init__"}
    assert (packages - {"data"}) | modules == set(STAGES)


# Ids pinned by literals: a change to Cell, the id scheme or the axes that would orphan committed
# rows (they would be measured again, and their old rows never matched) fails here first.
PINNED = {
    Cell(experiment="resnet50", profile="cpu", model="resnet50", image_size=32, micro_batch=16, accum_steps=1,
         precision="fp32", checkpointing="off", optimizer="adamw", channels_last=True, warmup_steps=1,
         measured_steps=3): "resnet50-32px-16x1-fp32-ckpt_off-adamw-cl-3474e652",
    Cell(experiment="ddp", profile="cpu", model="test_vit", image_size=32, micro_batch=2, accum_steps=4,
         precision="fp32", checkpointing="off", optimizer="sgd", channels_last=False, warmup_steps=1,
         measured_steps=3, world_size=2, ddp_sync="every_step"):
        "test_vit-32px-2x4-fp32-ckpt_off-sgd-world_size_2-ddp_sync_every_step-ecde9c15",
}


@pytest.mark.parametrize("cell", PINNED, ids=[cell.experiment for cell in PINNED])
def test_cell_ids_are_pinned(cell):
    assert cell.cell_id == PINNED[cell]


def test_every_committed_row_belongs_to_a_cell_of_its_grid():
    ids: dict[str, set[str]] = {}
    for path in sorted((REPO / "experiments").rglob("*.toml")):
        for profile in ("cpu", "cuda"):
            grid = load_grid(path, profile, check_models=False)
            ids.setdefault(grid.name, set()).update(cell.cell_id for cell in grid.cells)
    orphans = []
    for runs in sorted((REPO / "results").glob("*/*/runs.csv")):
        experiment = runs.parent.parent.name
        if experiment not in ids:  # not a grid's rows (the claims' autotune answers)
            continue
        with runs.open(newline="") as handle:
            orphans += [f"{runs}: {row['cell_id']}" for row in csv.DictReader(handle)
                        if row["cell_id"] not in ids[experiment]]
    assert not orphans, orphans[:5]
