"""The micro-batch probe: search arithmetic, real trials under a cap, answers from the estimator."""

from __future__ import annotations

import pytest
from conftest import bench_in_process, run_bench

from bench.measure.device import detect_device
from bench.memory.estimate import estimate_cell
from bench.memory.probe import (
    Budget,
    ProbeConfig,
    doubling_search,
    probe_on_device,
    search_largest,
)
from bench.units import GIB


@pytest.mark.parametrize("limit", [1, 7, 63, 64, 100, 1000, 5000])
@pytest.mark.parametrize("error", [-0.1, 0.0, 0.1])
def test_a_guess_within_ten_percent_takes_fewer_trials_than_doubling(limit, error):
    fits = lambda n: n <= limit  # noqa: E731
    found = search_largest(fits, guess=max(1, round(limit * (1 + error))))
    assert found.largest == limit
    assert (limit, True) in found.trials and (limit + 1, False) in found.trials
    assert len(found.trials) < len(doubling_search(fits).trials) or limit == 1


@pytest.mark.parametrize("guess", [1, 3, 50, 10_000])
def test_a_bad_guess_still_finds_the_limit(guess):
    assert search_largest(lambda n: n <= 37, guess=guess).largest == 37
    assert search_largest(lambda n: False, guess=guess).largest == 0
    assert search_largest(lambda n: True, guess=guess, max_batch=512).largest == 512


@pytest.mark.slow
def test_probe_finds_the_limit_under_an_imposed_cap_in_fewer_trials_than_doubling():
    config = ProbeConfig.of("test_resnet", image_size=64, precision="fp32", optimizer="sgd")
    limit_gib = 0.4  # about 100 samples: a few seconds per trial
    budget = Budget(limit_gib * GIB, "test cap", device=detect_device("cpu"))
    result = probe_on_device(config, budget, limit_gib, timeout_s=120)
    found = result.found
    assert found.largest > 1
    # The limit is proven: it ran, and one more sample ran out of memory.
    assert (found.largest, True) in found.trials and (found.largest + 1, False) in found.trials
    assert len(found.trials) < result.doubling_trials
    # The cap is on address-space growth, a rough proxy for tensors: the calibrated prediction
    # is close, not exact (seen here: 104 predicted, 143 found).
    assert abs(result.predicted.largest - found.largest) <= 0.5 * found.largest


@pytest.mark.slow
def test_probe_answers_from_the_estimator_for_a_memory_size():
    done = run_bench("probe", "test_vit", "--image-size", "32", "--precision", "bf16", "--accum-steps", "2",
                     "--memory-gib", "0.25")
    assert done.returncode == 0, done.stderr
    line = next(l for l in done.stdout.splitlines() if l.startswith("predicted largest micro-batch"))
    largest = int(line.split(":")[1].split()[0])
    config = ProbeConfig.of("test_vit", accum_steps=2, image_size=32, precision="bf16")

    def need_bytes(micro_batch: int) -> float:
        return estimate_cell(config.cell(micro_batch, "cuda"), "cuda").peak_reserved_bytes * 1.10

    assert need_bytes(largest) <= 0.25 * GIB < need_bytes(largest + 1)
    assert "trials on" not in done.stdout  # nothing ran on a device


@pytest.mark.parametrize("args, option", [
    (["test_vit", "--gpu", "H300"], "--gpu"),
    (["no_such_model", "--memory-gib", "1"], "MODEL"),
    (["test_vit", "--device", "cpu"], "--memory-limit-gib"),
])
def test_bad_probe_input_is_one_line_naming_the_option_and_exit_2(args, option, capfd):
    result = bench_in_process(capfd, "probe", *args)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and option in result.stderr
