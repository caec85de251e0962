"""Accumulation against one large batch: are the gradients the same?

From the same weights and the same N samples, one optimizer step is taken twice: once on the
large batch, once as K accumulated micro-batches (the step of `bench.train.step`). The two are
compared on the gradients (relative L2, overall and the worst parameters), the loss, the
BatchNorm running statistics and the weights after the step, and judged by one written rule
(`TOLERANCE`), with the reason.

Each `Variant` is one known way accumulation diverges, or its fix:

- `correct`: loss / K over K equal micro-batches. Exact for LayerNorm models (ViT); not for
  BatchNorm models (ResNet), which normalise each micro-batch with its own statistics.
- `no_divide`: the loss is not divided by K, so the gradients are K times too large.
- `mean_of_means`: unequal micro-batches, each mean loss / K: a sample in a micro-batch of n
  weighs 1/(K n) instead of 1/N (the error behind the 2024 gradient-accumulation loss bug in
  a popular trainer, where micro-batches held unequal numbers of tokens).
- `sum_then_divide`: the fix: unequal micro-batches, summed losses / N.
- `frozen_bn`: the fix for BatchNorm: every BatchNorm in eval mode (frozen running statistics).
- `groupnorm`: the other fix: every BatchNorm replaced by GroupNorm, which normalises each sample.
- `checkpoint`: activation checkpointing on the accumulated side. Gradients are unchanged, but
  the recompute runs every checkpointed BatchNorm a second time, updating its statistics twice.

`frozen_bn` and `groupnorm` change the model, so they apply to the large batch as well.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, get_args

import torch
from torch import nn
from torch.nn.modules.batchnorm import (
    _BatchNorm,  # every BatchNorm flavour, SyncBatchNorm included
)

from bench.equivalence.variants import VARIANTS, DType, Norm, Setup, Split, Variant
from bench.errors import BadInput
from bench.grid.cell import Cell, OptimizerName
from bench.grid.model_ref import timm_model_problem
from bench.train.optim import build_optimizer
from bench.train.step import (
    Batch,
    LossNormalization,
    accumulate_gradients,
    apply_update,
)

DTYPES: dict[DType, torch.dtype] = {"fp32": torch.float32, "fp64": torch.float64}

TOLERANCE: dict[DType, float] = {"fp32": 1e-5, "fp64": 1e-10}
"""The rule: equivalent when the gradients' relative L2 difference, and that of the BatchNorm
running-statistics change, are both at most this. Summing K partial gradients instead of one
reorders float additions: fp32 rounding stays near 1e-7..1e-6, fp64 near 1e-15."""

WORST_PARAMETERS = 3
"""How many of the most different parameters a comparison names."""

GROUPNORM_GROUPS = 32
"""Groups per GroupNorm replacing a BatchNorm (Wu & He's default), fewer where channels require."""


class EquivalenceError(BadInput):
    """A setting that cannot run; `setting` names it, the message says what is allowed."""

    def __init__(self, setting: str, message: str):
        super().__init__(f"{setting}: {message}")
        self.setting, self.message = setting, message


@dataclass(frozen=True, kw_only=True)
class Settings:
    """The model, data and numerics of a comparison; validated on creation.

    Example:
        >>> Settings(model="test_vit", effective_batch=8).dtype
        'fp32'
    """

    model: str
    """timm model name, random init."""
    effective_batch: int
    """Samples in the one optimizer step (N), the same for both sides."""
    image_size: int = 32
    """Square input side in pixels."""
    dtype: DType = "fp32"
    """Weights and inputs in fp32 or fp64; no autocast, no TF32."""
    device: str = "cpu"
    seed: int = 0
    """Seeds the weights and the synthetic batch."""
    optimizer: OptimizerName = "sgd"
    """From `bench.train.optim`; its first step turns the gradients into the weight change."""

    def __post_init__(self) -> None:
        for name in ("effective_batch", "image_size"):
            if getattr(self, name) <= 0:
                raise EquivalenceError(name, f"must be a positive whole number, got {getattr(self, name)}")
        for name, allowed in (("dtype", get_args(DType)), ("optimizer", get_args(OptimizerName))):
            if getattr(self, name) not in allowed:
                raise EquivalenceError(name, f"{getattr(self, name)!r} is not allowed; allowed: {', '.join(allowed)}")
        problem = timm_model_problem(self.model)
        if problem:
            raise EquivalenceError("model", problem)

    @property
    def large_batch(self) -> Cell:
        """The large batch as a cell: one fp32 micro-batch of N samples (`dtype` is applied after)."""
        return Cell(experiment="equivalence", profile="cuda" if self.device.startswith("cuda") else "cpu",
                    model=self.model, image_size=self.image_size, micro_batch=self.effective_batch, accum_steps=1,
                    precision="fp32", checkpointing="off", optimizer=self.optimizer, channels_last=False,
                    warmup_steps=0, measured_steps=1, seed=self.seed)


@dataclass(frozen=True)
class StepOutcome:
    """What one optimizer step leaves behind; the model itself is put back as it was."""

    loss: float
    gradients: dict[str, torch.Tensor]
    weight_changes: dict[str, torch.Tensor]
    """Parameters after the step minus before."""
    stat_changes: dict[str, torch.Tensor]
    """BatchNorm running means and variances after the step minus before."""
    bn_updates: int | None
    """Running-statistics updates of the most-updated BatchNorm layer; None without BatchNorm."""


@dataclass(frozen=True)
class Prepared:
    """A model set up for one variant, its batch, and the large batch's step (the reference)."""

    settings: Settings
    variant: Variant
    model: nn.Module
    images: torch.Tensor
    labels: torch.Tensor
    reference: StepOutcome


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """K accumulated micro-batches against the large batch, for one optimizer step."""

    settings: Settings
    variant: Variant
    accum_steps: int
    """K."""
    micro_batch_sizes: tuple[int, ...]
    loss_large_batch: float
    """Cross-entropy in nats."""
    loss_accumulated: float
    """Summed over the micro-batches, as the step returns it (K times too large without the division)."""
    grad_norm_large_batch: float
    grad_norm_accumulated: float
    grad_rel_l2: float
    """||g_K - g_1|| / ||g_1|| over all parameters together; 0 is identical."""
    worst_parameters: tuple[tuple[str, float], ...]
    """(name, relative L2) of the most different parameters with a nonzero gradient, worst first."""
    bn_stats_rel_l2: float | None
    """The same for the change of the BatchNorm running means and variances; None without BatchNorm."""
    bn_updates_large_batch: int | None
    """Running-statistics updates of the most-updated BatchNorm layer; None without BatchNorm."""
    bn_updates_accumulated: int | None
    weights_rel_l2: float
    """The same for the weights' change in the step; includes rounding w + dw to the weights' dtype."""
    weights_max_abs_diff: float
    """The largest difference of any weight after the step."""
    tolerance: float
    """The rule's bound for this dtype (`TOLERANCE`)."""
    equivalent: bool
    reason: str
    """The causes found when not equivalent, or why the two agree."""

    @property
    def grad_norm_ratio(self) -> float:
        """||g_K|| / ||g_1||: K when the loss was not divided by K."""
        return self.grad_norm_accumulated / self.grad_norm_large_batch


def prepare(settings: Settings, variant: Variant) -> Prepared:
    """Build the model for `variant`, the batch, and take the large batch's step.

    One `Prepared` serves any number of `compare` calls (each K), all from the same weights.

    Example:
        >>> prepared = prepare(Settings(model="test_vit", effective_batch=8), "correct")
        >>> prepared.images.shape
        torch.Size([8, 3, 32, 32])
    """
    from bench.train.setup import cell_batch, seeded_model  # late: timm is slow to import

    if variant not in VARIANTS:
        raise EquivalenceError("variant", f"{variant!r} is not a variant; allowed: {', '.join(VARIANTS)}")
    cell, dtype = settings.large_batch, DTYPES[settings.dtype]
    model = seeded_model(cell, settings.device).to(dtype)  # fp32 means fp32: no TF32 on a GPU
    _apply_norm(model, VARIANTS[variant].norm, settings.model, variant)
    images, labels = cell_batch(cell, settings.device)
    images = images.to(dtype)
    _check_batchnorm_sizes(model, [settings.effective_batch], "effective_batch")
    reference = take_step(model, [(images, labels)], "accum_steps", settings.optimizer)
    return Prepared(settings, variant, model, images, labels, reference)


def compare(prepared: Prepared, accum_steps: int) -> Comparison:
    """The accumulated step against the prepared large batch, judged.

    Example:
        >>> prepared = prepare(Settings(model="test_vit", effective_batch=8), "no_divide")
        >>> round(compare(prepared, 4).grad_norm_ratio, 3)  # slow: steps a model twice
        4.0
    """
    setup = VARIANTS[prepared.variant]
    sizes = _checked_sizes(prepared, accum_steps)
    micro_batches = list(zip(prepared.images.split(sizes), prepared.labels.split(sizes)))
    prepared.model.set_grad_checkpointing(setup.checkpointing)
    try:
        accumulated = take_step(prepared.model, micro_batches, setup.normalization, prepared.settings.optimizer)
    finally:
        prepared.model.set_grad_checkpointing(False)
    return _judge(prepared, sizes, accumulated)


def split_sizes(effective_batch: int, accum_steps: int, split: Split) -> tuple[int, ...]:
    """Micro-batch sizes: K equal ones, or alternately half as large again and half as small.

    An odd K keeps its last micro-batch at N/K. Expects K to divide N.

    Example:
        >>> split_sizes(16, 4, "equal")
        (4, 4, 4, 4)
        >>> split_sizes(16, 4, "unequal")
        (6, 2, 6, 2)
        >>> split_sizes(12, 3, "unequal")
        (6, 2, 4)
    """
    size = effective_batch // accum_steps
    if split == "equal":
        return (size,) * accum_steps
    shift = size // 2
    sizes = [size + shift if index % 2 == 0 else size - shift for index in range(accum_steps)]
    if accum_steps % 2:
        sizes[-1] = size  # the pairs cancel; the odd one out stays at the mean
    return tuple(sizes)


def relative_l2(values: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]) -> float:
    """||values - reference|| / ||reference|| over all tensors of `reference` together.

    A tensor missing from `values` counts as zeros; 0/0 is 0 (both zero is no difference).

    Example:
        >>> relative_l2({"w": torch.tensor([3.0, 4.0])}, {"w": torch.tensor([3.0, 0.0])})
        1.3333333333333333
    """
    diff_sq = sum(_squared_norm(values[k] - ref if k in values else ref) for k, ref in reference.items())
    ref_sq = sum(_squared_norm(ref) for ref in reference.values())
    if ref_sq == 0:
        return 0.0 if diff_sq == 0 else math.inf
    return math.sqrt(diff_sq / ref_sq)


