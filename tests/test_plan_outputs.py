"""`bench plan`'s outputs agree with themselves (#37 item 5): progress on stderr, per-GPU and global figures in
fields of their own, a micro-batch that divides tried before an instance is dropped, `--rank-by`, what a plan
leaves out and the cores that would feed it."""

from __future__ import annotations

import json

import pytest
from conftest import REPO

import bench
from bench.cli import main

# test_resnet at 32 px traces in about a second; effective batch 64 on an H100 fits as 64 x 1 on one GPU, which
# times 8 does not divide 64: the 8-GPU instances need micro-batch 8.
ARGS = ["plan", "test_resnet", "--effective-batch", "64", "--image-size", "32", "--gpu", "H100-80GB",
        "--precision", "bf16", "--provider", "lambda"]


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


@pytest.mark.slow  # traces the plan's configurations: 3 s on 2 cores
def test_an_eight_gpu_instance_gets_a_micro_batch_that_divides_the_effective_batch():
    plan = bench.plan(model="test_resnet", effective_batch=64, image_size=32, gpus=("H100-80GB",),
                      precisions=("bf16",), providers=("lambda",))
    eight = [option for option in plan.options if option.line.instance.gpu_count == 8]
    assert eight, plan.left_out
    for option in eight:
        assert option.line.row.micro_batch * option.accum_steps_per_gpu * 8 == 64
    assert any(option.line.instance.gpu_count == 1 and option.line.row.micro_batch == 64 for option in plan.options)


def test_json_fields_are_per_gpu_or_global_never_both(capfd):
    assert main([*ARGS, "--format", "json"]) == 0
    doc = json.loads(capfd.readouterr().out)
    for option in doc["options"]:
        line = option["line"]
        assert option["global_batch"] == line["global_batch"] == 64
        assert option["accum_steps_per_gpu"] == line["accum_steps_per_gpu"]
        assert line["effective_batch_per_gpu"] * line["gpu_count"] == line["global_batch"]
        assert option["micro_batch"] * option["accum_steps_per_gpu"] * option["gpu_count"] == 64
        assert "accum_steps" not in line and "effective_batch" not in line  # measured ones say so in their name


def test_text_plan_on_stdout_progress_on_stderr(capfd):
    assert main(ARGS) == 0
    captured = capfd.readouterr()
    assert captured.out.startswith("plan: test_resnet at effective batch 64")
    assert "predicted" in captured.err and "peaks at micro-batches" in captured.err
    assert "peaks at micro-batches" not in captured.out
    assert "1 GPUs" not in captured.err + captured.out and "on 1 GPU in" in captured.err
    text = " ".join(captured.out.split())
    assert "at the predicted image size (32 px)" in text and "measured image size" not in text
    assert "not included: reading and decoding the data" in text and "evaluation" in text and "start-up" in text
    # The predictor made a row for each GPU count whose share its split divides: the 1-GPU row is not an option the
    # 8-GPU instance lost, so no "left out" line counts it (it counted one per such pair).
    assert "does not divide" not in text
    # The cores to feed the winner, from the repository's own loader measurement, named as such.
    assert text.count("feeding:") == 2  # the formula once, the winner once
    assert "samples/s per core" in text and "the repository's input-pipeline study (results/input_pipeline" in text


def test_rank_table_columns_line_up_whatever_the_instance_labels(capfd):
    assert main([*ARGS, "--wide"]) == 0
    lines = capfd.readouterr().out.splitlines()
    header = lines[1]
    table = [line for line in lines[2:] if line[:6].strip().isdigit()]
    assert len(table) >= 2
    for column in ("configuration", "feeding", "basis"):
        at = header.index(column)
        assert all(line[at - 2:at] == "  " and line[at] != " " for line in table), column


def test_rank_by_hours_puts_the_fastest_first(capfd):
    assert main([*ARGS, "--rank-by", "hours", "--format", "json"]) == 0
    doc = json.loads(capfd.readouterr().out)
    hours = [option["hours_per_run"] for option in doc["options"]]
    assert hours == sorted(hours) and doc["request"]["rank_by"] == "hours"
    assert doc["options"][0]["gpu_count"] == 8  # 8 GPUs finish first, though they cost more per run


def test_lines_fit_the_terminal_width(capfd, monkeypatch):
    from bench.report import console

    monkeypatch.setattr(console.console, "_width", 90)
    monkeypatch.setattr(console.console, "_force_terminal", True)
    assert main(ARGS) == 0
    out = capfd.readouterr().out
    notes = out.split("\nwhy: ", 1)[1].splitlines()
    assert max(len(line) for line in notes) <= 90


def test_plan_and_cost_defaults_come_from_the_dataclasses_that_own_them(monkeypatch):
    """#37 item 3: headroom, scaling efficiency, dataset size and epochs are stated once, in `Workload` and
    `Assumptions`; the command line reads them from there."""
    from dataclasses import dataclass

    from bench.cli import _parser
    from bench.cost.price import Assumptions, Workload

    @dataclass(frozen=True)
    class Shorter(Workload):
        epochs: float = 3

    @dataclass(frozen=True)
    class Tighter(Assumptions):
        scaling_efficiency: float = 0.5
        headroom: float = 0.25

    monkeypatch.setattr("bench.commands.cost.Workload", Shorter)
    monkeypatch.setattr("bench.commands.cost.Assumptions", Tighter)
    for command in (["plan", "resnet50", "--effective-batch", "8"], ["cost", "results/resnet50/predicted"]):
        args = _parser.__wrapped__().parse_args(command)  # a fresh parser: the cached one was built before the patch
        assert (args.epochs, args.scaling_efficiency, args.headroom, args.dataset_size) == \
            (3, 0.5, 0.25, Workload().dataset_size)
    # The API leaves them to the same dataclasses.
    plan = bench.plan(model="test_resnet", effective_batch=16, image_size=32, predict="never")
    assert plan.assumptions == Assumptions() and plan.request.workload == Workload()


def test_a_plan_states_how_often_the_estimators_fit_answer_was_right_for_its_models_family(capfd):
    assert main([*ARGS, "--format", "json"]) == 0
    said = json.loads(capfd.readouterr().out)["estimator_agreement"]
    # test_resnet is of timm's test family, which timm's public RTX 3090 table has no row of: the answer says so
    assert said["family"] == "test" and said["family_rows"] == 0 and "no public row" in said["text"]
    assert said["rows"] > 250 and said["headroom"] == 0.10
    assert main(ARGS) == 0
    assert "memory answers: estimator vs public fit/OOM rows" in capfd.readouterr().out

