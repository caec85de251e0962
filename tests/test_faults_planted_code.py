"""The fault suite's security cases: no code runs that nobody asked for.

A grid file names code (`package.module:factory`) only with `experiment.runs_model_code = true`; without it
nothing of the reference is even looked up, so a planted package's `__init__` never runs. And no bench process
imports from the working directory: a `timm.py` (or `torch.py`, `numpy.py`, ...) lying where a user runs `bench`
never runs, in the command itself, the fork server its cells come from, torchrun and its ranks. Each case plants
the files, runs every command as a user would, and asserts that none of them ran. docs/reliability.md counts them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, read_rows, tiny_grid

from bench.cli import main
from bench.errors import GridFileError
from bench.grid.spec import load_grid
from bench.measure.device import detect_device

PLANTED_MODULES = ("timm", "torch", "numpy", "pandas", "matplotlib", "rich", "pydantic", "yaml", "bitsandbytes",
                   "huggingface_hub", "torchvision", "scipy", "PIL", "submitit")
"""Top-level names a bench process imports: a file of each is planted in the working directory (not `bench`
itself: `python -m bench` in a folder holding a bench.py runs that file, as Python does)."""


def _plant(folder: Path, marks: Path) -> None:
    """A module of every planted name in `folder`, each writing a file into `marks` when it runs."""
    marks.mkdir(exist_ok=True)
    for name in PLANTED_MODULES:
        (folder / f"{name}.py").write_text(
            f"import os\nopen(os.path.join({str(marks)!r}, '{name}-' + str(os.getpid())), 'w').close()\n"
            f"raise ImportError('planted {name}.py ran')\n")


_DRIVER = """
import json, sys
import bench.__main__  # what `python -m bench` runs first; `python -c` put the working directory first, as -m does
from bench.cli import keep_working_directory_off_import_path, main
failed = []
for argv in json.loads(sys.argv[1]):
    keep_working_directory_off_import_path()  # as the `bench` command's entry does
    try:
        code = main(argv)
    except SystemExit as exc:  # --help, --version
        code = exc.code
    if code not in (0, None):
        failed.append(f"bench {' '.join(argv)}: exit {code}")
print(json.dumps(failed))
"""
"""Every command in one interpreter started as `python -m bench` would be (the working directory first on its
path): a command's imports are checked at their first use, at the cost of one torch import, not one each."""


