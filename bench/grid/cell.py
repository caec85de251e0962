"""One configuration of a grid, and the one list of its axes.

A `Cell` field that a grid file can vary is an *axis*: it carries an `Axis` in its metadata.
Everything else that knows about axes derives from this class: the grid file's `[grid]` and
`exclude` keys and their validation (`bench.grid.spec`), the runs file's configuration columns
(`bench.results.schema`), the step's keyword options and `bench probe`'s options. Adding an
axis is one field here (with `extra=True` and a default, so ids of committed rows stay valid).
"""

from __future__ import annotations

import hashlib
import json
import re
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields
from functools import cache
from typing import Any, Literal

Precision = Literal["fp32", "bf16", "fp16", "tf32"]


@dataclass(frozen=True)
class Tf32:
    """Which fp32 ops may run on TF32 tensor cores: `torch.backends.cuda.matmul.allow_tf32` (cuBLAS: matmuls and
    attention) and `torch.backends.cudnn.allow_tf32` (cuDNN: convolutions)."""

    matmul: bool
    conv: bool


TF32_BY_PRECISION: dict[str, Tf32] = {"fp32": Tf32(matmul=False, conv=False), "tf32": Tf32(matmul=True, conv=True),
                                      "bf16": Tf32(matmul=True, conv=True), "fp16": Tf32(matmul=True, conv=True)}
"""What each precision sets (`bench.train.step.configure_precision`) and the throughput model predicts with:
fp32 means fp32 on both, where a script that sets nothing gets PyTorch's default (cuDNN's TF32 on, matmuls' off);
tf32 is what a script that opts in sets (`allow_tf32 = True` on both, as timm's benchmark and NVIDIA's containers
do); under AMP the few fp32 matmuls and convolutions left may use TF32."""
Attention = Literal["sdpa", "eager"]
MAX_CHECKPOINT_BLOCKS = 999
"""Largest N of `last-<N>`: more blocks than any timm model has (the run checks the model's own count)."""
CHECKPOINTING_PATTERN = r"^(off|full|last-[1-9][0-9]{0,2})$"
"""Every checkpointing mode a cell takes: `off`, `full`, or `last-<N>` (the last N blocks, N <= 999)."""
MODEL_PATTERN = r"^[A-Za-z0-9_./][A-Za-z0-9_.+/:@-]{0,199}$"
"""A model reference (a timm name with its pretrained tag, hf-hub:ORG/NAME, module:factory, file.py:factory with an
absolute or relative path): the characters a cell id may hold once `/` and `:` are replaced, at most 200."""
MODEL_CHARACTERS = "at most 200 letters, digits and _ . + / : @ - (a path may start with / or .)"
"""`MODEL_PATTERN` in words, for a refusal."""
CELL_ID_MAX_CHARS = 640
"""Longest cell id: the longest model reference and kwargs with every axis at its longest value make about 550."""
OptimizerName = Literal["adamw", "adamw8bit", "sgd"]
Profile = Literal["cuda", "cpu"]
DdpSync = Literal["no_sync", "every_step"]
LossTracking = Literal["detached", "item", "live_tensor"]
ZeroGrad = Literal["none", "zeros"]
AuxLoss = Literal["off", "attached", "detached"]
Allocator = Literal["default", "expandable_segments"]
Compile = Literal["off", "on"]
InputKind = Literal["synthetic", "loader", "loader_gpu_decode"]

class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
"""`Axis.grid_default` of an axis every grid file must list."""


@dataclass(frozen=True)
class Axis:
    """How a `Cell` field is set from a grid file's `[grid]` (a list of values, one product axis)."""

    grid_default: Any = REQUIRED
    """The value a grid file that omits the axis gets; `REQUIRED`: it must list it."""
    extra: bool = False
    """Added after results were committed: in the cell id only when away from its default."""
    minimum: int | None = None
    """Smallest allowed value of a whole-number axis."""
    maximum: int | None = None
    """Largest allowed value of a whole-number axis (a bound on what a grid file may ask for)."""
    pattern: str | None = None
    """Regular expression a text axis must match (its values are not a fixed list)."""
    step_option: bool = False
    """Passed to `bench.train.step.train_step` as a keyword option of the same name."""
    probe_option: bool = True
    """Offered by `bench probe` as `--<name>` (the probe searches the micro-batch itself)."""


