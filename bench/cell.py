"""One configuration of a grid: what a single isolated run measures."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Literal

Precision = Literal["fp32", "bf16", "fp16"]
Checkpointing = Literal["off", "full"]
CHECKPOINTING_PATTERN = r"^(off|full|last-[1-9][0-9]*)$"
"""Every checkpointing mode a cell takes: `off`, `full`, or `last-<N>` (the last N blocks)."""
OptimizerName = Literal["adamw", "adamw8bit", "sgd"]
Profile = Literal["cuda", "cpu"]
DdpSync = Literal["no_sync", "every_step"]
LossTracking = Literal["detached", "item", "live_tensor"]
ZeroGrad = Literal["none", "zeros"]
AuxLoss = Literal["off", "attached", "detached"]
Allocator = Literal["default", "expandable_segments"]
Compile = Literal["off", "on"]

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
    checkpointing: str
    """`off`, `full` (timm's `set_grad_checkpointing`) or `last-<N>` (the last N blocks only)."""
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
    loss_tracking: LossTracking = field(default="detached", metadata=EXTRA_AXIS)
    """How the running loss is kept: `detached` tensor, `item()` float (a host sync per
    micro-step) or the `live_tensor`, which keeps every step's autograd graph (seed 004's leak)."""
    zero_grad: ZeroGrad = field(default="none", metadata=EXTRA_AXIS)
    """After the optimizer step: gradients set to `none` (freed) or to `zeros` (kept allocated)."""
    aux_loss: AuxLoss = field(default="off", metadata=EXTRA_AXIS)
    """Seed 000's second loss term, 0.01 x mean(logits**2): `attached` or on `detached` logits."""
    allocator: Allocator = field(default="default", metadata=EXTRA_AXIS)
    """CUDA caching allocator: `default` or `expandable_segments:True` (CUDA only)."""
    compile: Compile = field(default="off", metadata=EXTRA_AXIS)
    """`on`: the model wrapped in `torch.compile` (inductor)."""
    trace_steps: int = field(default=1, metadata=EXTRA_AXIS)
    """Optimizer steps in the untimed memory trace (several show memory that creeps)."""

    @property
    def effective_batch(self) -> int:
        return self.micro_batch * self.accum_steps

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step across all processes: effective_batch x world_size."""
        return self.effective_batch * self.world_size

    @property
    def step_options(self) -> dict[str, str]:
        """The keyword options of `bench.step.train_step` this cell sets."""
        return {"loss_tracking": self.loss_tracking, "zero_grad": self.zero_grad, "aux_loss": self.aux_loss}

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
