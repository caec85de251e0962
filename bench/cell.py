"""One configuration of a grid: what a single isolated run measures."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Literal

Precision = Literal["fp32", "bf16", "fp16"]
Checkpointing = Literal["off", "full"]
OptimizerName = Literal["adamw", "adamw8bit", "sgd"]
Profile = Literal["cuda", "cpu"]
DdpSync = Literal["no_sync", "every_step"]

EXTRA_AXIS = {"extra_axis": True}
"""Field metadata of an axis that appears in the cell id only when it differs from its default."""


@dataclass(frozen=True, kw_only=True)
class Cell:
    """A fully resolved grid cell.

    Example:
        >>> c = Cell(experiment="smoke", profile="cpu", model="test_vit", image_size=32,
        ...          micro_batch=4, accum_steps=2, precision="fp32", checkpointing="off",
        ...          optimizer="sgd", channels_last=False, warmup_steps=1, measured_steps=2)
        >>> c.effective_batch
        8
    """

    experiment: str
    """Name of the experiment (the grid file's `experiment.name`)."""
    profile: Profile
    """`cuda` for the grid as written, `cpu` for its CPU profile."""
    model: str
    """timm model name, built with random init."""
    image_size: int
    """Square input side in pixels."""
    micro_batch: int
    """Samples per forward/backward pass."""
    accum_steps: int
    """Micro-batches accumulated per optimizer step (K)."""
    precision: Precision
    """`fp32` (TF32 off), `bf16` (autocast) or `fp16` (autocast + GradScaler)."""
    checkpointing: Checkpointing
    """Activation checkpointing via timm's `set_grad_checkpointing`."""
    optimizer: OptimizerName
    """`adamw` (fp32 state), `adamw8bit` (bitsandbytes) or `sgd` (momentum 0.9)."""
    channels_last: bool
    """Model and inputs in channels-last memory format."""
    warmup_steps: int
    """Optimizer steps run before anything is measured."""
    measured_steps: int
    """Timed optimizer steps."""
    seed: int = 0
    """Seed for weights and synthetic data."""

    # Axes added after the first results were committed go below, each with a default and
    # `metadata=EXTRA_AXIS`: at its default it stays out of the id, so old ids stay valid.
    world_size: int = field(default=1, metadata=EXTRA_AXIS)
    """Processes training together (DDP through torchrun); 1 is the single-process cell."""
    ddp_sync: DdpSync = field(default="no_sync", metadata=EXTRA_AXIS)
    """Under DDP: `no_sync` all-reduces on the last micro-step only; `every_step` on every one
    (the cost of forgetting `no_sync()`). Meaningless, and kept at its default, for one process."""

    @property
    def effective_batch(self) -> int:
        return self.micro_batch * self.accum_steps

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step across all processes: effective_batch x world_size."""
        return self.effective_batch * self.world_size

    @property
    def cell_id(self) -> str:
        """Readable and stable: the same configuration always gets the same id."""
        readable = (
            f"{self.model}-{self.image_size}px-{self.micro_batch}x{self.accum_steps}"
            f"-{self.precision}-ckpt_{self.checkpointing}-{self.optimizer}"
            f"{'-cl' if self.channels_last else ''}"
            + "".join(f"-{name}_{value}" for name, value in self._non_default_extras().items())
        )
        identity = {name: value for name, value in asdict(self).items()
                    if name not in self._extra_names() or name in self._non_default_extras()}
        digest = hashlib.sha1(json.dumps(identity, sort_keys=True).encode()).hexdigest()
        return f"{readable}-{digest[:8]}"

    def _extra_names(self) -> set[str]:
        return {f.name for f in fields(self) if f.metadata.get("extra_axis")}

    def _non_default_extras(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.metadata.get("extra_axis") and getattr(self, f.name) != f.default}

    def to_dict(self) -> dict:
        return asdict(self)


def extra_axis_defaults() -> dict[str, object]:
    """Each later-added axis and its default: what rows measured before it existed ran at."""
    return {f.name: f.default for f in fields(Cell) if f.metadata.get("extra_axis")}
