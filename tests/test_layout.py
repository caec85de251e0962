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
          "planner", "equivalence", "claims", "report", "api", "commands", "cli", "__main__")


def _stage(module: str) -> str:
    """`bench.run.grid_runner` -> "run"; `bench.cli` -> "cli"."""
    return module.split(".")[1]


def _modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own name, not `.__init__`)."""
    found = {}
    for path in sorted((REPO / "bench").rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(path: Path) -> set[str]:
    """The bench modules `path` imports: at the top, inside functions, under `if TYPE_CHECKING:` (a type names the
    module it comes from), `from bench.x import module`, and by name in a string (`"bench.run.ddp_rank"` started
    with -m, a module the fork server preloads)."""
    modules = _modules()
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bench."):
            found |= {f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                      for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("bench.")}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("bench.") \
                and node.value in modules:
            found.add(node.value)
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
                   if _stage(target) != "data" and STAGES.index(_stage(target)) > own]  # data: files, no code
    assert not upward, upward


def test_no_import_circle():
    """Modules import each other one way only, function-level and by-name imports included: a circle means neither
    module can be read (or moved) without the other, and an import order that works only by luck."""
    graph = {module: _imports(path) - {module} for module, path in _modules().items()}
    circles = [component for component in _strongly_connected(graph) if len(component) > 1]
    assert not circles, circles


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of `graph` (iterative: the package is deeper than it is wide, but why risk it)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, targets = work[-1]
            target = next((t for t in targets if t in graph), None)
            if target is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = stack[stack.index(node):]
                    del stack[stack.index(node):]
                    components.append(sorted(component))
            elif target not in index:
                index[target] = low[target] = len(index)
                stack.append(target)
                work.append((target, iter(sorted(graph[target]))))
            elif target in stack:
                low[node] = min(low[node], index[target])
    return components


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
