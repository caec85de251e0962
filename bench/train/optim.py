"""Optimizer factory: the three optimizers the grids compare."""

from __future__ import annotations

from typing import Iterable

import torch

LEARNING_RATE = 1e-3
SGD_MOMENTUM = 0.9


class OptimizerUnavailable(Exception):
    """The optimizer's library is not installed here; the cell is skipped, not failed."""


def build_optimizer(name: str, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """`adamw` (two fp32 states), `adamw8bit` (bitsandbytes, two 8-bit states) or `sgd`.

    Example:
        >>> opt = build_optimizer("sgd", torch.nn.Linear(2, 2).parameters())
        >>> type(opt).__name__
        'SGD'
    """
    if name == "adamw":
        return torch.optim.AdamW(params, lr=LEARNING_RATE)
    if name == "sgd":
        return torch.optim.SGD(params, lr=LEARNING_RATE, momentum=SGD_MOMENTUM)
    if name == "adamw8bit":
        try:
            import bitsandbytes as bnb
        except ImportError as exc:
            raise OptimizerUnavailable(f"adamw8bit needs bitsandbytes, which is not importable: {exc}") from exc
        # Not timm's `bnbadamw8bit`: that name maps to bitsandbytes' 32-bit AdamW.
        return bnb.optim.AdamW8bit(params, lr=LEARNING_RATE)
    raise ValueError(f"unknown optimizer {name!r}")
