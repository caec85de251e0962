"""Shared helpers: grid files written on the fly, the `bench` command run as a user runs it."""

from __future__ import annotations

import csv
import itertools
import multiprocessing.process
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch  # noqa: F401 - loaded before the tests: its first import runs ldconfig, a process the guard below refuses
from matplotlib import font_manager  # noqa: F401 - likewise: on a new install its first import builds the font cache with fc-list

REPO = Path(__file__).resolve().parent.parent
# The device tag of the committed CPU rows (the one results/resnet50/cpu-* folder): tests that read them follow a
# re-measurement on another machine instead of naming one.
(CPU_TAG,) = [folder.name for folder in (REPO / "results" / "resnet50").glob("cpu-*")]


@pytest.fixture(autouse=True)
def _processes_only_in_slow_tests(request, monkeypatch):
    """A test that starts a process (a cell, torchrun, the `bench` command) must be marked `slow`,
    so that `make test-fast` leaves it out: unmarked, it fails here instead of running slowly."""
    if request.node.get_closest_marker("slow"):
        return

    def refuse(*args, **kwargs):
        raise AssertionError("this test starts a process: mark it @pytest.mark.slow")

    class GitOnly(subprocess.Popen):  # git (provenance) is a quick read; interpreters and torchrun are not
        def __init__(self, args, *rest, **kwargs):
            program = args[0] if isinstance(args, (list, tuple)) else str(args).split()[0]
            if Path(str(program)).name != "git":
                refuse()
            super().__init__(args, *rest, **kwargs)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    monkeypatch.setattr(subprocess, "Popen", GitOnly)


