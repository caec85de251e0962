"""The one FLOP counter (bench.measure.flops) and the throughput model's op recorder agree, grouped convolutions too."""

from __future__ import annotations

import pytest
from torch.utils.flop_counter import FlopCounterMode

from bench.measure.flops import counter, flops_per_sample
from bench.measure.ops import OpRecorder
from bench.train.models import build_model, synthetic_batch
from bench.train.optim import build_optimizer
from bench.train.step import train_step


def _step_flops(model_name: str) -> tuple[float, float, float]:
    """(the recorder's total, the corrected counter's, torch's own) over one training step of 2 samples."""
    model = build_model(model_name, 32)
    optimizer = build_optimizer("sgd", model.parameters())
    batch = synthetic_batch(2, 32, channels_last=False, device="cpu")
    with FlopCounterMode(display=False) as plain, counter() as corrected, OpRecorder() as recorder:
        train_step(model, optimizer, [batch], "fp32")
    return sum(record.flops for record in recorder.records), corrected.get_total_flops(), plain.get_total_flops()


@pytest.mark.slow
def test_a_depthwise_convolutions_weight_gradient_is_counted_once_per_group():
    recorded, corrected, plain = _step_flops("test_efficientnet")  # depthwise convolutions
    assert recorded == corrected < plain  # torch's formula counts each depthwise weight gradient channels times
    # and the MFU's numerator is that corrected count (2 samples in the step)
    assert flops_per_sample("test_efficientnet", 32, "off").model == pytest.approx(corrected / 2)


@pytest.mark.slow  # a second model's step (about 2 s); the correction only changes grouped convolutions
def test_without_groups_the_count_is_torchs():
    recorded, corrected, plain = _step_flops("test_resnet")
    assert recorded == corrected == plain > 0
