"""The command line's conventions: version, help with examples, --format json alone on stdout, progress,
warnings kept out of answers, the optional SLURM extra, `bench list --profile`."""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import sys
import warnings

import pytest
from conftest import CPU_ROWS, REPO

from bench.cli import _log_warnings, _parser, main, subcommand_parsers
from bench.errors import MissingExtra, OptionError

RESNET_CPU_ROWS = CPU_ROWS.parent


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == "bench 0.1.0"


def test_top_level_help_shows_examples_not_a_docstring(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "examples:" in out and "bench probe resnet50 --gpu A100-40GB" in out
    assert "Parse, hand over" not in out  # the module's docstring is not the help


def _subcommands():
    return [(sub.prog, sub) for sub, _ in subcommand_parsers(_parser())]


@pytest.mark.parametrize("prog,sub", _subcommands(), ids=[prog for prog, _ in _subcommands()])
def test_every_subcommand_help_ends_with_an_example_that_parses(prog, sub):
    last = sub.format_help().rstrip().splitlines()[-1]
    assert last.startswith(f"example: {prog}"), f"{prog} --help ends with {last!r}"
    words = shlex.split(last.removeprefix("example: "))
    _parser().parse_args(words[1:])  # a mistake would raise OptionError


def test_every_subcommand_has_a_description(capsys):
    for prog, sub in _subcommands():
        assert sub.description, prog


def test_list_profile_cuda_on_any_machine(capsys):
    assert main(["list", "experiments/resnet50.toml", "--profile", "cuda"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("# resnet50: 90 cells, profile cuda")
    assert all("-224px-" in line for line in lines[1:]) and len(lines) == 91


def test_list_profile_cpu(capsys):
    assert main(["list", "experiments/resnet50.toml", "--profile", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "profile cpu" in lines[0] and all("-32px-" in line for line in lines[1:])


def _json(capfd, argv: list[str], code: int = 0) -> dict:
    assert main(argv) == code
    out = capfd.readouterr().out
    return json.loads(out)  # the whole of stdout is one document


def test_list_json(capfd):
    doc = _json(capfd, ["list", "experiments/smoke.toml", "--profile", "cpu", "--format", "json"])
    assert doc["command"] == "list" and doc["schema_version"] == 1
    (grid,) = doc["grids"]
    assert grid["name"] == "smoke" and grid["profile"] == "cpu"
    assert {cell["model"] for cell in grid["cells"]} == {"test_vit", "test_resnet"}
    assert all(cell["cell_id"].startswith(cell["model"]) for cell in grid["cells"])


@pytest.mark.slow
def test_probe_json_and_trials_on_stderr(capfd):
    assert main(["probe", "test_resnet", "--memory-gib", "1", "--format", "json"]) == 0
    captured = capfd.readouterr()
    doc = json.loads(captured.out)
    assert doc["command"] == "probe" and doc["found"] is None
    predicted = doc["predicted"]
    assert predicted["largest_micro_batch"] == max(t["micro_batch"] for t in predicted["trials"] if t["fits"])
    assert doc["budget"]["gib"] == 1 and doc["budget"]["headroom"] == 0.1
    # every trial was printed as it ended, with the bracket
    assert captured.err.count("estimate trial ") == len(predicted["trials"])
    assert f"limit in [{predicted['largest_micro_batch']}, {predicted['largest_micro_batch'] + 1})" in captured.err


@pytest.mark.slow
def test_probe_text_prints_trials_then_the_answer(capfd):
    assert main(["probe", "test_resnet", "--memory-gib", "1"]) == 0
    captured = capfd.readouterr()
    assert "estimate trial 1: micro-batch" in captured.err
    assert "predicted largest micro-batch:" in captured.out and "trial" not in captured.out.split("\n")[0]


def test_plan_json(capfd):
    doc = _json(capfd, ["plan", str(RESNET_CPU_ROWS), "--model", "resnet50", "--effective-batch", "128",
                        "--allow-cpu-projection", "--predict", "never", "--top", "3", "--format", "json"])
    assert doc["command"] == "plan" and len(doc["options"]) == 3 and doc["options_total"] >= 3
    costs = [option["usd_per_run"] for option in doc["options"]]
    assert costs == sorted(costs)
    assert doc["options"][0]["line"]["basis"] == "projected_from_cpu_profile"
    assert doc["reason"].startswith(doc["options"][0]["instance"])


@pytest.mark.slow
def test_cost_json(capfd, tmp_path):
    folder = tmp_path / "resnet50" / "cpu"
    folder.mkdir(parents=True)
    shutil.copy(RESNET_CPU_ROWS / "runs.csv", folder / "runs.csv")
    doc = _json(capfd, ["cost", str(folder), "--allow-cpu-projection", "--provider", "aws", "--format", "json"])
    (answer,) = doc["folders"]
    priced = [line for line in answer["lines"] if line["status"] == "priced"]
    assert priced and all(line["provider"] == "aws" and line["usd_per_run"] > 0 for line in priced)
    assert sorted(answer["written"]) == sorted(str(folder / "cost" / name)
                                               for name in ("cost.csv", "cost.md", "usd_per_run.png"))


@pytest.mark.slow
def test_estimate_json(capfd, tmp_path):
    doc = _json(capfd, ["estimate", "experiments/smoke.toml", "--profile", "cpu", "--results", str(tmp_path),
                        "--format", "json"])
    (grid,) = doc["grids"]
    assert grid["runs_file"] == str(tmp_path / "smoke" / "estimate" / "runs.csv")
    assert len(grid["rows"]) == 4 and all(row["status"] == "estimated" for row in grid["rows"])
    assert all(row["peak_memory_bytes"] > 0 for row in grid["rows"])


@pytest.mark.slow
def test_claims_json(capfd, tmp_path):
    shutil.copytree(REPO / "results", tmp_path / "results")
    doc = _json(capfd, ["claims", "--results", str(tmp_path / "results"), "--format", "json"])
    assert sum(doc["counts"].values()) == len(doc["claims"]) > 0
    assert {claim["verdict"] for claim in doc["claims"]} <= {"holds", "partly", "does not hold", "exceeds the claim",
                                                            "not testable here"}


@pytest.mark.serial
def test_json_pipes_into_json_tool():
    """As a user runs it: `bench probe ... --format json | python -m json.tool`."""
    import subprocess

    bench = subprocess.Popen([sys.executable, "-m", "bench", "probe", "test_resnet", "--memory-gib", "1",
                              "--format", "json"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    tool = subprocess.run([sys.executable, "-m", "json.tool"], stdin=bench.stdout, capture_output=True, text=True)
    bench.stdout.close()
    assert bench.wait() == 0 and tool.returncode == 0, tool.stderr
    assert json.loads(tool.stdout)["command"] == "probe"


def test_progress_is_quiet_when_not_a_terminal(capsys):
    from bench.report.console import steps

    with steps(2, interactive=False) as step:
        step.advance("one")
        step.say("a line")
        step.advance("two")
    assert capsys.readouterr().out == "a line\n"


def test_slurm_without_submitit_names_the_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "submitit", None)  # import submitit -> ImportError
    assert main(["run", "experiments/smoke.toml", "--executor", "slurm", "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "bench: --executor slurm needs submitit, which is not installed: pip install 'bench[slurm]'"
    assert issubclass(MissingExtra, Exception) and not list(tmp_path.iterdir())


def test_third_party_warnings_go_to_the_log_not_the_terminal(monkeypatch, tmp_path, capfd):
    log = tmp_path / "bench.log"
    monkeypatch.setenv("BENCH_LOG", str(log))
    root = logging.getLogger()
    before = list(root.handlers)
    try:
        with warnings.catch_warnings():
            _log_warnings()
            warnings.warn("a library's UserWarning")
            logging.getLogger("bitsandbytes.backends.cpu.ops").warning("Failed to load CPU gemm_4bit_forward")
    finally:
        logging.captureWarnings(False)
        for handler in set(root.handlers) - set(before):
            handler.close()
            root.removeHandler(handler)
    captured = capfd.readouterr()
    assert "UserWarning" not in captured.err and "gemm_4bit" not in captured.err
    text = log.read_text()
    assert "a library's UserWarning" in text and "bitsandbytes.backends.cpu.ops WARNING Failed" in text


def _raise_wrapped_interrupt(*args, **kwargs):
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt as interrupt:  # how matplotlib's import hands back a Ctrl-C that lands inside it
        raise RuntimeError("Error calling __set_name__ on '_axis_method_wrapper'") from interrupt


def test_ctrl_c_that_a_library_wraps_is_still_an_interrupt_not_a_traceback(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr("bench.commands.grids.load_grid", _raise_wrapped_interrupt)
    assert main(["run", "experiments/smoke.toml", "--results", str(tmp_path)]) == 130
    assert capsys.readouterr().err == "bench: interrupted; rows of finished cells are kept, rerun to resume\n"


def _swallow_a_sigterm(*args, **kwargs):
    import signal

    try:
        os.kill(os.getpid(), signal.SIGTERM)  # the command's handler raises KeyboardInterrupt here
    except KeyboardInterrupt:
        pass  # how torch's distributed import (a C extension) lost one: no interrupt left in the chain
    raise TypeError("expected a message argument")


def test_an_interrupt_a_c_extension_turns_into_another_error_is_still_an_interrupt(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr("bench.commands.grids.load_grid", _swallow_a_sigterm)
    assert main(["run", "experiments/smoke.toml", "--results", str(tmp_path)]) == 130
    assert capsys.readouterr().err == "bench: interrupted; rows of finished cells are kept, rerun to resume\n"


def test_a_library_error_without_an_interrupt_behind_it_is_not_called_one(monkeypatch, tmp_path):
    def fails(*args, **kwargs):
        raise RuntimeError("a real bug")

    monkeypatch.setattr("bench.commands.grids.load_grid", fails)
    with pytest.raises(RuntimeError, match="a real bug"):
        main(["run", "experiments/smoke.toml", "--results", str(tmp_path)])


def test_results_folders_may_follow_the_options_as_well_as_precede_them():
    """`bench plan MODEL --effective-batch N DIR` was refused ("unrecognized arguments: DIR"): argparse gives a list
    positional only the words before the first option. Words left over join it; an unknown option is still refused."""
    parse = _parser().parse_args
    plan = parse(["plan", "resnet50", "--effective-batch", "1024", "results/a", "--top", "2", "results/b"])
    assert [str(p) for p in plan.folders] == ["resnet50", "results/a", "results/b"] and plan.top == 2
    cost = parse(["cost", "results/a", "--epochs", "2", "results/b"])
    assert [str(p) for p in cost.folders] == ["results/a", "results/b"] and cost.epochs == 2
    with pytest.raises(OptionError, match="unrecognized arguments: results/b --bogus"):
        parse(["plan", "resnet50", "--effective-batch", "1024", "results/b", "--bogus"])


@pytest.mark.serial  # the `bench` command itself, in a process
def test_a_command_that_loaded_torch_exits_at_once_with_its_whole_answer_and_its_code(tmp_path):
    """Once torch is loaded the command skips the interpreter's teardown (most of a second): its answer must still be
    whole on a pipe, and its exit code kept (1: nothing fits)."""
    import subprocess

    env = {**os.environ, "BENCH_CACHE_DIR": str(tmp_path)}
    for budget, code in zip((("--gpu", "L4"), ("--memory-gib", "0.0001")), (0, 1)):
        done = subprocess.run([sys.executable, "-m", "bench", "probe", "test_resnet", "--image-size", "32",
                               "--format", "json", *budget], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == code, done.stderr[-2000:]
        answer = json.loads(done.stdout)  # the whole document, flushed before the exit
        assert (answer["predicted"]["largest_micro_batch"] > 0) == (code == 0)
