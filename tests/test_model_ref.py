"""Models beyond timm's registry: a module path, a file, hf-hub from the local cache; their input and class count;
`bench probe`, `bench plan` and `bench measure` on them; one line when the model cannot train on its input."""

from __future__ import annotations

import json

import pytest
from conftest import REPO, bench_in_process, read_rows

from bench.cli import main
from bench.errors import GridFileError, ModelRefError
from bench.grid.cell import Cell
from bench.grid.model_ref import ModelSpec, model_problem
from bench.grid.spec import load_grid
from bench.memory.estimate import estimate_cell
from bench.memory.probe import ProbeConfig
from bench.train.models import build_model

FILE_MODEL = "tests/tiny_models.py:tiny_cnn"
MODULE_MODEL = "tests.tiny_models:tiny_cnn"
SHAPE = ["--input-size", "1,32,48", "--num-classes", "10", "--model-kwargs", '{"width": 6}']


@pytest.fixture(autouse=True)
def _at_repo(monkeypatch):
    monkeypatch.chdir(REPO)  # the references are relative to the working directory, as a user types them


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty local Hugging Face cache (no network either way)."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path / "hub"


def _json(capsys, *args: str) -> dict:
    assert main(list(args)) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("model", [FILE_MODEL, MODULE_MODEL])
@pytest.mark.slow
def test_probe_answers_for_a_model_from_a_file_or_a_module_with_its_input_and_classes(capsys, model):
    answer = _json(capsys, "probe", model, "--memory-gib", "0.5", *SHAPE, "--format", "json")
    cell = answer["cell"]
    assert (cell["in_chans"], cell["image_size"], cell["image_width"], cell["num_classes"], cell["model_kwargs"]) == \
        (1, 32, 48, 10, '{"width":6}')
    largest = answer["predicted"]["largest_micro_batch"]
    config = ProbeConfig.of(model, image_size=32, in_chans=1, image_width=48, num_classes=10,
                            model_kwargs='{"width":6}')

    def need_bytes(micro_batch: int) -> float:
        return estimate_cell(config.cell(micro_batch, "cuda"), "cuda").peak_reserved_bytes * 1.10

    assert need_bytes(largest) <= 0.5 * 2**30 < need_bytes(largest + 1)


def test_the_input_and_the_factory_arguments_change_the_model_and_its_memory():
    def cell(**fields) -> Cell:
        return Cell(experiment="e", profile="cuda", model=FILE_MODEL, image_size=32, micro_batch=8, accum_steps=1,
                    precision="fp32", checkpointing="off", optimizer="adamw", channels_last=False, warmup_steps=1,
                    measured_steps=1, **fields)

    wide = build_model(ModelSpec(FILE_MODEL, 32, num_classes=10, model_kwargs='{"width":6}'))
    assert wide[0].out_channels == 6 and wide[-1].out_features == 10
    base, larger = estimate_cell(cell(), "cuda"), estimate_cell(cell(image_width=64, in_chans=5), "cuda")
    assert larger.inputs_bytes > base.inputs_bytes and larger.peak_bytes > base.peak_bytes
    assert cell().cell_id != cell(num_classes=10).cell_id


@pytest.mark.slow
def test_plan_predicts_options_for_a_model_from_a_module_built_with_its_arguments(capsys):
    def peak_gib(width: int) -> float:
        plan = _json(capsys, "plan", MODULE_MODEL, "--effective-batch", "64", "--image-size", "32", "--num-classes",
                     "10", "--model-kwargs", json.dumps({"width": width}), "--gpu", "A100-40GB", "--format", "json")
        lines = [option["line"] for option in plan["options"]]
        assert lines and {(line["model"], line["basis"]) for line in lines} == {(MODULE_MODEL, "predicted")}
        return max(line["peak_memory_gib"] for line in lines)

    assert peak_gib(64) > peak_gib(4)


