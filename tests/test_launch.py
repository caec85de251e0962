"""From the plan to a rented GPU: `bench plan --launch-spec` writes a SkyPilot task, its grid and the source."""

from __future__ import annotations

import subprocess
import tarfile

import pytest
import yaml
from conftest import REPO

from bench.cli import main
from bench.planner.launch import SKYPILOT_ACCELERATORS, committed_model
from bench.errors import OptionError
from bench.grid.spec import load_grid

README_PLAN = ["plan", "vit_large_patch16_224", "--effective-batch", "4096", "--image-size", "224"]
"""The README's plan example (the throughput model's options: a minute of tracing ViT-L on this CPU)."""
ROWS_PLAN = ["plan", "resnet50", str(REPO / "results" / "resnet50" / "predicted"), "--effective-batch", "1024",
             "--predict", "never"]
"""A plan from committed rows (seconds)."""


def _any_tree(patch: pytest.MonkeyPatch) -> None:
    """Let these tests run on a checkout with uncommitted changes (a developer's): the refusal of a dirty tree has
    tests of its own, on a repository made for them."""
    patch.setattr("bench.planner.launch.committed_model", lambda model: model)


def _launch(tmp_path_factory, argv: list[str]):
    """The plan's JSON answer, and the folder its launch spec went to."""
    import json

    folder = tmp_path_factory.mktemp("launch")
    capture = folder / "plan.json"
    with capture.open("w") as out, pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.stdout", out)
        _any_tree(patch)
        assert main([*argv, "--launch-spec", str(folder / "task.yaml"), "--format", "json"]) == 0
    return json.loads(capture.read_text()), folder


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    return _launch(tmp_path_factory, ROWS_PLAN)


def test_the_task_asks_for_the_cheapest_options_instance_and_runs_its_grid(launched):
    plan, folder = launched
    best = plan["options"][0]["line"]
    task = yaml.safe_load((folder / "task.yaml").read_text())
    assert task["resources"]["accelerators"] == f"{SKYPILOT_ACCELERATORS[best['gpu']]}:{best['gpu_count']}"
    assert task["resources"]["cloud"] == best["provider"]
    assert "bench run ~/bench-launch/grid.toml --results ~/bench-launch/results" in task["run"]
    assert task["file_mounts"]["~/bench-launch/grid.toml"] == str(folder / "task.toml")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert task["envs"]["BENCH_COMMIT"] == commit
    (cell,) = load_grid(folder / "task.toml", "cuda").cells
    assert (cell.model, cell.image_size, cell.micro_batch, cell.accum_steps, cell.precision, cell.checkpointing) == \
        ("resnet50", best["image_size"], best["micro_batch"], best["accum_steps_per_gpu"], best["precision"],
         best["checkpointing"])


def test_the_source_archive_is_the_repository_at_the_commit_without_results(launched):
    _, folder = launched
    with tarfile.open(folder / "task.src.tar.gz") as archive:
        names = set(archive.getnames())
    assert {"pyproject.toml", "bench/cli.py"} <= names
    assert not any(name.startswith("results/") for name in names)


@pytest.mark.slow  # a minute of tracing ViT-L for the README's plan
def test_skypilots_own_parser_reads_the_task_of_the_readme_plan(tmp_path_factory):
    import sky  # bench[cloud], in make install's pinned set: the task is checked by SkyPilot itself, never skipped
    plan, folder = _launch(tmp_path_factory, README_PLAN)
    best = plan["options"][0]["line"]
    task = sky.Task.from_yaml(str(folder / "task.yaml"))
    (resources,) = task.resources
    assert resources.accelerators == {SKYPILOT_ACCELERATORS[best["gpu"]]: best["gpu_count"]}
    assert str(resources.cloud).lower() == best["provider"] and "bench run" in task.run


