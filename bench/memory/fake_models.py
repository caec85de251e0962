"""A command's fake-tensor models (and the traces it read), shared by its cells; torch is imported on first use."""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from bench.grid.cell import Cell
from bench.results.keys import SPLIT, configuration_key

if TYPE_CHECKING:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode


STEP_ONLY = (*SPLIT, "precision", "optimizer", "world_size", "ddp_sync", "loss_tracking", "zero_grad", "aux_loss",
             "allocator", "compile", "trace_steps", "input", "loader_workers")
"""The axes that leave the built model as it is (an axis not named here builds a model of its own: safe)."""


class FakeModels:
    """Fake-tensor models, built once per configuration of the model's own axes (model, input shape,
    checkpointing, channels-last, attention, ...: every axis but `STEP_ONLY`).

    Precision, optimizer and batch shape do not change the model, so a grid's cells share
    it; each cell gets a fresh optimizer and starts with no gradients. A command's traces are kept beside them
    (`bench.memory.traces`), so it asks the disk cache for each at most once.
    """

    def __init__(self) -> None:
        self._mode: FakeTensorMode | None = None
        self._models: dict[tuple, torch.nn.Module] = {}
        self.traces: OrderedDict[str, Any] = OrderedDict()
        """`bench.memory.traces.Trace` by its key, most recently used last."""

    @property
    def mode(self) -> FakeTensorMode:
        """The fake mode every model and step of this command runs in (made on first use: a command that reads
        every trace from the cache imports no torch)."""
        if self._mode is None:
            from torch._subclasses.fake_tensor import FakeTensorMode

            self._mode = FakeTensorMode(allow_non_fake_inputs=True)
        return self._mode

    def get(self, cell: Cell) -> torch.nn.Module:
        from bench.train.setup import cell_model

        key = configuration_key(cell.to_dict(), ignore=STEP_ONLY)
        if key not in self._models:
            model = cell_model(cell, "meta")
            with self.mode:
                self._models[key] = model.to_empty(device="cpu")
        return self._models[key]
