"""Every value the grid accepts survives a write and a read.

For each axis, its extremes (a whole number's minimum and maximum, every choice of a fixed list,
the longest and shortest text its pattern allows) go through a grid file, `load_grid`, the row
builder, `RunsFile.write` and `read_runs`; the row read back must rebuild the same cell, id
included. The table of values is generated from `bench.grid.cell.axes()`, so a new axis is covered
the day it is added.
"""

from __future__ import annotations

import re
from dataclasses import fields

import pytest
from conftest import REPO

from bench.grid.cell import (
    CELL_ID_MAX_CHARS,
    MAX_CHECKPOINT_BLOCKS,
    Cell,
    axes,
    choices,
    extra_axis_defaults,
    field_types,
)
from bench.grid.model_ref import runs_code
from bench.grid.spec import MAX_PAIR_VALUE, load_grid
from bench.measure.device import DeviceInfo
from bench.results.read import read_runs, records
from bench.results.rows import config_columns
from bench.results.store import RunsFile

SMOKE = (REPO / "experiments" / "smoke.toml").read_text()
DEVICE = DeviceInfo("cpu", "Test CPU", ("fp32", "bf16", "fp16"), 2)
TEXT_EXTREMES = {"model": ["a", "test_vit", "vit_base_patch16_224.augreg2_in21k_ft_in1k", "hf-hub:timm/resnet18.a1_in1k",
                           "my_package.models:make_net", "path/to/file.py:factory", "./mymodel.py:factory", "A" + "b.-+_/:@" * 24 + "c" * 7],
                 "checkpointing": ["off", "full", "last-1", f"last-{MAX_CHECKPOINT_BLOCKS}"],
                 "model_kwargs": ["{}", '{"depth": 2, "drop_rate": 0.1}', "{" + '"k": 1, ' * 13 + '"last": [1, 2]}']}


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"'{value}'" if isinstance(value, str) else str(value)  # a literal string: JSON's quotes stay as they are


def _extremes(name: str) -> list[object]:
    """The values of axis `name` most likely to break a writer or a reader."""
    spec, kind = axes()[name], field_types()[name]
    if choices(name):
        return list(choices(name))
    if kind is bool:
        return [False, True]
    if kind is int:
        return [spec.minimum, spec.maximum]
    return TEXT_EXTREMES[name]


AXIS_CASES = [(name, value) for name in axes() for value in _extremes(name)]


def test_every_axis_is_in_the_table():
    assert {name for name, _ in AXIS_CASES} == set(axes())
    assert all(field_types()[name] in (int, bool) or choices(name) or name in TEXT_EXTREMES for name in axes())


COMPANIONS = {"loader_workers": ("input", "loader"), "ddp_sync": ("world_size", 2)}
"""Axes that only matter beside another's value (synthetic input has no workers, one process no sync)."""


def _grid_text(name: str, value: object) -> str:
    text = SMOKE
    settings = {name: value, **dict([COMPANIONS[name]] if name in COMPANIONS else [])}
    for key, setting in settings.items():
        line = f"{key} = [{_toml(setting)}]"
        text, count = re.subn(rf"(?m)^{key} = .*$", lambda _: line, text)
        text = text if count else text.replace("[grid]\n", f"[grid]\n{line}\n", 1)
    if name == "model" and runs_code(str(value)):  # a grid names code only when it says so
        text = text.replace("[grid]\n", "runs_model_code = true\n\n[grid]\n", 1)
    return text


def _round_trip(cells: tuple[Cell, ...], tmp_path) -> list[Cell]:
    """Write each cell's row, read the file back, rebuild a `Cell` from each row's configuration columns."""
    runs = RunsFile(tmp_path / "runs.csv")
    for cell in cells:
        runs.write({**config_columns(cell, DEVICE), "status": "ok"})
    rows = records(read_runs(runs.path))
    rebuilt = [Cell(**{f.name: row[f.name] for f in fields(Cell)}) for row in rows]
    assert [row["cell_id"] for row in rows] == [cell.cell_id for cell in cells]
    return rebuilt


@pytest.mark.parametrize("name,value", AXIS_CASES, ids=[f"{n}={str(v)[:24]}" for n, v in AXIS_CASES])
def test_a_value_the_grid_accepts_survives_a_write_and_a_read(name, value, write_grid, tmp_path):
    grid = load_grid(write_grid(_grid_text(name, value)), "cuda", check_models=False)
    assert {getattr(cell, name) for cell in grid.cells} == {value}
    rebuilt = _round_trip(grid.cells, tmp_path)
    assert rebuilt == list(grid.cells)
    assert [cell.cell_id for cell in rebuilt] == [cell.cell_id for cell in grid.cells]