def take_step(model: nn.Module, micro_batches: list[Batch], normalization: LossNormalization,
              optimizer_name: OptimizerName) -> StepOutcome:
    """One optimizer step from the model's current state, which is put back afterwards."""
    before = {key: value.clone() for key, value in model.state_dict().items()}
    stat_keys, count_keys = _batchnorm_state_keys(model)
    optimizer = build_optimizer(optimizer_name, model.parameters())
    # "fp32" selects no autocast: the tensors' own dtype (fp32 or fp64) is the precision.
    loss = accumulate_gradients(model, micro_batches, "fp32", normalization=normalization)
    gradients = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    apply_update(optimizer)
    after = model.state_dict()
    outcome = StepOutcome(
        loss=loss.item(), gradients=gradients,
        weight_changes={name: after[name] - before[name] for name, _ in model.named_parameters()},
        stat_changes={key: after[key] - before[key] for key in stat_keys},
        bn_updates=max(int(after[key] - before[key]) for key in count_keys) if count_keys else None,
    )
    model.load_state_dict(before)
    return outcome


def _judge(prepared: Prepared, sizes: tuple[int, ...], accumulated: StepOutcome) -> Comparison:
    reference, setup = prepared.reference, VARIANTS[prepared.variant]
    tolerance = TOLERANCE[prepared.settings.dtype]
    grad_rel_l2 = relative_l2(accumulated.gradients, reference.gradients)
    bn_stats_rel_l2 = relative_l2(accumulated.stat_changes, reference.stat_changes) if reference.stat_changes else None
    grad_norms = [math.sqrt(sum(map(_squared_norm, o.gradients.values()))) for o in (reference, accumulated)]
    equivalent = grad_rel_l2 <= tolerance and (bn_stats_rel_l2 or 0.0) <= tolerance
    if equivalent:
        reason = _why_equal(setup, sizes)
    else:
        causes = _causes(setup, sizes, _batchnorm_trains(prepared.model), grad_norms[1] / grad_norms[0],
                         reference.bn_updates, accumulated.bn_updates)
        reason = "; ".join(causes) or f"differs beyond {tolerance:g} with no known cause"
    weight_diffs = [(accumulated.weight_changes[k] - change).abs().max().item()
                    for k, change in reference.weight_changes.items()]
    return Comparison(
        settings=prepared.settings, variant=prepared.variant, accum_steps=len(sizes), micro_batch_sizes=sizes,
        loss_large_batch=reference.loss, loss_accumulated=accumulated.loss,
        grad_norm_large_batch=grad_norms[0], grad_norm_accumulated=grad_norms[1], grad_rel_l2=grad_rel_l2,
        worst_parameters=_worst_parameters(accumulated.gradients, reference.gradients),
        bn_stats_rel_l2=bn_stats_rel_l2, bn_updates_large_batch=reference.bn_updates,
        bn_updates_accumulated=accumulated.bn_updates,
        weights_rel_l2=relative_l2(accumulated.weight_changes, reference.weight_changes),
        weights_max_abs_diff=max(weight_diffs), tolerance=tolerance, equivalent=equivalent, reason=reason,
    )


