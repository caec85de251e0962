"""The accumulation step: K micro-batches against one large batch."""

from __future__ import annotations

import pytest
import torch

from bench.train.models import build_model, synthetic_batch
from bench.train.step import accumulate_gradients

pytestmark = pytest.mark.slow  # every test builds and steps a model several times (1.5 s and more on two shared cores)


def _gradients(model_name: str, accum_steps: int, effective_batch: int = 16) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = build_model(model_name, 32)
    images, labels = synthetic_batch(effective_batch, 32, channels_last=False, device="cpu", seed=1)
    micro_batches = list(zip(images.chunk(accum_steps), labels.chunk(accum_steps)))
    accumulate_gradients(model, micro_batches, "fp32")
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _max_relative_difference(a: dict, b: dict) -> float:
    return max(((a[k] - b[k]).norm() / b[k].norm().clamp_min(1e-12)).item() for k in b)


def test_layernorm_model_accumulates_to_the_large_batch_gradient():
    large = _gradients("test_vit", 1)
    for accum_steps in (2, 4, 16):
        assert _max_relative_difference(_gradients("test_vit", accum_steps), large) < 1e-5


def test_batchnorm_model_does_not_match_the_large_batch_gradient():
    # BatchNorm normalises each micro-batch with its own statistics.
    assert _max_relative_difference(_gradients("test_resnet", 4), _gradients("test_resnet", 1)) > 1e-3


def test_loss_is_divided_by_k():
    # Without the division, K micro-batches would give gradients K times too large.
    large, accumulated = _gradients("test_vit", 1), _gradients("test_vit", 8)
    ratios = [(accumulated[k].norm() / large[k].norm()).item() for k in large if large[k].norm() > 0]
    assert max(abs(r - 1) for r in ratios) < 1e-4