def _python(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONSAFEPATH"}
    return subprocess.run([sys.executable, *args], cwd=folder, capture_output=True, text=True, env=env,
                          timeout=1800)  # a hang guard, not a speed limit


def _code_grid(folder: Path, opt_in: bool) -> Path:
    """A grid naming `evilpkg.sub:make`; the package's `__init__` writes `evilpkg-ran` when imported."""
    package = folder / "evilpkg"
    package.mkdir(exist_ok=True)
    (package / "__init__.py").write_text(f"open({str(folder / 'evilpkg-ran')!r}, 'w').close()\n")
    (package / "sub.py").write_text("def make(**kwargs):\n    raise SystemExit('never built')\n")
    text = tiny_grid("evil", model="evilpkg.sub:make").replace(
        "[grid]", "runs_model_code = true\n\n        [grid]" if opt_in else "[grid]")
    path = folder / "evil.toml"
    path.write_text(text.replace("\n        ", "\n"))
    return path


def test_a_grid_without_the_opt_in_refuses_code_before_looking_it_up(tmp_path, monkeypatch):
    path = _code_grid(tmp_path, opt_in=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # as `python -m` would: the package is importable from here
    for profile in ("cpu", "cuda"):
        with pytest.raises(GridFileError, match=r"grid.model\[0\]: .*names code.*runs_model_code = true"):
            load_grid(path, profile)
        with pytest.raises(GridFileError, match="names code"):
            load_grid(path, profile, check_models=False)  # the opt-in is not part of the optional look-up
    for command in (["list"], ["list", "--profile", "cuda"], ["run"], ["estimate"], ["predict"]):
        assert main([*command, str(path)]) == 2
    assert not (tmp_path / "evilpkg-ran").exists()
    assert "evilpkg" not in sys.modules


def test_a_grid_with_the_opt_in_looks_the_code_up(tmp_path, monkeypatch):
    """The counterpart: the opt-in is what lets the package run, so the check above is about the opt-in."""
    path = _code_grid(tmp_path, opt_in=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    load_grid(path, "cpu")
    assert (tmp_path / "evilpkg-ran").exists()
    sys.modules.pop("evilpkg.sub", None), sys.modules.pop("evilpkg", None)


def test_a_runs_file_naming_code_is_priced_without_running_it():
    """A runs file is data: a GPU row whose model names code is priced without tracing (which would run it)."""
    from bench.cost.price import MeasuredRow

    row = MeasuredRow(dict(status="ok", cell_id="c", experiment="e", profile="cuda", model="resnet50", image_size=224,
                      micro_batch=64, accum_steps=1, precision="bf16", checkpointing="off", optimizer="adamw", device_type="cuda",
                      device_name="NVIDIA A100-SXM4-40GB", samples_per_s=1000.0, mfu_pct=None,
                      model_flops_per_sample=None, peak_memory_bytes=2**30))
    assert row.projectable_by_model  # a timm model's row is traced to carry it to another GPU
    assert not row.with_columns(model="evilpkg.sub:make").projectable_by_model
    assert not row.with_columns(model="nets/evil.py:make").projectable_by_model


def _every_command(folder: Path) -> list[list[str]]:
    """Each command with a small input that makes it do its work (cells measured, a model traced, rows read)."""
    grid = folder / "tiny.toml"
    grid.write_text(tiny_grid("planted", pairs="[[4, 1]]").replace("\n        ", "\n")
                    .replace('precision = ["fp32"]', 'precision = ["fp32"]\nworld_size = [1, 2]'))
    results = folder / "results"
    rows = results / "planted" / detect_device("cpu").tag
    claims = folder / "claims_results"
    for study in (REPO / "results").glob("claims*"):  # committed claims rows, so that `claims` reads some
        shutil.copytree(study, claims / study.name)
    return [
        ["--help"], ["--version"], ["catalog"], ["catalog", "--gpus"],
        ["list", str(grid)],
        ["run", str(grid), "--results", str(results)],  # the fork server (1 process) and torchrun (2)
        ["measure", "test_resnet", "--micro-batch", "2", "--image-size", "32", "--optimizer", "sgd",
         "--measured-steps", "1", "--warmup-steps", "1", "--quiet-wait-s", "0", "--results", str(results)],
        ["estimate", str(grid)],
        ["probe", "test_vit", "--image-size", "32", "--gpu", "A100-40GB"],
        ["predict", str(grid), "--gpu", "A100-40GB"],
        ["plan", "test_vit", "--effective-batch", "8", "--image-size", "32", "--top", "1"],
        ["report", str(rows)],
        ["cost", str(rows), "--allow-cpu-projection"],
        ["claims", "--results", str(claims), "--format", "json"],
        ["equivalence", "test_vit", "--image-size", "32", "--effective-batch", "4", "--accum", "2"],
        ["peak"],
    ]


@pytest.mark.serial  # one interpreter running every command, cells and torchrun included
def test_no_command_imports_a_module_planted_in_the_working_directory(tmp_path):
    folder, marks = tmp_path / "work", tmp_path / "marks"
    folder.mkdir()
    _plant(folder, marks)
    started = _python(folder, "-m", "bench", "--version")  # the real start, whose path holds the folder
    done = _python(folder, "-c", _DRIVER, json.dumps(_every_command(folder)))
    assert not sorted(path.name for path in marks.iterdir()), "a planted module ran"
    assert started.returncode == 0, started.stderr
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []
    runs = folder / "results" / "planted" / detect_device("cpu").tag / "runs.csv"
    assert [row["world_size"] for row in read_rows(runs) if row["status"] == "ok"] == ["1", "2"]
