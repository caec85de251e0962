"""A cell's training setup: the model, optimizer, loss scaler and synthetic input its step trains.

Built one way for everything that runs a cell's step: the runner (`bench.run.cell_measurement`,
real device), the memory estimator (`bench.memory.estimate`, the model on the meta device made
fake), the host-dispatch measurement (`bench.speed.dispatch`) and the equivalence study
(`bench.equivalence.compare`, which casts to its own dtype). Order matters for the runner's
figures: precision flags, then the seed, then the model's random weights.

    training = cell_training(cell, "cpu")
    train_step(training.model, training.optimizer, [cell_batch(cell, "cpu")] * cell.accum_steps,
               cell.precision, training.scaler, **cell.step_options)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from bench.grid.cell import Cell
from bench.grid.model_ref import ModelSpec
from bench.train.models import build_model, synthetic_batch
from bench.train.optim import build_optimizer
from bench.train.step import Batch, configure_precision, grad_scaler_for


@dataclass(frozen=True)
class CellTraining:
    """What a cell's step trains with."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    """fp16's loss scaler; None for the other precisions."""


def cell_model(cell: Cell, device: torch.device | str) -> torch.nn.Module:
    """The cell's model (its input shape, checkpointing, memory format, attention) on `device`, in train
    mode, with whatever weights the global RNG gives: `seeded_model` for the cell's own."""
    return build_model(ModelSpec.of(cell), checkpointing=cell.checkpointing, channels_last=cell.channels_last,
                       attention=cell.attention, device=device)


def seeded_model(cell: Cell, device: torch.device | str) -> torch.nn.Module:
    """The cell's model with the weights of its seed, the precision flags set as its step needs them.

    >>> cell = Cell(experiment="e", profile="cpu", model="test_vit", image_size=32, micro_batch=2, accum_steps=1,
    ...             precision="fp32", checkpointing="off", optimizer="sgd", channels_last=False,
    ...             warmup_steps=1, measured_steps=1, seed=3)
    >>> a, b = seeded_model(cell, "cpu"), seeded_model(cell, "cpu")
    >>> all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    True
    """
    configure_precision(cell.precision)
    torch.manual_seed(cell.seed)
    return cell_model(cell, device)


def cell_optimizer(cell: Cell, model: torch.nn.Module) -> torch.optim.Optimizer:
    """The cell's optimizer over `model`'s parameters (no state until its first step)."""
    return build_optimizer(cell.optimizer, model.parameters())


def cell_training(cell: Cell, device: torch.device | str, *,
                  wrap: Callable[[torch.nn.Module], torch.nn.Module] | None = None) -> CellTraining:
    """The seeded model (wrapped by `wrap`, e.g. DDP, then compiled if the cell says so), its optimizer and
    scaler, on `device`."""
    model = seeded_model(cell, device)
    if wrap:
        model = wrap(model)
    if cell.compile == "on":
        model = torch.compile(model)
    return CellTraining(model, cell_optimizer(cell, model), grad_scaler_for(cell.precision, torch.device(device).type))


def cell_batch(cell: Cell, device: torch.device | str) -> Batch:
    """The cell's synthetic micro-batch (random images of its input shape and memory format, labels of its
    classes, drawn from its seed) made on `device`."""
    spec = ModelSpec.of(cell)
    return synthetic_batch(cell.micro_batch, cell.image_size, channels_last=cell.channels_last,
                           device=device, seed=cell.seed, input_shape=spec.input_shape, num_classes=spec.num_classes)