def _causes(setup: Setup, sizes: tuple[int, ...], batchnorm_trains: bool, grad_norm_ratio: float,
            updates_large: int | None, updates_accumulated: int | None) -> list[str]:
    """The known causes present in this step, each with its measured or counted size."""
    accum_steps, causes = len(sizes), []
    if setup.normalization == "none" and accum_steps > 1:
        causes.append(f"loss not divided by K: gradients {grad_norm_ratio:.4g} times the large batch's "
                      f"(K = {accum_steps})")
    if setup.normalization == "accum_steps" and len(set(sizes)) > 1:
        causes.append(f"unequal micro-batches ({min(sizes)} to {max(sizes)} samples) averaged as a mean of "
                      f"means: a sample weighs 1/(K n) of the loss, not 1/N")
    if batchnorm_trains and accum_steps > 1:
        causes.append("BatchNorm normalises each micro-batch with its own statistics")
    if updates_accumulated != updates_large:
        recompute = " (checkpoint recompute runs each checkpointed BatchNorm again)" if setup.checkpointing else ""
        causes.append(f"BatchNorm running statistics updated {updates_accumulated} times, "
                      f"not {updates_large}{recompute}")
    return causes


def _why_equal(setup: Setup, sizes: tuple[int, ...]) -> str:
    if len(sizes) == 1:
        return "one micro-batch is the large batch itself"
    samples = {"as_built": "no layer mixes samples (no BatchNorm in training mode)",
               "frozen_batchnorm": "BatchNorm uses frozen running statistics, so no layer mixes samples",
               "groupnorm": "GroupNorm normalises each sample on its own"}[setup.norm]
    weights = ("summed losses / N weigh each sample 1/N" if setup.normalization == "samples"
               else "K equal micro-batches with loss / K weigh each sample 1/N")
    recompute = "; the checkpoint recompute repeats the same arithmetic" if setup.checkpointing else ""
    return f"{samples}; {weights}{recompute}"


