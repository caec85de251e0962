"""`bench` answers help, versions, listings and bad input without loading torch, timm or matplotlib: those
load only inside the commands that compute with them, after their input has been checked."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import REPO

HEAVY = ("torch", "timm", "matplotlib")

# Each: arguments, and the exit code they must give (0 answered, 2 refused as bad input).
CALLS = [
    (["--version"], 0),
    (["list", "experiments/resnet50.toml", "--profile", "cuda"], 0),
    (["catalog", "--gpus"], 0),
    (["run", "no_such_grid.toml"], 2),
    (["run", "experiments/smoke.toml", "--timeout-s", "-1"], 2),
    (["estimate", "no_such_grid.toml"], 2),
    (["probe", "resnet-50", "--gpu", "A100-40GB"], 2),
    (["probe", "resnet50", "--gpu", "A100-40GB", "--headroom", "nan"], 2),
    (["plan", "resnet50", "--effective-batch", "-3"], 2),
    (["plan", "resnet50", "no_such_folder", "--effective-batch", "64"], 2),
    (["report", "no_such_folder"], 2),
    (["cost", "no_such_folder"], 2),
]

SCRIPT = textwrap.dedent("""
    import json, sys
    from bench.cli import _parser, main, subcommand_parsers

    calls = json.loads(sys.argv[1])
    codes = []
    for argv, _ in calls:
        try:
            codes.append(main(argv))
        except SystemExit as exit_:
            codes.append(exit_.code)
    helps = [sub.prog.split()[1:] + ["--help"] for sub, _ in subcommand_parsers(_parser())] + [["--help"]]
    for argv in helps:
        try:
            main(argv)
        except SystemExit:
            pass
    heavy = sorted(name for name in sys.modules if name.split(".")[0] in json.loads(sys.argv[2]))
    print(json.dumps({"codes": codes, "helps": len(helps), "heavy": heavy[:5]}))
""")


@pytest.mark.serial
def test_help_listings_and_bad_input_load_no_torch(tmp_path):
    env = {**os.environ, "BENCH_CACHE_DIR": str(tmp_path)}
    # timm's model names are cached per timm version, and each model's bounds once read: the first listing of a grid
    # reads them from timm, later ones do not
    warm = subprocess.run([sys.executable, "-m", "bench", "list", "experiments/smoke.toml", "experiments/resnet50.toml",
                           "--profile", "cuda"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert warm.returncode == 0, warm.stderr
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(CALLS), json.dumps(HEAVY)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["codes"] == [code for _, code in CALLS], done.stderr
    assert report["helps"] > 15  # every subcommand's --help was parsed
    assert report["heavy"] == [], f"loaded while parsing: {report['heavy']}"


READ_AND_REPORT = textwrap.dedent("""
    import json, sys
    import bench.results.derived, bench.results.keys, bench.results.markdown, bench.results.read, bench.results.store
    from bench.cli import main

    code = main(["report", sys.argv[1]])
    estimator = ("bench.memory.estimate", "bench.memory.probe", "bench.memory.traces", "bench.speed.predict",
                 "bench.planner.search")
    loaded = sorted(name for name in sys.modules if name.split(".")[0] in ("torch", "timm") or name in estimator)
    print(json.dumps({"code": code, "loaded": loaded[:5]}))
""")


@pytest.mark.serial
def test_reading_rows_and_reporting_them_load_neither_torch_nor_the_estimator(tmp_path):
    """Reading a runs file and `bench report` need the rows' columns and statistics, not the measurement stack:
    a report on a machine without a working torch (or in a notebook) answers in the time it takes to draw."""
    folder = tmp_path / "cpu_rows"
    shutil.copytree(REPO / "tests" / "data" / "cpu_rows", folder)
    done = subprocess.run([sys.executable, "-c", READ_AND_REPORT, str(folder)], cwd=REPO,
                          env={**os.environ, "BENCH_CACHE_DIR": str(tmp_path / "cache")},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["code"] == 0 and (folder / "REPORT.md").is_file()
    assert report["loaded"] == [], f"loaded to read and report rows: {report['loaded']}"


WARM_ANSWER = textwrap.dedent("""
    import json, sys
    from bench.cli import main

    code = main(sys.argv[1:])
    loaded = sorted(name for name in sys.modules if name.split(".")[0] in ("torch", "timm", "torchvision"))
    print(json.dumps({"code": code, "loaded": loaded[:5]}))
""")


@pytest.mark.serial
@pytest.mark.parametrize("args", [
    ["plan", "test_resnet", "--effective-batch", "64", "--image-size", "32", "--gpu", "A100-40GB", "--gpu", "L4"],
    ["probe", "test_vit", "--image-size", "32", "--gpu", "A100-40GB"],
], ids=["plan", "probe"])
def test_a_warm_plan_or_probe_answers_from_the_cache_without_torch(args, tmp_path):
    """Everything a plan or a probe traced is in the cache (traces, FLOP counts, model checks and bounds): asked again,
    it answers without importing torch or timm, in about a second instead of five."""
    def answer() -> dict:
        done = subprocess.run([sys.executable, "-c", WARM_ANSWER, *args], cwd=REPO,
                              env={**os.environ, "BENCH_CACHE_DIR": str(tmp_path / "cache")},
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.splitlines()[-1])

    cold, warm = answer(), answer()
    # The first answer traced (a cold plan traces in child processes: its own process may load no torch either).
    assert cold["code"] == warm["code"] == 0 and any((tmp_path / "cache" / "traces").iterdir())
    assert warm["loaded"] == [], f"loaded by a warm {args[0]}: {warm['loaded']}"