@pytest.mark.parametrize("pair", [(1, MAX_PAIR_VALUE), (MAX_PAIR_VALUE, 1)])
def test_the_largest_batches_and_run_settings_survive(pair, write_grid, tmp_path):
    text = re.sub(r"(?m)^effective_batch = .*$", f"effective_batch = {MAX_PAIR_VALUE}", SMOKE)
    text = re.sub(r"(?m)^pairs = .*$", f"pairs = [{list(pair)}]", text)
    text = re.sub(r"(?m)^warmup_steps = .*$", "warmup_steps = 10000\nseed = 4294967295", text)
    text = re.sub(r"(?m)^measured_steps = .*$", "measured_steps = 10000", text)
    text = re.sub(r'(?m)^name = .*$', f'name = "{"x" * 64}"', text)
    grid = load_grid(write_grid(text), "cuda", check_models=False)
    assert _round_trip(grid.cells, tmp_path) == list(grid.cells)


def test_the_longest_cell_id_the_grid_can_make_is_read_back(tmp_path):
    """Every axis at its longest value at once: the id stays within what the reader takes."""
    longest = {name: max(_extremes(name), key=lambda v: len(str(v))) for name in axes()}
    for name, default in extra_axis_defaults().items():  # an extra at its default is not in the id
        longest[name] = max((v for v in _extremes(name) if v != default), key=lambda v: len(str(v)))
    # The batch at most MAX_PAIR_VALUE (a grid's effective_batch; the reader holds rows to it): 6 digits in all.
    cell = Cell(experiment="x" * 64, profile="cuda", micro_batch=MAX_PAIR_VALUE, accum_steps=1,
                warmup_steps=10_000, measured_steps=10_000, seed=2**32 - 1, **longest)
    assert len(cell.cell_id) <= CELL_ID_MAX_CHARS
    assert _round_trip((cell,), tmp_path) == [cell]


@pytest.mark.parametrize("name,value", [("checkpointing", f"last-{MAX_CHECKPOINT_BLOCKS + 1}"),
                                        ("checkpointing", "last-" + "9" * 5000),
                                        ("model", "resnet50." + "a" * 200), ("model", "resnet50 a"),
                                        ("model_kwargs", "{" + '"k": 1, ' * 20 + "}"),
                                        ("image_size", axes()["image_size"].maximum + 1)])
def test_a_value_past_the_bounds_is_refused_by_the_grid_naming_the_key(name, value, write_grid):
    from bench.errors import GridFileError

    with pytest.raises(GridFileError, match=rf"grid\.{name}\[0\]"):
        load_grid(write_grid(_grid_text(name, value)), "cuda", check_models=False)



# The bounds a model sets (`bench.grid.bounds`), at their edges: the values validation accepts there survive too.
PADS = '{"dynamic_img_size": true, "dynamic_img_pad": true}'
MODEL_EDGES = [("test_vit", "image_size", 16), ("test_vit", "image_size", 4096), ("test_vit", "image_width", 16),
               ("test_vit", "image_width", 4096), ("test_vit", "checkpointing", "last-6"),
               ("test_resnet", "checkpointing", "last-4"), ("test_resnet", "image_size", 1),
               ("test_resnet", "image_size", 4095), ("test_vit2", "checkpointing", "last-8"),
               ("test_convnext", "checkpointing", "full")]
PADDED_EDGES = [16, 17, 31, 4095]


def _model_grid(model: str, name: str, value: object, kwargs: str = "{}") -> str:
    text = re.sub(r"(?m)^model = .*$", f'model = ["{model}"]', SMOKE)
    text = text.replace("[grid]\n", f"[grid]\nmodel_kwargs = ['{kwargs}']\n", 1) if kwargs != "{}" else text
    text = re.sub(rf"(?m)^{name} = .*$", f"{name} = [{_toml(value)}]", text)
    return text if f"\n{name} = " in text else text.replace("[grid]\n", f"[grid]\n{name} = [{_toml(value)}]\n", 1)


@pytest.mark.parametrize("model,name,value", MODEL_EDGES + [("test_vit", "image_size", s) for s in PADDED_EDGES],
                         ids=[f"{m} {n}={v}" for m, n, v in MODEL_EDGES] + [f"padded {s}" for s in PADDED_EDGES])
def test_a_value_at_the_models_bound_is_accepted_and_survives(model, name, value, write_grid, tmp_path):
    from bench.train.model_bounds import check_grid

    padded = name == "image_size" and model == "test_vit" and value not in (16, 4096)
    grid = load_grid(write_grid(_model_grid(model, name, value, PADS if padded else "{}")), "cuda")
    check_grid(grid)  # the whole validation: the file's bounds and the model's
    assert {getattr(cell, name) for cell in grid.cells} == {value}
    assert _round_trip(grid.cells, tmp_path) == list(grid.cells)


@pytest.mark.parametrize("model,name,value", [("test_vit", "image_size", 15), ("test_vit", "image_size", 4095),
                                              ("test_vit", "image_width", 17), ("test_vit", "checkpointing", "last-7"),
                                              ("test_resnet", "checkpointing", "last-5"),
                                              ("test_convnext", "checkpointing", "last-1")])
def test_one_past_the_models_bound_is_refused_naming_the_key(model, name, value, write_grid):
    from bench.errors import GridFileError
    from bench.train.model_bounds import check_grid

    with pytest.raises(GridFileError, match=rf"grid\.{name}\[0\]: {re.escape(repr(value))} is not allowed for {model}"):
        check_grid(load_grid(write_grid(_model_grid(model, name, value)), "cuda"))
