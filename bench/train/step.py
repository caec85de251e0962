"""The one training step: K micro-batches accumulated into one optimizer step.

Shared by the runner, the memory estimator and DDP; nobody copies it. No timing,
logging or I/O in here: callers observe it through `on_phase`.
"""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager, Literal, Sequence

import torch
import torch.nn.functional as F

from bench.grid.cell import TF32_BY_PRECISION, AuxLoss, LossTracking, ZeroGrad

# Called after each forward and backward (with the micro-step index) and after the optimizer.
PhaseHook = Callable[[str, int], None]
Batch = tuple[torch.Tensor, torch.Tensor]
NoSync = Callable[[], ContextManager]
"""DDP's `model.no_sync`: a context in which backward accumulates without all-reducing."""

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
AUX_LOSS_WEIGHT = 0.01
"""Seed 000's regulariser weight: total_loss = ce_loss + 0.01 * (outputs ** 2).mean()."""

LossNormalization = Literal["accum_steps", "samples", "none"]
"""How a micro-batch's loss becomes its share of the step's loss.

`accum_steps`: its mean divided by K, the mean over the effective batch when the micro-batches
are equal (a mean of means when they are not). `samples`: its sum divided by the samples in the
whole step, the mean over the effective batch for any split. `none`: its mean, undivided: the
forgotten division (gradients K times too large), there to show that bug.
"""


def configure_precision(precision: str) -> None:
    """The TF32 switches of `precision` (`bench.grid.cell.TF32_BY_PRECISION`, which the throughput model reads too):
    fp32 means fp32, no TF32 matmuls or convolutions; tf32 and the AMP precisions allow both."""
    tf32 = TF32_BY_PRECISION[precision]
    torch.backends.cuda.matmul.allow_tf32 = tf32.matmul
    torch.backends.cudnn.allow_tf32 = tf32.conv


def autocast_for(precision: str, device_type: str) -> contextlib.AbstractContextManager:
    if precision not in AMP_DTYPES:  # fp32, tf32: no autocast
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=AMP_DTYPES[precision])


def grad_scaler_for(precision: str, device_type: str) -> torch.amp.GradScaler | None:
    """fp16 needs loss scaling; bf16 has fp32's range and does not."""
    return torch.amp.GradScaler(device_type) if precision == "fp16" else None


def accumulate_gradients(model: torch.nn.Module, micro_batches: Sequence[Batch], precision: str,
                         scaler: torch.amp.GradScaler | None = None,
                         on_phase: PhaseHook | None = None, *,
                         normalization: LossNormalization = "accum_steps",
                         no_sync: NoSync | None = None,
                         loss_tracking: LossTracking = "detached",
                         aux_loss: AuxLoss = "off") -> torch.Tensor | float:
    """Forward and backward each micro-batch with its loss divided by K; returns the summed loss.

    `normalization` changes how each loss is scaled (see `LossNormalization`); the default is
    the division by K above. `no_sync` (DDP's `model.no_sync`): micro-steps 0..K-2 run inside
    it, so only the last backward all-reduces; without it every backward of a DDP model does.
    `loss_tracking` is how the sum is kept: a detached tensor, a float (`item`, a host sync per
    micro-step) or the `live_tensor`, graphs and all. `aux_loss` adds seed 000's penalty on the
    logits, `attached` or on `detached` logits.

    `micro_batches` is iterated once, in order, so a loader may fetch each micro-batch as the
    loop reaches it (one held at a time, as a training loop holds them); only `len()` is asked
    up front, and the `samples` normalization reads a `samples` attribute when there is one.
    """
    accum_steps = len(micro_batches)
    step_samples = _step_samples(micro_batches) if normalization == "samples" else 0
    total: torch.Tensor | float | None = 0.0 if loss_tracking == "item" else None
    for index, (images, labels) in enumerate(micro_batches):
        if total is None:  # in the inputs' dtype: an fp64 comparison keeps an fp64 loss
            total = torch.zeros((), device=images.device, dtype=images.dtype)
        # Under DDP only the last micro-step needs the all-reduce: the gradients are summed
        # locally until then (nanoGPT: require_backward_grad_sync on the last micro-step).
        skip_sync = no_sync is not None and index < accum_steps - 1
        with no_sync() if skip_sync else contextlib.nullcontext():
            with autocast_for(precision, images.device.type):
                logits = model(images)
                loss = _micro_batch_loss(logits, labels, normalization, accum_steps, step_samples)
                if aux_loss != "off":
                    loss = loss + _aux_penalty(logits, aux_loss) / accum_steps
            if on_phase:
                on_phase("forward", index)
            (scaler.scale(loss) if scaler else loss).backward()
        if loss_tracking == "item":
            total += loss.item()  # a host sync every micro-step
        elif loss_tracking == "live_tensor":
            total = total + loss  # keeps this micro-step's autograd graph reachable from `total`
        else:
            total += loss.detach()  # detached: keeping `loss` would keep its graph alive
        if on_phase:
            on_phase("backward", index)
    return total


