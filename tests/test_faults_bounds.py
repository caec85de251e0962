"""The fault suite, model bounds: values a grid file allows on their own but its model does not.

`last-<N>` past the model's blocks, `full` on a model without timm's `set_grad_checkpointing`, an image side
below a patch-embedding model's patch or not a multiple of it (`bench.grid.bounds`). Each case is a grid file
refused, in this process, by `estimate`, `predict` and `run` before any cell runs: exit 2, one line naming the
file and the key (with its position, or the profile's override), as text and as JSON, nothing written. The
values one inside each bound are accepted (and `tests/test_roundtrip.py` writes and reads them back). The
models that pass the bounds and still refuse the synthetic step are failed rows of `run` (slow, at the end).
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
from conftest import read_rows
import test_faults_cli
from test_faults_cli import refused

from bench.cli import main
from bench.errors import GridFileError
from bench.train.model_bounds import check_grid, model_bounds
from bench.grid.spec import load_grid

work = test_faults_cli.work  # the fixture: an empty working folder beside committed rows

PADS = '{"dynamic_img_size": true, "dynamic_img_pad": true}'
FACTORY = textwrap.dedent("""
    import torch

    def plain(num_classes=1000, in_chans=3):
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(num_classes))
""")


def grid_text(model: str | list[str] = "test_vit", grid: str = "", profile: str = "", code: bool = False) -> str:
    """A one-pair grid of `model` with the extra `[grid]` lines `grid` (image_size 32 unless they set it)."""
    models = [model] if isinstance(model, str) else model
    lines = grid if "image_size" in grid else "image_size = [32]\n" + grid
    return (f'[experiment]\nname = "bounds"\n{"runs_model_code = true" if code else ""}\n[grid]\n'
            f"model = {json.dumps(models)}\n{lines}\neffective_batch = 2\npairs = [[2, 1]]\nprecision = ['fp32']\n"
            f"optimizer = ['sgd']\n[run]\nwarmup_steps = 1\nmeasured_steps = 1\n"
            + (f"[profile.cpu.grid]\n{profile}\n" if profile else ""))


def _cases() -> list[tuple[str, str, str]]:
    """(case id, grid file text, the key the message must name)."""
    cases = []
    for side in (1, 2, 4, 8, 12, 15, 17, 20, 24, 30, 31, 33, 40, 47, 50, 63, 65, 100, 127, 129, 200, 225, 250,
                 383, 500, 1000, 2047, 4095):
        cases.append((f"test_vit {side}px", grid_text(grid=f"image_size = [{side}]"), "grid.image_size[0]"))
    for model in ("test_vit2", "test_vit_relpos", "test_vit3"):
        for side in (8, 17, 100, 4095):
            cases.append((f"{model} {side}px", grid_text(model, f"image_size = [{side}]"), "grid.image_size[0]"))
    for side in (1, 15, 17, 31, 100, 4095):
        cases.append((f"test_vit width {side}", grid_text(grid=f"image_width = [{side}]"), "grid.image_width[0]"))
    for side in (17, 40, 100):  # padding without dynamic_img_size: timm's position embedding no longer matches
        cases.append((f"vit_tiny pad only {side}px", grid_text("vit_tiny_patch16_224", f"image_size = [{side}]\n"
                                                               "model_kwargs = ['{\"dynamic_img_pad\": true}']"),
                      "grid.image_size[0]"))
    for side in (1, 8, 15):  # told to pad: still at least one patch
        cases.append((f"test_vit padded {side}px", grid_text(grid=f"image_size = [{side}]\nmodel_kwargs = ['{PADS}']"),
                      "grid.image_size[0]"))
    cases += [("position 2 of 3", grid_text(grid="image_size = [32, 48, 50]"), "grid.image_size[2]"),
              ("a scalar", grid_text(grid="image_size = 30"), "grid.image_size"),
              ("the cpu profile's size", grid_text(grid="image_size = [224]", profile="image_size = [30]"),
               "profile.cpu.grid.image_size[0]"),
              ("two models", grid_text(["test_resnet", "test_vit"], "image_size = [30]"), "grid.image_size[0]"),
              ("every model and size", grid_text(["test_resnet", "test_vit", "test_vit2"], "image_size = [30, 32]"),
               "grid.image_size[0]")]
    blocks = {"test_vit": 6, "test_vit2": 8, "test_vit_relpos": 9, "test_resnet": 4, "test_efficientnet": 5}
    for model, count in blocks.items():
        for n in sorted({count + 1, count + 2, 2 * count, 10 * count, 100, 999} - set(range(count + 1))):
            cases.append((f"{model} last-{n}", grid_text(model, f"checkpointing = ['last-{n}']"),
                          "grid.checkpointing[0]"))
    for model in ("test_convnext", "test_byobnet", "test_maxvit", "test_nfnet", "test_coatnet"):
        for n in (1, 2, 999):  # no blocks last-<N> counts
            cases.append((f"{model} last-{n}", grid_text(model, f"checkpointing = ['last-{n}']"),
                          "grid.checkpointing[0]"))
    cases += [("last-7 at position 3", grid_text(grid="checkpointing = ['off', 'full', 'last-3', 'last-7']"),
               "grid.checkpointing[3]"),
              ("the cpu profile's checkpointing", grid_text(profile="checkpointing = ['last-9']"),
               "profile.cpu.grid.checkpointing[0]"),
              ("two models, last-5", grid_text(["test_vit", "test_resnet"], "checkpointing = ['last-5']"),
               "grid.checkpointing[0]"),
              ("a factory, full", grid_text("plain.py:plain", "checkpointing = ['full']", code=True),
               "grid.checkpointing[0]"),
              ("a factory, last-1", grid_text("plain.py:plain", "checkpointing = ['last-1']", code=True),
               "grid.checkpointing[0]")]
    return cases


BOUND_CASES = _cases()


def test_the_model_bounds_family_has_at_least_100_cases():
    assert len(BOUND_CASES) >= 100, len(BOUND_CASES)


def test_the_block_counts_the_cases_assume_are_the_models():
    assert [model_bounds(m).blocks for m in ("test_vit", "test_vit2", "test_vit_relpos", "test_resnet")] == [6, 8, 9, 4]
    assert model_bounds("test_efficientnet").blocks == 5 and model_bounds("test_convnext").blocks == 0
    assert model_bounds("test_vit").patch == (16, 16) and model_bounds("test_resnet").patch is None
    assert model_bounds("test_vit", PADS).pads and not model_bounds("vit_tiny_patch16_224", '{"dynamic_img_pad": true}').pads


@pytest.mark.parametrize("case", BOUND_CASES, ids=[case[0] for case in BOUND_CASES])
def test_a_value_the_model_does_not_allow_is_refused_before_any_cell(case, work, capsys):
    _, text, key = case
    (Path.cwd() / "plain.py").write_text(FACTORY)
    path = Path.cwd() / "grid.toml"
    path.write_text(text)
    results = str(work / "results")
    refused(["estimate", str(path), "--profile", "cpu", "--results", results], work, capsys, names=f": {key}: ")
    refused(["run", str(path), "--results", results], work, capsys, names=f": {key}: ")
    if "profile" not in key:  # predict runs the grid as written (the cuda profile)
        refused(["predict", str(path), "--results", results, "--gpu", "H100-80GB"], work, capsys, names=f": {key}: ")


def test_the_message_says_what_is_allowed(write_grid):
    cases = {"image_size = [30]": "allowed: multiples of 16 from 16 to 4096, or any side from 16 with model_kwargs "
                                  + PADS,
             "checkpointing = ['last-7']": "it has 6 blocks; allowed: off, full, last-1 .. last-6"}
    for line, allowed in cases.items():
        with pytest.raises(GridFileError, match=re.escape(allowed)):
            check_grid(load_grid(write_grid(grid_text(grid=line)), "cpu"))
    with pytest.raises(GridFileError, match=re.escape("it has no blocks last-<N> counts") + ".*allowed: off, full$"):
        check_grid(load_grid(write_grid(grid_text("test_convnext", "checkpointing = ['last-1']")), "cpu"))
    with pytest.raises(GridFileError, match=re.escape('grid.exclude = [{model = "test_vit", image_size = 30}]')):
        check_grid(load_grid(write_grid(grid_text(["test_resnet", "test_vit"], "image_size = [30]")), "cpu"))


ACCEPTED = [("test_vit", "image_size = [16, 32, 48, 224, 4096]"), ("test_vit", "image_width = [16, 48, 4096]"),
            ("test_vit", "checkpointing = ['off', 'full', 'last-1', 'last-6']"),
            ("test_resnet", "image_size = [1, 2, 17, 4095]\ncheckpointing = ['last-1', 'last-4']"),
            ("test_vit", f"image_size = [16, 17, 30, 200, 4095]\nmodel_kwargs = ['{PADS}']"),
            (["test_resnet", "test_vit"], "image_size = [30]\nexclude = [{model = 'test_vit', image_size = 30}]"),
            (["test_resnet", "test_vit"], "checkpointing = ['last-4', 'last-6']\n"
                                          "exclude = [{model = 'test_resnet', checkpointing = 'last-6'}]"),
            ("test_convnext", "checkpointing = ['off', 'full']\nimage_size = [1]")]


@pytest.mark.parametrize("model,lines", ACCEPTED, ids=[lines.split("\n")[0][:40] for _, lines in ACCEPTED])
def test_the_values_inside_the_bounds_are_accepted(model, lines, write_grid):
    check_grid(load_grid(write_grid(grid_text(model, lines)), "cpu"))


def test_list_builds_a_model_once_and_help_never(write_grid, capsys, monkeypatch):
    """`list` checks the bounds as `run` does (tests/test_faults_commands.py), from the cache once a model was read,
    so a second listing answers without torch (tests/test_startup.py); `--help` builds nothing."""
    import bench.train.model_bounds as bounds

    path = write_grid(grid_text(grid="image_size = [32]"))
    assert main(["list", str(path), "--profile", "cpu"]) == 0
    monkeypatch.setattr(bounds, "_built_bounds", lambda spec: pytest.fail("built a model the cache knows"))
    bounds._cached_bounds.cache_clear()
    assert main(["list", str(path), "--profile", "cpu"]) == 0
    assert "test_vit-32px" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["list", "--help"])


@pytest.mark.serial
def test_models_that_pass_the_bounds_but_refuse_the_step_are_failed_rows(tmp_path):
    """A stem larger than the image (ConvNeXt at 2 px), a backbone that returns features, not logits (timm's
    `features_only`, as a detection or segmentation model does): rows naming the model, input and exception."""
    path = tmp_path / "rows.toml"
    path.write_text(grid_text(["test_resnet", "test_convnext"], "image_size = [2]\nmodel_kwargs = "
                                                                "['{}', '{\"features_only\": true}']"))
    assert main(["run", str(path), "--results", str(tmp_path / "results")]) == 0
    [runs] = tmp_path.glob("results/bounds/*/runs.csv")
    rows = {row["cell_id"].rsplit("-", 1)[0]: row for row in read_rows(runs)}
    assert rows["test_resnet-2px-2x1-fp32-ckpt_off-sgd"]["status"] == "ok"
    convnext = rows["test_convnext-2px-2x1-fp32-ckpt_off-sgd"]
    assert convnext["status"] == "error" and convnext["error_type"] == "RuntimeError"
    assert "Kernel size can't be greater than actual input size" in convnext["error_message"]
    features = rows["test_resnet-2px-2x1-fp32-ckpt_off-sgd-model_kwargs__features_only_true_"]
    assert features["status"] == "error" and features["error_type"] == "TypeError", features
    assert "cross_entropy" in features["error_message"]