def _worst_parameters(values: Mapping[str, torch.Tensor],
                      reference: Mapping[str, torch.Tensor]) -> tuple[tuple[str, float], ...]:
    # A parameter with a zero reference gradient (e.g. behind a zero-initialised norm) has no
    # relative difference; the overall figure still counts it.
    scored = [(name, relative_l2({name: values[name]}, {name: ref}))
              for name, ref in reference.items() if name in values and _squared_norm(ref) > 0]
    return tuple(sorted(scored, key=lambda item: item[1], reverse=True)[:WORST_PARAMETERS])


def _checked_sizes(prepared: Prepared, accum_steps: int) -> tuple[int, ...]:
    effective_batch, split = prepared.settings.effective_batch, VARIANTS[prepared.variant].split
    if accum_steps <= 0:
        raise EquivalenceError("accum_steps", f"must be a positive whole number, got {accum_steps}")
    if effective_batch % accum_steps:
        divisors = ", ".join(str(k) for k in range(1, effective_batch + 1) if effective_batch % k == 0)
        raise EquivalenceError("accum_steps", f"{accum_steps} does not divide the effective batch of "
                                              f"{effective_batch}; allowed: {divisors}")
    if split == "unequal" and 1 < accum_steps and effective_batch // accum_steps < 2:
        raise EquivalenceError("accum_steps", f"{prepared.variant} splits unequally, which needs at least 2 "
                                              f"samples per micro-batch; {effective_batch} / {accum_steps} is 1")
    sizes = split_sizes(effective_batch, accum_steps, split)
    _check_batchnorm_sizes(prepared.model, sizes, "accum_steps")
    return sizes