@pytest.mark.parametrize("model, words", [
    ("tests/tiny_models.py:token_mixer", "forward on a synthetic 2x3x32x32 float32 batch failed: RuntimeError: "),
    ("tests/tiny_models.py:identity", "not an image classifier for this input: a synthetic 2x3x32x32 float32 batch "
                                      "gave (2, 3, 32, 32), expected (2, 1000) logits"),
])
def test_a_model_that_cannot_train_on_the_synthetic_input_is_one_line_naming_it(capsys, model, words):
    assert main(["probe", model, "--memory-gib", "1", "--image-size", "32"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"model {model}: {words}" in err


@pytest.mark.parametrize("model, message", [
    ("tests/nope.py:tiny_cnn", "no such file tests/nope.py"),
    ("tests.nope:tiny_cnn", "no module tests.nope"),
    ("tests/tiny_models.py:2x", "the factory must be a Python name"),
    ("resnet-50", "is not a timm model; did you mean resnet50"),
])
def test_a_reference_that_cannot_be_resolved_is_one_line_before_torch_loads(capsys, model, message):
    assert main(["plan", model, "--effective-batch", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and err.startswith("bench: MODEL:")


def test_a_factory_without_timm_checkpointing_is_told_which_modes_it_has():
    with pytest.raises(ModelRefError, match="has no set_grad_checkpointing.*last-<N>"):
        build_model(ModelSpec(FILE_MODEL, 32), checkpointing="full")


def test_hf_hub_offline_and_not_cached_is_one_line_saying_how_to_get_it(capsys, hub_cache):
    assert main(["probe", "hf-hub:timm/resnet18.a1_in1k", "--gpu", "A100-40GB"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "config.json is not in the local Hugging Face cache" in err
    assert "hf download timm/resnet18.a1_in1k config.json" in err


def _cache_hub_config(hub_cache, config: dict) -> None:
    """timm/tiny.test's config.json in the local cache, as `hf download` leaves it."""
    snapshot = hub_cache / "models--timm--tiny.test" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(config))
    (hub_cache / "models--timm--tiny.test" / "refs").mkdir()
    (hub_cache / "models--timm--tiny.test" / "refs" / "main").write_text("a" * 40)


def test_hf_hub_builds_from_the_cached_config_without_the_network(hub_cache):
    _cache_hub_config(hub_cache, {"architecture": "test_resnet", "num_classes": 1000,
                                  "pretrained_cfg": {"input_size": [3, 32, 32]}})
    assert model_problem("hf-hub:timm/tiny.test") is None
    model = build_model(ModelSpec("hf-hub:timm/tiny.test", 32, num_classes=7))
    assert type(model).__name__ == "ResNet" and model.get_classifier().out_features == 7


@pytest.mark.slow  # two probes, 21 traces: 15 s on 2 cores
def test_hf_hub_takes_classes_input_and_kwargs_from_its_cached_config_unless_an_option_says(capsys, hub_cache):
    _cache_hub_config(hub_cache, {"architecture": "test_resnet", "num_classes": 37,
                                  "pretrained_cfg": {"input_size": [1, 40, 40]}, "model_args": {"drop_rate": 0.1}})
    probe = ("probe", "hf-hub:timm/tiny.test", "--memory-gib", "0.5", "--format", "json")
    configured = _json(capsys, *probe)
    cell = configured["cell"]
    assert (cell["num_classes"], cell["in_chans"], cell["image_size"]) == (37, 1, 40)
    assert configured["model_sources"] == ('hf-hub:timm/tiny.test: 37 classes (hub config), input 1x40x40 (hub config), '
                                           'kwargs {"drop_rate": 0.1} (hub config)')
    overridden = _json(capsys, *probe, "--num-classes", "10", "--image-size", "32", "--model-kwargs",
                       '{"drop_rate": 0.2}')
    cell = overridden["cell"]
    assert (cell["num_classes"], cell["in_chans"], cell["image_size"]) == (10, 1, 32)
    assert overridden["model_sources"] == ('hf-hub:timm/tiny.test: 10 classes (--num-classes), input 1x32x32 '
                                           '(--image-size, hub config channels), kwargs {"drop_rate": 0.2} '
                                           "(the option's over the hub config's)")


def test_a_grid_file_runs_model_code_only_when_it_says_so(write_grid):
    text = """
        [experiment]
        name = "custom"
        {flag}

        [grid]
        model = ["tests/tiny_models.py:tiny_cnn"]
        image_size = [32]
        effective_batch = 2
        pairs = [[2, 1]]
        precision = ["fp32"]
    """
    with pytest.raises(GridFileError, match=r"grid.model\[0\]: .*names code.*experiment.runs_model_code = true"):
        load_grid(write_grid(text.format(flag="")), "cpu")
    grid = load_grid(write_grid(text.format(flag="runs_model_code = true")), "cpu")
    assert grid.cells[0].model == FILE_MODEL


@pytest.mark.serial
def test_measure_runs_one_cell_of_a_file_model_and_appends_its_row(tmp_path, capfd):
    args = ["measure", FILE_MODEL, "--micro-batch", "4", "--accum", "2", *SHAPE, "--warmup-steps", "1",
            "--measured-steps", "2", "--device", "cpu", "--results", str(tmp_path)]
    done = bench_in_process(capfd, *args)
    assert done.returncode == 0, done.stderr
    (runs,) = tmp_path.glob("measure/*/runs.csv")
    (row,) = read_rows(runs)
    assert row["status"] == "ok" and float(row["samples_per_s"]) > 0
    assert (row["model"], row["in_chans"], row["image_width"], row["num_classes"], row["accum_steps"]) == \
        (FILE_MODEL, "1", "48", "10", "2")
    assert "appended" in done.stdout and "tests_tiny_models.py_tiny_cnn-32px-4x2" in done.stdout
    again = bench_in_process(capfd, *args)
    assert again.returncode == 0 and "already measured" in again.stdout and len(read_rows(runs)) == 1


@pytest.mark.serial  # a process: what a fresh command imports
def test_the_shipped_timm_names_are_the_pinned_timms_and_name_checks_read_them_without_timm(tmp_path):
    """bench/data/timm_models.json lets a command on an empty cache check a model's name without importing timm and
    torch (3 s): it must hold the names and deprecated names of the timm constraints.txt pins (rerun
    scripts/timm_model_names.py after a new pin), and a check must read it."""
    import os
    import re
    import subprocess
    import sys

    import timm

    from bench.grid.model_ref import SHIPPED_TIMM_NAMES

    pinned = re.search(r"^timm==(\S+)$", (REPO / "constraints.txt").read_text(), re.M).group(1)
    shipped = json.loads(SHIPPED_TIMM_NAMES.read_text())
    assert shipped["timm"] == pinned == timm.__version__ and shipped["names"] == timm.list_models()
    assert shipped["deprecated"] == timm.models.get_deprecated_models()
    script = ("import sys; from bench.grid.model_ref import model_problem; "
              "print(model_problem('resnet50'), model_problem('resnet-50'), 'timm' in sys.modules); "
              "print(model_problem('ig_resnext101_32x16d'))")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "BENCH_CACHE_DIR": str(tmp_path)})  # an empty cache
    first, deprecated = done.stdout.splitlines()
    assert first.startswith("None 'resnet-50' is not a timm model; did you mean resnet50") and first.endswith("False")
    # a deprecated name says what timm would build instead (here another network: 32x8d, not 32x16d)
    assert "deprecated: it now builds resnext101_32x8d.fb_wsl_ig1b_ft_in1k; name the architecture" in deprecated