def axis(doc: str, *, default: Any = MISSING, **settings: Any) -> Any:
    """A `Cell` field that grid files vary. An extra axis's default is also its grid default."""
    if settings.get("extra"):
        settings.setdefault("grid_default", default)
    return field(default=default, metadata={"doc": doc, "axis": Axis(**settings)})


def described(doc: str, *, default: Any = MISSING) -> Any:
    """A `Cell` field set by the grid as a whole (name, profile, pairs, run settings), not an axis."""
    return field(default=default, metadata={"doc": doc})


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

    experiment: str = described("grid name (experiment.name)")
    profile: Profile = described("cuda (the grid as written) or cpu (its CPU profile)")
    model: str = axis("timm name, hf-hub:ORG/NAME, package.module:factory or path/to/file.py:factory (code: not from "
                      "a grid file unless it says experiment.runs_model_code); random init", pattern=MODEL_PATTERN)
    image_size: int = axis("square input side, pixels (at most 4096)", minimum=1, maximum=4096)
    micro_batch: int = described("samples per forward/backward")
    accum_steps: int = described("micro-batches per optimizer step (K)")
    precision: Precision = axis("fp32 (TF32 off) | bf16 (autocast) | fp16 (autocast + GradScaler) | tf32 (fp32 "
                                "storage, TF32 matmuls and convolutions)")
    checkpointing: str = axis("off | full (timm set_grad_checkpointing) | last-<N> (the last N blocks)",
                              grid_default="off", pattern=CHECKPOINTING_PATTERN)
    optimizer: OptimizerName = axis("adamw | adamw8bit (bitsandbytes) | sgd (momentum 0.9)", grid_default="adamw")
    channels_last: bool = axis("model and inputs in channels-last format", grid_default=False)
    warmup_steps: int = described("optimizer steps before measuring")
    measured_steps: int = described("timed optimizer steps")
    seed: int = described("seed for weights and synthetic data", default=0)

    # Axes added after the first results were committed go below, each `extra=True` with a
    # default: at its default it stays out of the id, so old ids stay valid.
    world_size: int = axis("processes training together (DDP through torchrun, gloo on CPU, NCCL on CUDA); 1: no DDP",
                           default=1, extra=True, minimum=1, maximum=1024, probe_option=False)
    ddp_sync: DdpSync = axis("no_sync (all-reduce on the last micro-step only) | every_step (on every micro-step)",
                             default="no_sync", extra=True, probe_option=False)
    loss_tracking: LossTracking = axis("running loss kept as: detached (tensor) | item (float, host sync) | "
                                       "live_tensor (keeps graphs)", default="detached", extra=True, step_option=True)
    zero_grad: ZeroGrad = axis("after the step: none (set_to_none=True) | zeros (gradients kept allocated)",
                               default="none", extra=True, step_option=True)
    aux_loss: AuxLoss = axis("seed 000's 0.01 x mean(logits**2) term: off | attached | detached",
                             default="off", extra=True, step_option=True)
    allocator: Allocator = axis("CUDA allocator: default | expandable_segments (PYTORCH_CUDA_ALLOC_CONF)",
                                default="default", extra=True)
    compile: Compile = axis("off | on (torch.compile of the model)", default="off", extra=True, probe_option=False)
    trace_steps: int = axis("optimizer steps in the untimed memory trace", default=1, extra=True, minimum=1,
                            maximum=100, probe_option=False)
    input: InputKind = axis("synthetic (one random micro-batch made on the device) | loader (JPEG files through a "
                            "torchvision DataLoader, decoded and augmented on the CPU) | loader_gpu_decode (workers "
                            "read the files, nvjpeg decodes them on the GPU)", default="synthetic", extra=True,
                            probe_option=False)
    loader_workers: int = axis("DataLoader worker processes of a loader input (0: the training process decodes); "
                               "synthetic input has none and keeps the default", default=0, extra=True, minimum=0,
                               maximum=256, probe_option=False)
    attention: Attention = axis("sdpa (fused scaled-dot-product attention) | eager (timm's explicit softmax, "
                                "fused_attn off)", default="sdpa", extra=True)
    model_kwargs: str = axis("keyword arguments of the model's factory, a JSON object ({}: none)", default="{}",
                             extra=True, pattern=r"^\{.{0,118}\}$", probe_option=False)
    in_chans: int = axis("input channels", default=3, extra=True, minimum=1, maximum=1024, probe_option=False)
    image_width: int = axis("input width, pixels; 0: square (image_size)", default=0, extra=True, minimum=0,
                            maximum=4096, probe_option=False)
    num_classes: int = axis("classifier outputs; labels are drawn from range(num_classes)", default=1000, extra=True,
                            minimum=1, maximum=1_000_000, probe_option=False)
    model_config_source: str = described("an hf-hub model's: which of the grid (or option) and its cached config set "
                                         "num_classes, in_chans and model_kwargs (`num_classes hub config, in_chans "
                                         "grid, model_kwargs none`); empty for other models. Not part of the id",
                                         default="")

    @property
    def effective_batch(self) -> int:
        return self.micro_batch * self.accum_steps

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step across all processes: effective_batch x world_size."""
        return self.effective_batch * self.world_size

    @property
    def step_options(self) -> dict[str, Any]:
        """The keyword options of `bench.train.step.train_step` this cell sets."""
        return {name: getattr(self, name) for name, spec in axes(type(self)).items() if spec.step_option}

    @property
    def cell_id(self) -> str:
        """Readable and stable: the same configuration always gets the same id."""
        extras = self._non_default_extras()
        readable = (
            f"{self.model}-{self.image_size}px-{self.micro_batch}x{self.accum_steps}"
            f"-{self.precision}-ckpt_{self.checkpointing}-{self.optimizer}"
            f"{'-cl' if self.channels_last else ''}"
            + "".join(f"-{name}_{value}" for name, value in extras.items())
        )
        readable = re.sub(r"[^A-Za-z0-9_.+-]+", "_", readable)  # a path, a module:factory or JSON kwargs
        readable = re.sub(r"^[^A-Za-z0-9]+", "", readable)  # `./model.py:f`: an id starts with a letter or digit
        defaults = extra_axis_defaults(type(self))  # once: a grid's expansion computes thousands of ids
        identity = {f.name: getattr(self, f.name) for f in fields(self)  # every field is a scalar: asdict's copy
                    if (f.name not in defaults or f.name in extras)       # is not needed; where a value came from
                    and f.name not in PROVENANCE_FIELDS}                  # does not change the configuration
        digest = hashlib.sha1(json.dumps(identity, sort_keys=True).encode()).hexdigest()
        return f"{readable}-{digest[:8]}"

    def _non_default_extras(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name, default in extra_axis_defaults(type(self)).items()
                if getattr(self, name) != default}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@cache
def axes(cell_type: type = Cell) -> dict[str, Axis]:
    """Every axis of `Cell` (or a subclass), in field order.

    >>> list(axes())[:3]
    ['model', 'image_size', 'precision']
    """
    return {f.name: f.metadata["axis"] for f in fields(cell_type) if "axis" in f.metadata}


@cache
def field_docs() -> dict[str, str]:
    """What each `Cell` field holds, in words (the runs file's column descriptions)."""
    return {f.name: f.metadata["doc"] for f in fields(Cell)}


@cache
def field_types() -> dict[str, Any]:
    """Each `Cell` field's type (`int`, `bool`, `str` or a `Literal[...]`)."""
    return typing.get_type_hints(Cell)


PROVENANCE_FIELDS = ("model_config_source",)
"""`Cell` fields that say where a value came from: in the rows, not in the id, not required of old runs files."""


PROBE_DEFAULTS: dict[str, Any] = {"image_size": 224, "precision": "fp32"}
"""Values of the axes a grid file must list, when `bench probe` or `bench plan` is not told them."""


def probe_options() -> dict[str, Any]:
    """Every axis `bench probe` takes as an option (all but the model, which it names), with its default.

    >>> probe_options()["precision"], "world_size" in probe_options()
    ('fp32', False)
    """
    return {name: PROBE_DEFAULTS[name] if spec.grid_default is REQUIRED else spec.grid_default
            for name, spec in axes().items() if spec.probe_option and name != "model"}


def extra_axis_defaults(cell_type: type = Cell) -> dict[str, Any]:
    """Each later-added axis and its default: what rows measured before it existed ran at.

    >>> extra_axis_defaults()["world_size"]
    1
    """
    return {name: spec.grid_default for name, spec in axes(cell_type).items() if spec.extra}


def choices(name: str) -> tuple[Any, ...] | None:
    """The allowed values of a `Literal` field, or None for a free (validated) one.

    >>> choices("precision")
    ('fp32', 'bf16', 'fp16', 'tf32')
    """
    kind = field_types()[name]
    return typing.get_args(kind) if typing.get_origin(kind) is Literal else None
