"""Models outside timm's registry, named by the tests as `tests.tiny_models:NAME` or `tests/tiny_models.py:NAME`."""

from __future__ import annotations

from torch import nn


def tiny_cnn(num_classes: int, in_chans: int, width: int = 4) -> nn.Module:
    """A BatchNorm CNN for any input size; `width` comes from --model-kwargs."""
    return nn.Sequential(nn.Conv2d(in_chans, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, num_classes))


def token_mixer() -> nn.Module:
    """Not an image classifier: a linear layer over 16 features, which a 32 px image does not have."""
    return nn.Linear(16, 4)


def identity() -> nn.Module:
    """Runs on any input, and returns the images instead of logits."""
    return nn.Identity()