@pytest.fixture
def write_grid(tmp_path):
    """Write a grid file from TOML text; returns its path."""
    def write(text: str, name: str = "grid.toml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path
    return write


def run_bench(*args: str, cwd: Path = REPO, **kwargs) -> subprocess.CompletedProcess:
    """`bench ARGS` in a fresh interpreter, as from the command line."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=cwd, capture_output=True,
                          text=True, env=env, timeout=1800, **kwargs)  # a hang guard, not a speed limit


def paragraphs(text: str, prefix: str) -> list[str]:
    """The lines of console `text` that start with `prefix`, each joined with its wrapped continuation lines (those
    indented four more spaces), as one line: what `bench plan` wraps at 120 characters reads back whole."""
    lines, found = text.splitlines(), []
    for index, line in enumerate(lines):
        if line.startswith(prefix):
            rest = itertools.takewhile(lambda more: more.startswith(" " * 4), lines[index + 1:])
            found.append(" ".join([line, *(more.strip() for more in rest)]))
    return found


def read_rows(path: Path) -> list[dict]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def tiny_grid(name: str, *, model: str = "test_vit", image_size: int = 32, effective_batch: int = 4,
              pairs: str = "[[4, 1], [2, 2]]", extra_run: str = "") -> str:
    return f"""
        [experiment]
        name = "{name}"

        [grid]
        model = ["{model}"]
        image_size = [{image_size}]
        effective_batch = {effective_batch}
        pairs = {pairs}
        precision = ["fp32"]
        optimizer = ["sgd"]

        [run]
        warmup_steps = 1
        measured_steps = 2
        timeout_s = 120
        adaptive_timing = false
        quiet_wait_s = 0
        {extra_run}
    """


# Tests that start no process but take more than about 1.5 s on two shared cores (pytest --durations, 2026-12):
# marked `slow` here, in one list, so that `make test-fast` stays within its two minutes. `make test` runs them.
# An entry is a node id or its prefix (a test function with every parameter, a doctest by its module).
SLOW_TESTS = (
    "tests/test_speed.py::test_no_predicted_cell_exceeds_75_percent_of_its_dense_peak",  # traces ResNet-50, ViT-B/16
    "tests/test_speed.py::test_faster_memory_and_a_newer_gpu_predict_faster",             # at 224 px (the same
    "tests/test_speed.py::test_half_precision_channels_last_is_at_least_as_fast",         # module fixture)
    "tests/test_speed.py::test_tf32_lies_between_fp32_and_half_precision",
    "tests/test_speed.py::test_the_study_models_op_mix_is_what_their_layers_are",
    "tests/test_speed.py::test_smaller_micro_batches_never_predict_more_samples_per_second",
    "tests/test_speed.py::test_recorder_sees_a_vits_attention",
    "tests/test_speed.py::test_recorder_sees_a_resnets_convolutions",
    "tests/test_speed.py::test_predicted_rows_are_priced_on_their_own_gpu_only",
    "tests/test_speed.py::test_a_tiny_step_is_bound_by_its_overheads_and_its_gpu_time_grows_with_the_micro_batch",
    "tests/test_report.py::test_rerun_on_unchanged_rows_gives_identical_files",
    "tests/test_report.py::test_data_parallel_cells_get_their_own_table",
    "tests/test_report.py::test_single_row_folder_is_reported",
    "tests/test_report.py::test_throughput_chart_has_a_line_per_precision_and_checkpointing",
    "tests/test_claims.py::test_the_live_loss_tensor_keeps_a_growing_graph",
    "tests/test_claims.py::test_the_table_regenerates_byte_for_byte",
    "tests/test_measure.py::test_cpu_peak_is_measured_and_says_so",
    "tests/test_measure.py::test_peak_memory_falls_with_the_micro_batch_at_fixed_effective_batch",
    "tests/test_step.py::test_layernorm_model_accumulates_to_the_large_batch_gradient",
    "tests/test_equivalence.py::test_study_writes_table_chart_and_csv_and_the_tables_regenerate_from_the_csv",
    "tests/test_cuda_autocast.py::test_sdpa_on_cuda_is_flash_or_efficient_and_saves_less_than_eager_or_math",
    "tests/test_cuda_autocast.py::test_the_issues_two_vit_oom_batches_do_not_fit_a_24_gb_card",
    "tests/test_cuda_autocast.py::test_the_weight_cast_cache_is_its_own_category",
    "tests/test_faults_cli.py::test_a_skypilot_file_of_50000_rows_imports_in_one_pass",
    "tests/test_faults_cli.py::test_a_runs_file_past_the_size_bound_is_refused_before_it_is_read",
    "tests/test_faults_cli.py::test_readers_never_see_a_half_row_while_the_writer_appends",
    "tests/test_faults.py::test_readers_leave_a_torn_last_line_and_only_the_writer_sets_it_aside",
    "tests/test_estimate.py::test_estimate_equals_the_cpu_runners_tracked_measurement[test_vit-bf16-full-adamw-4]",
    "tests/test_estimate.py::test_estimate_equals_the_cpu_runners_tracked_measurement[test_vit-fp32-off-adamw8bit-2]",
    "tests/test_estimate.py::test_estimate_equals_the_cpu_runners_tracked_measurement[test_resnet-fp32-off-adamw-4]",
    "tests/test_estimate.py::test_peak_grows_with_the_micro_batch_and_falls_with_checkpointing",
    "tests/test_estimate.py::test_cached_fake_models_start_every_cell_fresh",
    "tests/test_estimate.py::test_cuda_estimate_adds_block_rounding_inputs_and_workspace",
    "tests/test_cache.py::test_an_estimate_from_two_micro_batches_equals_the_full_trace[axes0-cuda]",
    "tests/test_cache.py::test_an_estimate_from_two_micro_batches_equals_the_full_trace[axes2-cuda]",
    "bench/memory/estimate.py::bench.memory.estimate.estimate_cell",
    "bench/speed/predict.py::bench.speed.predict.predict_on",
    # The next in line once those were out (a shared fixture or a first model build moves to the next test):
    "tests/test_claims.py::test_the_live_loss_keeps_graph_nodes_not_tensors",  # the live-loss module fixture
    "tests/test_claims.py::test_last_n_checkpointing_lies_between_off_and_full",
    "tests/test_claims.py::test_zero_grad_zeros_keeps_the_gradients_after_the_step",
    "tests/test_claims.py::test_aux_loss_attached_changes_the_gradient_and_detached_does_not",
    "tests/test_claims.py::test_every_micro_step_runs_at_the_same_weights",  # then the live-loss fixture (24 s)
    "tests/test_measure.py::test_row_splits_static_memory_and_traces_every_phase",
    "tests/test_measure.py::test_checkpointing_lowers_activation_memory",
    "tests/test_measure.py::test_eight_bit_adamw_state_is_about_a_quarter_of_fp32_adamw",
    "tests/test_input.py::test_a_loader_cell_in_process_records_its_input",
    "tests/test_input.py::test_the_step_gives_the_same_gradients_from_a_lazy_step_as_from_a_list",
    "tests/test_input.py::test_a_report_with_loader_rows_draws_synthetic_and_loader_side_by_side",
    "tests/test_cache.py::test_an_estimate_from_two_micro_batches_equals_the_full_trace[axes1-cpu]",
    "tests/test_step.py::test_batchnorm_model_does_not_match_the_large_batch_gradient",
    "tests/test_step.py::test_loss_is_divided_by_k",
    "tests/test_equivalence.py::test_layernorm_model_matches_the_large_batch_up_to_k_16",
    "tests/test_equivalence.py::test_checkpoint_recompute_updates_batchnorm_statistics_twice",
    "tests/test_equivalence.py::test_batchnorm_model_differs_and_frozen_statistics_or_groupnorm_restore_it",
    "tests/test_estimate.py::test_estimate_equals_the_cpu_runners_tracked_measurement[test_resnet-bf16-full-sgd-1]",
    "tests/test_estimate.py::test_estimate_equals_the_cpu_runners_tracked_measurement[test_vit-fp32-off-sgd-1]",
    "tests/test_faults_cli.py::test_report_reads_a_runs_file_linked_from_outside_and_leaves_the_target_alone",
    "tests/test_model_ref.py::test_plan_predicts_options_for_a_model_from_a_module_built_with_its_arguments",
    "tests/test_model_ref.py::test_probe_answers_for_a_model_from_a_file_or_a_module_with_its_input_and_classes",
    "tests/test_cli.py::test_cost_json",
    "tests/test_cli.py::test_estimate_json",
    "bench/equivalence/compare.py::bench.equivalence.compare.compare",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith(SLOW_TESTS):
            item.add_marker(pytest.mark.slow)
