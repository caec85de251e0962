"""Grid files: expansion into cells, profiles, and clean failures on bad input."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import REPO, bench_in_process, tiny_grid

from bench.cli import main
from bench.errors import GridFileError
from bench.grid.cell import Cell, axis
from bench.grid.spec import load_grid, require_precisions

GOOD = """
    [experiment]
    name = "g"

    [grid]
    model = ["test_vit", "test_resnet"]
    image_size = [32]
    effective_batch = 8
    pairs = [[8, 1], [4, 2], [2, 4]]
    precision = ["fp32", "bf16"]
    checkpointing = ["off", "full"]
    optimizer = ["adamw", "sgd"]

    [profile.cpu]
    description = "smaller"

    [profile.cpu.grid]
    image_size = [16]
    precision = ["fp32"]

    [profile.cpu.run]
    measured_steps = 2
"""


def test_grid_is_the_cartesian_product_of_its_axes(write_grid):
    grid = load_grid(write_grid(GOOD), "cuda")
    assert len(grid.cells) == 2 * 3 * 2 * 2 * 2
    assert len({cell.cell_id for cell in grid.cells}) == len(grid.cells)
    assert {cell.effective_batch for cell in grid.cells} == {8}


def test_cpu_profile_overrides_axes_and_steps_and_labels_cells(write_grid):
    grid = load_grid(write_grid(GOOD), "cpu")
    assert len(grid.cells) == 2 * 3 * 1 * 2 * 2
    assert {c.image_size for c in grid.cells} == {16}
    assert {c.profile for c in grid.cells} == {"cpu"}
    assert {c.measured_steps for c in grid.cells} == {2}
    assert grid.profile_description == "smaller"


def test_cell_ids_are_stable_across_loads(write_grid):
    path = write_grid(GOOD)
    assert [c.cell_id for c in load_grid(path, "cpu").cells] == [c.cell_id for c in load_grid(path, "cpu").cells]


def test_an_axis_added_later_keeps_old_ids_at_its_default(write_grid):
    """Results committed before an axis existed stay resumable: the id changes only off-default."""
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class WithNewAxis(Cell):
        new_axis: int = axis("an axis added after rows were committed", default=1, extra=True)

    cell = load_grid(write_grid(GOOD), "cpu").cells[0]
    at_default = WithNewAxis(**cell.to_dict())
    off_default = WithNewAxis(**{**cell.to_dict(), "new_axis": 2})
    assert at_default.cell_id == cell.cell_id
    assert off_default.cell_id != cell.cell_id and "-new_axis_2-" in off_default.cell_id


def test_exclude_drops_matching_cells(write_grid):
    text = GOOD.replace('optimizer = ["adamw", "sgd"]',
                        'optimizer = ["adamw", "sgd"]\n    exclude = [{ optimizer = "sgd", micro_batch = 2 }]')
    cells = load_grid(write_grid(text), "cuda").cells
    assert not [c for c in cells if c.optimizer == "sgd" and c.micro_batch == 2]
    assert len(cells) == 48 - 8


@pytest.mark.parametrize("grid_name", ["smoke", "resnet50", "vit_b16", "vit_l16", "ddp", "gpu_check/resnet50",
                                       "gpu_check/vit"] + [f"claims/{path.stem}" for path in
                                                           sorted((REPO / "experiments" / "claims").glob("*.toml"))])
def test_shipped_grids_are_valid_on_both_profiles(grid_name):
    for profile in ("cuda", "cpu"):
        assert load_grid(REPO / "experiments" / f"{grid_name}.toml", profile).cells


def test_resnet50_grid_covers_the_study():
    grid = load_grid(REPO / "experiments" / "resnet50.toml", "cuda")
    assert {(c.micro_batch, c.accum_steps) for c in grid.cells} == {(128, 1), (64, 2), (32, 4), (16, 8), (8, 16)}
    assert {c.precision for c in grid.cells} == {"fp32", "bf16", "fp16"}
    assert {c.checkpointing for c in grid.cells} == {"off", "full"}
    assert {c.optimizer for c in grid.cells} == {"adamw", "adamw8bit", "sgd"}
    assert {c.image_size for c in grid.cells} == {224}
    cpu = load_grid(REPO / "experiments" / "resnet50.toml", "cpu")
    for name in ("precision", "checkpointing", "optimizer", "micro_batch"):  # every axis on CPU too
        assert len({getattr(c, name) for c in cpu.cells}) > 1, name


BAD = [
    ("unknown key", 'precision = ["fp32"]', 'precision = ["fp32"]\nprecison = ["bf16"]',
     "grid.precison", "allowed keys"),
    ("wrong type", "effective_batch = 4", 'effective_batch = "four"', "grid.effective_batch", "integer"),
    ("non-positive", "measured_steps = 2", "measured_steps = 0", "run.measured_steps", "greater than 0"),
    ("pair product", "pairs = [[4, 1], [2, 2]]", "pairs = [[4, 1], [2, 3]]", "grid.pairs", "not effective_batch = 4"),
    ("unknown precision", 'precision = ["fp32"]', 'precision = ["fp8"]', "grid.precision[0]", "'fp32', 'bf16', 'fp16' or 'tf32'"),
    ("unknown model", 'model = ["test_vit"]', 'model = ["resnet_50"]', "grid.model[0]", "did you mean"),
    ("checkpointing mode", 'precision = ["fp32"]', 'precision = ["fp32"]\ncheckpointing = ["last-0"]',
     "grid.checkpointing[0]", "last-[1-9]"),
    ("world size", 'precision = ["fp32"]', 'precision = ["fp32"]\nworld_size = [0]', "grid.world_size", ">= 1"),
]


@pytest.mark.parametrize("case, old, new, key, allowed", BAD, ids=[case[0] for case in BAD])
def test_bad_grid_fails_with_one_line_naming_file_and_key(case, old, new, key, allowed, write_grid,
                                                          tmp_path, capsys):
    path = write_grid(tiny_grid("bad").replace(old, new))
    results = tmp_path / "results"
    assert main(["run", str(path), "--results", str(results)]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1, error
    assert str(path) in error and key in error and allowed in error, error
    assert not results.exists()


def test_bad_profile_override_names_the_profile_key(write_grid, capsys):
    path = write_grid(GOOD.replace("image_size = [16]", "image_size = [-16]"))
    assert main(["list", str(path), "--device", "cpu"]) == 2
    assert "profile.cpu.grid.image_size" in capsys.readouterr().err


def test_bad_grid_exits_2_from_the_command_line(write_grid, tmp_path, capfd):
    path = write_grid(tiny_grid("bad").replace("[run]", "[runn]"))
    result = bench_in_process(capfd, "run", str(path), "--results", str(tmp_path / "results"))
    assert result.returncode == 2
    assert "runn" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "results").exists()


def test_one_bad_file_among_several_writes_nothing(write_grid, tmp_path, capsys):
    good = write_grid(tiny_grid("good"), "good.toml")
    bad = write_grid(tiny_grid("bad").replace("effective_batch = 4", "effective_batch = 0"), "bad.toml")
    assert main(["run", str(good), str(bad), "--results", str(tmp_path / "results")]) == 2
    assert not (tmp_path / "results").exists()


def test_precision_the_device_cannot_run_is_rejected(write_grid):
    grid = load_grid(write_grid(GOOD), "cuda")
    with pytest.raises(GridFileError, match=r"grid.precision: 'bf16' cannot run on Tesla T4; allowed here: fp32, fp16"):
        require_precisions(grid, ("fp32", "fp16"), "Tesla T4")
