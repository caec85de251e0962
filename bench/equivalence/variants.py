"""The equivalence study's variants and defaults, as plain data: the CLI builds its options from these
without loading torch (`bench.equivalence.compare` runs them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # an annotation only: importing bench.train.step would load torch
    from bench.train.step import LossNormalization

Variant = Literal["correct", "no_divide", "mean_of_means", "sum_then_divide", "frozen_bn", "groupnorm",
                  "checkpoint"]
DType = Literal["fp32", "fp64"]
Split = Literal["equal", "unequal"]
Norm = Literal["as_built", "frozen_batchnorm", "groupnorm"]


@dataclass(frozen=True)
class Setup:
    """What a variant does; only `norm` applies to the large batch too."""

    normalization: LossNormalization
    """How each micro-batch's loss is scaled (`bench.train.step.LossNormalization`)."""
    split: Split
    """K micro-batches of N/K samples, or alternately half as large again and half as small."""
    norm: Norm
    """The model's BatchNorm layers: as built (training mode), frozen (eval mode), or GroupNorm."""
    checkpointing: bool
    """Activation checkpointing (recompute in backward) on the accumulated side."""
    summary: str


VARIANTS: dict[Variant, Setup] = {
    "correct": Setup("accum_steps", "equal", "as_built", False, "loss / K over K equal micro-batches"),
    "no_divide": Setup("none", "equal", "as_built", False, "bug: each micro-batch's loss not divided by K"),
    "mean_of_means": Setup("accum_steps", "unequal", "as_built", False,
                           "bug: unequal micro-batches, each mean loss / K (a mean of means)"),
    "sum_then_divide": Setup("samples", "unequal", "as_built", False,
                             "fix: unequal micro-batches, summed losses / N samples"),
    "frozen_bn": Setup("accum_steps", "equal", "frozen_batchnorm", False,
                       "fix: BatchNorm in eval mode (frozen running statistics), both sides"),
    "groupnorm": Setup("accum_steps", "equal", "groupnorm", False,
                       "fix: every BatchNorm replaced by GroupNorm, both sides"),
    "checkpoint": Setup("accum_steps", "equal", "as_built", True,
                        "activation checkpointing: the recompute runs BatchNorm again"),
}


STUDY_MODELS = ("resnet50", "vit_base_patch16_224")
STUDY_ACCUM_STEPS = (1, 2, 4, 8, 16)