def _check_batchnorm_sizes(model: nn.Module, sizes: list[int] | tuple[int, ...], setting: str) -> None:
    # One sample gives BatchNorm no batch statistics to speak of (torch rejects it outright once
    # the feature map is 1x1): say so instead of failing deep inside the forward.
    if min(sizes) < 2 and _batchnorm_trains(model):
        raise EquivalenceError(setting, f"BatchNorm in training mode needs at least 2 samples per "
                                        f"micro-batch, and one here has {min(sizes)}")


def _batchnorm_trains(model: nn.Module) -> bool:
    """Whether some BatchNorm normalises with the batch's own statistics."""
    return any(isinstance(m, _BatchNorm) and m.training for m in model.modules())


def _apply_norm(model: nn.Module, norm: Norm, model_name: str, variant: Variant) -> None:
    if norm == "as_built":
        return
    batchnorms = [m for m in model.modules() if isinstance(m, _BatchNorm)]
    if not batchnorms:
        usable = [v for v, setup in VARIANTS.items() if setup.norm == "as_built"]
        raise EquivalenceError("variant", f"{variant} changes BatchNorm, and {model_name} has none; "
                                          f"allowed for it: {', '.join(usable)}")
    if norm == "frozen_batchnorm":
        for module in batchnorms:
            module.eval()
    else:
        _replace_batchnorm_with_groupnorm(model)


def _replace_batchnorm_with_groupnorm(model: nn.Module) -> None:
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if type(child) is nn.BatchNorm2d:  # subclasses (timm's BatchNormAct2d) hold more than a norm
                setattr(parent, name, _groupnorm_like(child))
    leftover = {type(m).__name__ for m in model.modules() if isinstance(m, _BatchNorm)}
    if leftover:
        raise EquivalenceError("variant", f"groupnorm replaces plain BatchNorm2d only; this model also has "
                                          f"{', '.join(sorted(leftover))}")


def _groupnorm_like(batchnorm: nn.BatchNorm2d) -> nn.GroupNorm:
    channels = batchnorm.num_features
    groupnorm = nn.GroupNorm(math.gcd(GROUPNORM_GROUPS, channels), channels, eps=batchnorm.eps)
    with torch.no_grad():  # keeps the model's init, e.g. timm's zero gamma at the end of each block
        groupnorm.weight.copy_(batchnorm.weight)
        groupnorm.bias.copy_(batchnorm.bias)
    return groupnorm.to(batchnorm.weight)


def _batchnorm_state_keys(model: nn.Module) -> tuple[list[str], list[str]]:
    """(running mean and variance keys, update-count keys) of the BatchNorms that track statistics."""
    names = [name for name, m in model.named_modules() if isinstance(m, _BatchNorm) and m.track_running_stats]
    stats = [f"{name}.{buffer}" for name in names for buffer in ("running_mean", "running_var")]
    return stats, [f"{name}.num_batches_tracked" for name in names]


def _squared_norm(tensor: torch.Tensor) -> float:
    return tensor.double().pow(2).sum().item()
