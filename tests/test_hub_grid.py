"""#38 item 2 in a grid file: an hf-hub model's cells built as its cached config says unless the grid sets the
value, with the row saying which won; file models named by absolute or relative path as on the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REPO, read_rows

from bench.cli import main
from bench.errors import GridFileError
from bench.grid.spec import load_grid
from bench.results.schema import SCHEMAS

HUB_MODEL = "hf-hub:timm/tiny.test"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """A local Hugging Face cache holding timm/tiny.test's config.json (37 classes, 1x40x40, drop_rate 0.1), as
    `hf download` leaves it; no network either way."""
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    snapshot = cache / "models--timm--tiny.test" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({
        "architecture": "test_resnet", "num_classes": 37, "pretrained_cfg": {"input_size": [1, 40, 40]},
        "model_args": {"drop_rate": 0.1}}))
    (cache / "models--timm--tiny.test" / "refs").mkdir()
    (cache / "models--timm--tiny.test" / "refs" / "main").write_text("a" * 40)
    return cache


def _grid(model: str, extra: str = "", experiment: str = "") -> str:
    return f"""
        [experiment]
        name = "hubgrid"
        {experiment}

        [grid]
        model = ["{model}"]
        image_size = [32]
        effective_batch = 2
        pairs = [[2, 1]]
        precision = ["fp32"]
        {extra}
    """


def test_a_hub_model_in_a_grid_takes_classes_and_channels_from_its_cached_config(hub_cache, write_grid):
    (cell,) = load_grid(write_grid(_grid(HUB_MODEL)), "cpu").cells
    assert (cell.num_classes, cell.in_chans, cell.image_size) == (37, 1, 32)
    assert cell.model_config_source == "num_classes hub config, in_chans hub config, model_kwargs hub config"


def test_what_a_grid_sets_wins_over_the_hub_config_and_the_row_says_so(hub_cache, write_grid):
    text = _grid(HUB_MODEL, 'num_classes = [10]\nmodel_kwargs = [\'{"drop_rate": 0.2}\']')
    (cell,) = load_grid(write_grid(text), "cpu").cells
    assert (cell.num_classes, cell.in_chans) == (10, 1)
    assert cell.model_config_source == "num_classes grid, in_chans hub config, model_kwargs grid over hub config"
    assert all("model_config_source" in SCHEMAS[kind].columns for kind in ("measured", "estimated", "predicted"))


def test_where_a_value_came_from_leaves_the_cell_id_alone(hub_cache, write_grid):
    from dataclasses import replace

    (cell,) = load_grid(write_grid(_grid(HUB_MODEL)), "cpu").cells
    assert replace(cell, model_config_source="").cell_id == cell.cell_id


def test_estimate_rows_of_a_hub_grid_have_the_config_classes_and_say_so(hub_cache, write_grid, tmp_path, capsys):
    grid = write_grid(_grid(HUB_MODEL))
    assert main(["estimate", str(grid), "--results", str(tmp_path / "results"), "--format", "json"]) == 0
    (grid_answer,) = json.loads(capsys.readouterr().out)["grids"]
    (row,) = grid_answer["rows"]
    assert (row["num_classes"], row["in_chans"], row["param_count"]) == (37, 1, 375_989)
    assert row["model_config_source"] == "num_classes hub config, in_chans hub config, model_kwargs hub config"
    (written,) = read_rows(Path(grid_answer["runs_file"]))
    assert written["model_config_source"] == row["model_config_source"]


def test_a_grid_takes_an_absolute_file_path_as_the_command_line_does(write_grid):
    model = f"{REPO}/tests/tiny_models.py:tiny_cnn"
    with pytest.raises(GridFileError, match=r"grid.model\[0\]: .*names code.*experiment.runs_model_code = true"):
        load_grid(write_grid(_grid(model)), "cpu")
    (cell,) = load_grid(write_grid(_grid(model, experiment="runs_model_code = true")), "cpu").cells
    assert cell.model == model and cell.cell_id[0].isalnum()


def test_a_model_reference_a_cell_cannot_hold_is_one_line_saying_what_is_allowed(write_grid):
    path = write_grid(_grid("my models/net.py:build", experiment="runs_model_code = true"))
    with pytest.raises(GridFileError) as refused:
        load_grid(path, "cpu")
    message = str(refused.value)
    assert message.startswith(f"{path}: grid.model[0]: 'my models/net.py:build' is not a model reference; allowed: ")
    assert "path/to/file.py:factory" in message and "^[" not in message and "\n" not in message


def test_bench_measure_rows_of_a_hub_model_say_which_of_the_options_and_the_config_won(hub_cache):
    import argparse

    from bench.commands.model_options import model_config_source

    def source(num_classes=None, input_size=None, kwargs="{}") -> str:
        args = argparse.Namespace(model=HUB_MODEL, num_classes=num_classes, input_size=input_size,
                                  model_kwargs=kwargs)
        return model_config_source(args, None, default_image_size=224)

    assert source() == "num_classes hub config, in_chans hub config, model_kwargs hub config"
    assert source(10, (3, 32, 32), '{"drop_rate": 0.2}') == \
        "num_classes --num-classes, in_chans --input-size, model_kwargs --model-kwargs over hub config"


def test_a_runs_file_from_before_the_config_source_column_takes_a_row_that_fills_it(tmp_path):
    """Adding `model_config_source` must not orphan a committed runs file: a file whose header lacks it is written
    once under today's header, its rows as they were, and takes a hub cell's row that fills it."""
    from conftest import CPU_ROWS

    from bench.results.read import read_text
    from bench.results.schema import COLUMNS
    from bench.results.store import RunsFile

    old = tmp_path / "runs.csv"
    old.write_text(CPU_ROWS.read_text())
    before = read_text(old)
    assert "model_config_source" not in before.header
    runs = RunsFile(old, COLUMNS)
    runs.write({**before.rows[0], "cell_id": "hub-cell", "model_config_source": "num_classes hub config"})
    after = read_text(old)
    assert after.header == list(COLUMNS) and after.rows[:-1] == before.rows
    assert after.rows[-1]["model_config_source"] == "num_classes hub config"