def _step_samples(micro_batches: Sequence[Batch]) -> int:
    """Samples in the whole step: a lazy step's `samples` attribute, else counted from the labels."""
    known = getattr(micro_batches, "samples", None)
    return known if known is not None else sum(len(labels) for _, labels in micro_batches)


def _aux_penalty(logits: torch.Tensor, aux_loss: AuxLoss) -> torch.Tensor:
    # Seed 000's "fix" detaches the outputs first: the penalty then sends no gradient at all.
    outputs = logits.detach() if aux_loss == "detached" else logits
    return AUX_LOSS_WEIGHT * (outputs ** 2).mean()


def _micro_batch_loss(logits: torch.Tensor, labels: torch.Tensor, normalization: LossNormalization,
                      accum_steps: int, step_samples: int) -> torch.Tensor:
    if normalization == "samples":
        # Each sample weighs 1/N, whatever the size of its micro-batch.
        return F.cross_entropy(logits, labels, reduction="sum") / step_samples
    loss = F.cross_entropy(logits, labels)
    # Divide by K so the summed gradients are the mean over the effective batch.
    return loss / accum_steps if normalization == "accum_steps" else loss


def apply_update(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None = None,
                 on_phase: PhaseHook | None = None, last_index: int = 0, *,
                 zero_grad: ZeroGrad = "none") -> None:
    """One optimizer step, then free the gradients (set to None; `zero_grad="zeros"` keeps them)."""
    if scaler:
        scaler.step(optimizer)  # skips the step if fp16 gradients overflowed
        scaler.update()
    else:
        optimizer.step()
    if on_phase:
        on_phase("optimizer", last_index)
    optimizer.zero_grad(set_to_none=zero_grad == "none")
    if on_phase:
        on_phase("zero_grad", last_index)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               micro_batches: Sequence[Batch], precision: str,
               scaler: torch.amp.GradScaler | None = None,
               on_phase: PhaseHook | None = None, *, no_sync: NoSync | None = None,
               loss_tracking: LossTracking = "detached", zero_grad: ZeroGrad = "none",
               aux_loss: AuxLoss = "off") -> torch.Tensor | float:
    """One optimizer step over len(micro_batches) accumulated micro-batches; returns its loss.

    `no_sync`: DDP's `model.no_sync`, to all-reduce on the last micro-step only. The other
    keyword options are the claims' variants (see `accumulate_gradients`, `apply_update`);
    their defaults are the step as the grids measure it.

    Example:
        >>> model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> batch = (torch.randn(2, 3, 2, 2), torch.tensor([0, 1]))
        >>> loss = train_step(model, opt, [batch, batch], "fp32")
        >>> loss.shape
        torch.Size([])
    """
    loss = accumulate_gradients(model, micro_batches, precision, scaler, on_phase, no_sync=no_sync,
                                loss_tracking=loss_tracking, aux_loss=aux_loss)
    apply_update(optimizer, scaler, on_phase, last_index=len(micro_batches) - 1, zero_grad=zero_grad)
    return loss
