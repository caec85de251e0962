"""Accumulation against one large batch: the known divergences, each caught, and their fixes."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import read_rows

from bench.cli import main
from bench.equivalence.compare import (
    EquivalenceError,
    Settings,
    compare,
    prepare,
    relative_l2,
    split_sizes,
)

FP32_TOLERANCE = 1e-5


def _prepared(model: str, variant: str, effective_batch: int = 16, **settings):
    return prepare(Settings(model=model, effective_batch=effective_batch, **settings), variant)


@pytest.mark.slow
def test_layernorm_model_matches_the_large_batch_up_to_k_16():
    prepared = _prepared("test_vit", "correct")
    for accum_steps in (1, 2, 4, 8, 16):
        comparison = compare(prepared, accum_steps)
        assert comparison.grad_rel_l2 < FP32_TOLERANCE, accum_steps
        assert comparison.equivalent, comparison.reason
        assert abs(comparison.loss_accumulated - comparison.loss_large_batch) < 1e-5


@pytest.mark.slow
def test_layernorm_model_matches_to_fp64_rounding():
    comparison = compare(_prepared("test_vit", "correct", dtype="fp64"), 8)
    assert comparison.grad_rel_l2 < 1e-12
    assert comparison.equivalent and comparison.tolerance < FP32_TOLERANCE


@pytest.mark.slow
def test_batchnorm_model_differs_and_frozen_statistics_or_groupnorm_restore_it():
    batchnorm = compare(_prepared("test_resnet", "correct"), 4)
    assert batchnorm.grad_rel_l2 > 1e-2 and not batchnorm.equivalent
    assert "BatchNorm normalises each micro-batch with its own statistics" in batchnorm.reason
    assert (batchnorm.bn_updates_large_batch, batchnorm.bn_updates_accumulated) == (1, 4)
    for fix in ("frozen_bn", "groupnorm"):
        fixed = compare(_prepared("test_resnet", fix), 4)
        assert fixed.grad_rel_l2 < FP32_TOLERANCE and fixed.equivalent, (fix, fixed.reason)


@pytest.mark.slow
def test_missing_division_makes_gradients_k_times_too_large():
    prepared = _prepared("test_vit", "no_divide")
    for accum_steps in (2, 4, 8):
        comparison = compare(prepared, accum_steps)
        assert comparison.grad_norm_ratio == pytest.approx(accum_steps, rel=1e-5)
        assert comparison.grad_rel_l2 == pytest.approx(accum_steps - 1, rel=1e-5)
        assert comparison.loss_accumulated == pytest.approx(accum_steps * comparison.loss_large_batch, rel=1e-5)
        assert not comparison.equivalent and "loss not divided by K" in comparison.reason


@pytest.mark.slow
def test_adamw_first_step_hides_the_missing_division_in_the_weights():
    # Adam divides by the gradient's own scale: K times the gradient gives nearly the same step.
    comparison = compare(_prepared("test_vit", "no_divide", optimizer="adamw"), 4)
    assert comparison.grad_norm_ratio == pytest.approx(4, rel=1e-5)
    assert comparison.weights_rel_l2 < 1e-2


@pytest.mark.slow
def test_mean_of_means_with_unequal_micro_batches_differs_and_count_normalised_is_exact():
    mean_of_means = compare(_prepared("test_vit", "mean_of_means"), 4)
    assert mean_of_means.micro_batch_sizes == (6, 2, 6, 2)
    assert mean_of_means.grad_rel_l2 > 1e-2 and "mean of means" in mean_of_means.reason
    sum_then_divide = compare(_prepared("test_vit", "sum_then_divide"), 4)
    assert sum_then_divide.micro_batch_sizes == (6, 2, 6, 2)
    assert sum_then_divide.grad_rel_l2 < FP32_TOLERANCE and sum_then_divide.equivalent


@pytest.mark.slow
def test_checkpoint_recompute_updates_batchnorm_statistics_twice():
    prepared = _prepared("test_resnet", "checkpoint")
    once = compare(prepared, 1)
    # One micro-batch: the gradients are those of the large batch, the statistics are not.
    assert once.grad_rel_l2 < FP32_TOLERANCE
    assert (once.bn_updates_large_batch, once.bn_updates_accumulated) == (1, 2)
    assert once.bn_stats_rel_l2 > 1e-2 and not once.equivalent and "recompute" in once.reason
    assert compare(prepared, 4).bn_updates_accumulated == 8
    assert compare(_prepared("test_resnet", "correct"), 4).bn_updates_accumulated == 4


def test_split_sizes_add_up_and_differ_when_unequal():
    assert split_sizes(32, 16, "unequal") == (3, 1) * 8
    for effective_batch, accum_steps in ((16, 4), (12, 3), (30, 5), (8, 1)):
        for split in ("equal", "unequal"):
            assert sum(split_sizes(effective_batch, accum_steps, split)) == effective_batch
    assert len(set(split_sizes(12, 3, "unequal"))) == 3


def test_relative_l2_counts_missing_tensors_as_zeros():
    reference = {"a": torch.tensor([3.0, 0.0]), "b": torch.tensor([0.0, 4.0])}
    assert relative_l2(reference, reference) == 0.0
    assert relative_l2({"a": torch.tensor([3.0, 0.0])}, reference) == pytest.approx(4 / 5)
    assert relative_l2({"a": torch.tensor([1.0])}, {"a": torch.tensor([0.0])}) == math.inf


@pytest.mark.parametrize("model, variant, accum_steps, setting", [
    ("test_vit", "correct", 3, "accum_steps"),            # does not divide 16
    ("test_vit", "mean_of_means", 16, "accum_steps"),     # 1 sample each cannot be unequal
    ("test_resnet", "correct", 16, "accum_steps"),        # BatchNorm on 1 sample
    ("test_vit", "frozen_bn", 2, "variant"),              # no BatchNorm to freeze
])
def test_settings_that_cannot_run_name_the_setting(model, variant, accum_steps, setting):
    with pytest.raises(EquivalenceError) as raised:
        compare(_prepared(model, variant), accum_steps)
    assert raised.value.setting == setting


@pytest.mark.slow
def test_cli_prints_the_comparison_and_the_verdict(capsys):
    assert main(["equivalence", "test_resnet", "--effective-batch", "8", "--accum", "2"]) == 0
    out = capsys.readouterr().out
    assert "NOT equivalent" in out and "BatchNorm normalises each micro-batch" in out
    assert "relative L2" in out and "BatchNorm updates" in out


@pytest.mark.parametrize("args, option, allowed", [
    (["test_vitt", "--effective-batch", "8", "--accum", "2"], "MODEL", "did you mean test_vit"),
    (["test_vit", "--effective-batch", "0", "--accum", "2"], "--effective-batch", "positive"),
    (["test_vit", "--effective-batch", "8", "--accum", "3"], "--accum", "allowed: 1, 2, 4, 8"),
    (["test_vit", "--effective-batch", "8", "--accum", "2", "--image-size", "-1"], "--image-size", "positive"),
])
def test_cli_bad_input_is_one_line_naming_the_option(capsys, args, option, allowed):
    assert main(["equivalence", *args]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1, error
    assert f": {option}: " in error and allowed in error, error


@pytest.mark.slow
def test_study_writes_table_chart_and_csv_and_the_tables_regenerate_from_the_csv(tmp_path, capsys):
    assert main(["equivalence", "--study", "test_resnet", "test_vit", "--accum", "1,2", "--effective-batch", "8",
                 "--out", str(tmp_path)]) == 0
    rows = read_rows(tmp_path / "equivalence.csv")
    measured = {(row["model"], row["variant"], row["accum_steps"]): row for row in rows if row["status"] == "ok"}
    assert measured[("test_resnet", "correct", "2")]["equivalent"] == "False"
    assert measured[("test_resnet", "frozen_bn", "2")]["equivalent"] == "True"
    assert measured[("test_vit", "sum_then_divide", "2")]["equivalent"] == "True"
    skipped = [row for row in rows if row["status"] == "skipped"]
    assert {row["variant"] for row in skipped} == {"frozen_bn", "groupnorm"}  # test_vit has no BatchNorm
    assert (tmp_path / "equivalence.png").stat().st_size > 0
    table = (tmp_path / "equivalence.md").read_text()
    assert "| test_resnet | correct |" in table
    assert main(["report", str(tmp_path)]) == 0
    assert (tmp_path / "equivalence.md").read_text() == table