def test_a_launch_spec_not_named_yaml_is_one_line_before_anything_runs(capsys, tmp_path):
    assert main([*README_PLAN, "--launch-spec", str(tmp_path / "task.txt")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--launch-spec" in err and not list(tmp_path.iterdir())


def test_a_launch_spec_named_like_a_command_never_reaches_the_clusters_shell(tmp_path_factory):
    """The file name is any text a user typed: the task's scripts name the cluster's copies by fixed names, so a
    `;` cannot run a command there and a space cannot split a path."""
    folder = tmp_path_factory.mktemp("named")
    name = "my task; touch pwned"
    import json

    capture = folder / "plan.json"
    with capture.open("w") as out, pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.stdout", out)
        _any_tree(patch)
        assert main([*ROWS_PLAN, "--launch-spec", str(folder / f"{name}.yaml"), "--format", "json"]) == 0
    task = yaml.safe_load((folder / f"{name}.yaml").read_text())
    for script in (task["setup"], task["run"]):
        assert "pwned" not in script and "my task" not in script
    assert sorted(task["file_mounts"].values()) == [str(folder / f"{name}.src.tar.gz"), str(folder / f"{name}.toml")]
    assert json.loads(capture.read_text())["options"]


def test_a_launch_spec_name_with_a_control_character_is_refused(capsys, tmp_path):
    assert main([*ROWS_PLAN, "--launch-spec", str(tmp_path / "a\nb.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "control characters" in err and not list(tmp_path.iterdir())


def test_the_task_states_what_measuring_the_option_costs(launched):
    plan, folder = launched
    header = (folder / "task.yaml").read_text().split("\nname:")[0]
    best = plan["options"][0]
    # 7 steps (2 warm-up, 5 timed) at micro-batch x K / the predicted samples/s per GPU, priced at the instance's rate
    step_s = best["micro_batch"] * best["accum_steps_per_gpu"] / best["line"]["samples_per_s_per_gpu"]
    assert f"# measuring it: 7 steps at the predicted {step_s:.2f} s each" in header
    assert f"${7 * step_s * best['usd_per_hour'] / 3600:,.2f}-" in header and "not predicted" in header


# --- what the archive carries: committed code only (#37 item 6, #41 item 15) ---------------------

FACTORY = "import timm\n\ndef make(**kwargs):\n    return timm.create_model('test_resnet', **kwargs)\n"


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A git repository standing in for bench's: bench/, pyproject.toml and a committed model file."""
    root = tmp_path / "repo"
    (root / "bench").mkdir(parents=True)
    (root / "nets").mkdir()
    (root / "bench" / "__init__.py").write_text("")
    (root / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (root / "nets" / "tiny.py").write_text(FACTORY)
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "start"], check=True)
    monkeypatch.setattr("bench.planner.launch.REPO", root)
    return root


def test_a_committed_model_file_travels_under_its_repository_path(repo, monkeypatch, tmp_path):
    from bench.planner.launch import grid_text

    name = committed_model(f"{repo / 'nets' / 'tiny.py'}:make")  # the local absolute path a user typed
    assert name == "nets/tiny.py:make"
    plan = _rows_plan()
    grid = tmp_path / "grid.toml"
    grid.write_text(grid_text(plan, plan.options[0], {}, name))
    monkeypatch.chdir(repo)  # the cluster runs bench from the unpacked archive's root
    (cell,) = load_grid(grid, "cuda").cells
    assert cell.model == "nets/tiny.py:make"


def test_uncommitted_model_code_is_refused_naming_the_file(repo):
    (repo / "nets" / "new.py").write_text(FACTORY)
    with pytest.raises(OptionError, match=r"^--launch-spec: nets/new.py: the model's code is not committed"):
        committed_model(f"{repo / 'nets' / 'new.py'}:make")
    (repo / "nets" / "tiny.py").write_text(FACTORY + "# changed\n")
    with pytest.raises(OptionError, match=r"^--launch-spec: nets/tiny.py: uncommitted changes in a file the run"):
        committed_model(f"{repo / 'nets' / 'tiny.py'}:make")


def test_code_outside_the_repository_is_refused(repo, tmp_path):
    outside = tmp_path / "mine.py"
    outside.write_text(FACTORY)
    with pytest.raises(OptionError, match="the model's code is outside the repository"):
        committed_model(f"{outside}:make")


def test_a_tree_dirty_where_the_run_installs_from_is_refused_in_one_line(repo, capsys, tmp_path):
    (repo / "bench" / "__init__.py").write_text("# changed\n")
    (repo / "notes.txt").write_text("not needed by the run\n")
    assert main([*ROWS_PLAN, "--launch-spec", str(tmp_path / "out" / "task.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bench/__init__.py: uncommitted changes" in err
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_without_skypilot_the_launch_line_says_how_to_get_it(capsys, tmp_path, monkeypatch):
    import importlib.util

    _any_tree(monkeypatch)
    assert main([*ROWS_PLAN, "--launch-spec", str(tmp_path / "task.yaml"), "--top", "1"]) == 0
    err = capsys.readouterr().err
    assert "measuring it:" in err
    assert ("pip install 'bench[cloud]'" in err) == (importlib.util.find_spec("sky") is None)


def _rows_plan():
    import bench

    return bench.plan([REPO / "results" / "resnet50" / "predicted"], model="resnet50", effective_batch=1024,
                      predict="never")
