"""Grid files: load a TOML experiment, validate it, expand it into cells.

A grid file holds data only::

    [experiment]
    name = "resnet50"

    [grid]                      # the cartesian product of these axes
    model = ["resnet50"]
    image_size = [224]
    effective_batch = 128
    pairs = [[128, 1], [8, 16]] # (micro_batch, accum_steps), product = effective_batch
    precision = ["fp32", "bf16"]

    [run]
    warmup_steps = 3
    measured_steps = 10

    [profile.cpu.grid]          # overrides used when no CUDA device is present
    image_size = [32]

Every problem becomes one `SpecError` line naming the file, the key and what is allowed.
"""

from __future__ import annotations

import difflib
import itertools
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Iterable, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from bench.cell import (
    CHECKPOINTING_PATTERN, Allocator, AuxLoss, Cell, Compile, DdpSync, LossTracking, OptimizerName,
    Precision, Profile, ZeroGrad,
)

CheckpointingMode = Annotated[str, Field(pattern=CHECKPOINTING_PATTERN)]
"""`off`, `full` or `last-<N>` (N >= 1)."""


class SpecError(Exception):
    """A grid file (or a command-line choice about it) is invalid. The message is one line."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ExperimentInfo(_Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    """Experiment name; also the results folder name."""
    description: str = ""
    """What the study asks, in a sentence."""


class Exclusion(_Strict):
    """Cells matching every given key are dropped from the product (like a CI matrix `exclude`)."""

    model: str | None = None
    image_size: int | None = None
    micro_batch: int | None = None
    accum_steps: int | None = None
    precision: Precision | None = None
    checkpointing: CheckpointingMode | None = None
    optimizer: OptimizerName | None = None
    channels_last: bool | None = None
    world_size: int | None = None
    ddp_sync: DdpSync | None = None
    loss_tracking: LossTracking | None = None
    zero_grad: ZeroGrad | None = None
    aux_loss: AuxLoss | None = None
    allocator: Allocator | None = None
    compile: Compile | None = None
    trace_steps: int | None = None

    def matches(self, cell: Cell) -> bool:
        return all(getattr(cell, key) == value for key, value in self if value is not None)


class GridAxes(_Strict):
    """The axes whose cartesian product is the grid."""

    model: list[str] = Field(min_length=1)
    """timm model names."""
    image_size: list[int] = Field(min_length=1)
    """Square image sides in pixels."""
    effective_batch: int = Field(gt=0)
    """Samples per optimizer step, the same for every pair."""
    pairs: list[tuple[int, int]] = Field(min_length=1)
    """(micro_batch, accum_steps) pairs; each product must equal effective_batch."""
    precision: list[Precision] = Field(min_length=1)
    checkpointing: list[CheckpointingMode] = ["off"]
    """`off`, `full`, or `last-<N>`: only the last N blocks recompute their activations."""
    optimizer: list[OptimizerName] = ["adamw"]
    channels_last: list[bool] = [False]
    world_size: list[int] = [1]
    """Processes per cell (DDP through torchrun, one GPU each on CUDA); 1 runs without DDP."""
    ddp_sync: list[DdpSync] = ["no_sync"]
    """`no_sync`: all-reduce on the last micro-step only; `every_step`: on every micro-step."""
    loss_tracking: list[LossTracking] = ["detached"]
    """Running loss kept as a `detached` tensor, an `item` float, or the `live_tensor` (leaks graphs)."""
    zero_grad: list[ZeroGrad] = ["none"]
    """`none`: zero_grad(set_to_none=True); `zeros`: gradients zeroed but kept."""
    aux_loss: list[AuxLoss] = ["off"]
    """Seed 000's second loss term on the logits: `off`, `attached`, `detached`."""
    allocator: list[Allocator] = ["default"]
    """CUDA allocator config: `default` or `expandable_segments` (skipped on CPU)."""
    compile: list[Compile] = ["off"]
    """`on`: torch.compile(model)."""
    trace_steps: list[int] = [1]
    """Optimizer steps in the untimed memory trace."""
    exclude: list[Exclusion] = []
    """Partial cells to drop from the product."""

    @field_validator(
        "model", "image_size", "precision", "checkpointing", "optimizer", "channels_last",
        "world_size", "ddp_sync", "loss_tracking", "zero_grad", "aux_loss", "allocator", "compile",
        "trace_steps", mode="before",
    )
    @classmethod
    def _scalar_to_list(cls, value: Any) -> Any:
        return value if isinstance(value, list) else [value]

    @field_validator("trace_steps")
    @classmethod
    def _positive_trace_steps(cls, steps: list[int]) -> list[int]:
        if any(count <= 0 for count in steps):
            raise ValueError(f"trace steps must be positive whole numbers, got {steps}")
        return steps

    @field_validator("image_size")
    @classmethod
    def _positive_sizes(cls, sizes: list[int]) -> list[int]:
        if any(size <= 0 for size in sizes):
            raise ValueError(f"image sizes must be positive whole numbers, got {sizes}")
        return sizes

    @field_validator("world_size")
    @classmethod
    def _at_least_one_process(cls, sizes: list[int]) -> list[int]:
        if any(size < 1 for size in sizes):
            raise ValueError(f"world sizes must be whole numbers >= 1, got {sizes}")
        return sizes

    @field_validator("pairs")
    @classmethod
    def _pairs_match_effective_batch(cls, pairs: list[tuple[int, int]], info) -> list[tuple[int, int]]:
        effective = info.data.get("effective_batch")
        for index, (micro, accum) in enumerate(pairs):
            if micro <= 0 or accum <= 0:
                raise ValueError(f"pair {index + 1} [{micro}, {accum}]: both numbers must be positive")
            if effective is not None and micro * accum != effective:
                raise ValueError(
                    f"pair {index + 1} [{micro}, {accum}] multiplies to {micro * accum}, "
                    f"not effective_batch = {effective}"
                )
        return pairs


class RunSettings(_Strict):
    """How each cell is run."""

    warmup_steps: int = Field(default=2, gt=0)
    """Optimizer steps before measuring (at least one, so optimizer state exists)."""
    measured_steps: int = Field(default=5, gt=0)
    """Timed optimizer steps."""
    timeout_s: float = Field(default=900.0, gt=0)
    """Wall-clock limit for one cell's process, in seconds."""
    seed: int = Field(default=0, ge=0)


class ProfileSection(_Strict):
    """Overrides for a device profile; keys are checked against [grid] and [run]."""

    description: str = ""
    grid: dict[str, Any] = {}
    run: dict[str, Any] = {}


class GridFile(_Strict):
    experiment: ExperimentInfo
    grid: GridAxes
    run: RunSettings = RunSettings()
    profile: dict[Profile, ProfileSection] = {}


@dataclass(frozen=True)
class Grid:
    """A validated grid resolved for one profile."""

    path: Path
    name: str
    description: str
    profile: Profile
    profile_description: str
    run: RunSettings
    cells: tuple[Cell, ...]


def load_grid(path: str | Path, profile: Profile, *, check_models: bool = True) -> Grid:
    """Read and validate a grid file, apply `profile`'s overrides, expand to cells.

    Example:
        >>> grid = load_grid("experiments/smoke.toml", "cpu")
        >>> grid.cells[0].profile
        'cpu'
    """
    path = Path(path)
    raw = _read_toml(path)
    spec = _validate(GridFile, raw, path, prefix=())
    axes, run, profile_description = spec.grid, spec.run, ""
    for name, section in spec.profile.items():  # validate every profile, apply the chosen one
        merged_axes = _validate_override(GridAxes, raw["grid"], section.grid, path, ("grid",), name)
        merged_run = _validate_override(RunSettings, raw.get("run", {}), section.run, path, ("run",), name)
        if name == profile:
            axes, run, profile_description = merged_axes, merged_run, section.description
    if check_models:
        _check_models(axes.model, path)
    cells = tuple(_expand(spec.experiment.name, profile, axes, run))
    if not cells:
        raise SpecError(f"{path}: grid.exclude: every cell is excluded; nothing would run")
    return Grid(path, spec.experiment.name, spec.experiment.description, profile,
                profile_description, run, cells)


def require_precisions(grid: Grid, supported: Iterable[str], device_name: str) -> None:
    """Fail cleanly when a cell asks for a precision this device cannot run."""
    supported = tuple(supported)
    for cell in grid.cells:
        if cell.precision not in supported:
            raise SpecError(
                f"{grid.path}: grid.precision: {cell.precision!r} cannot run on {device_name}; "
                f"allowed here: {', '.join(supported)}"
            )


# Axes of [grid] that map one-to-one onto Cell fields (pairs and exclude are handled apart).
# A new axis: a list field in GridAxes, an optional field in Exclusion, a Cell field, a name here.
CELL_AXES = ("model", "image_size", "precision", "checkpointing", "optimizer", "channels_last",
             "world_size", "ddp_sync", "loss_tracking", "zero_grad", "aux_loss", "allocator", "compile",
             "trace_steps")


def _expand(experiment: str, profile: Profile, axes: GridAxes, run: RunSettings) -> Iterable[Cell]:
    # Pairs vary third, after model and image size, as the grid files read; world size varies
    # before the axes after it, so a configuration's 1-process cell (the scaling baseline) runs first.
    values = [getattr(axes, name) for name in CELL_AXES]
    seen: set[str] = set()
    for model, size, (micro, accum), *rest in itertools.product(*values[:2], axes.pairs, *values[2:]):
        cell = single_process_default(Cell(
            experiment=experiment, profile=profile, micro_batch=micro, accum_steps=accum,
            **dict(zip(CELL_AXES, (model, size, *rest))), warmup_steps=run.warmup_steps,
            measured_steps=run.measured_steps, seed=run.seed,
        ))
        if cell.cell_id not in seen and not any(rule.matches(cell) for rule in axes.exclude):
            seen.add(cell.cell_id)
            yield cell


def single_process_default(cell: Cell) -> Cell:
    """One process has nothing to synchronise: its `ddp_sync` is the default, so
    `world_size = [1, 2]` x `ddp_sync = [no_sync, every_step]` gives one 1-process cell, not two."""
    return replace(cell, ddp_sync="no_sync") if cell.world_size == 1 else cell


def with_world_size(grid: Grid, world_size: int) -> Grid:
    """`grid` with every cell run on `world_size` processes (`bench run --nproc N`)."""
    cells = {cell.cell_id: cell for cell in
             (single_process_default(replace(c, world_size=world_size)) for c in grid.cells)}
    return replace(grid, cells=tuple(cells.values()))


def _read_toml(path: Path) -> dict:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise SpecError(f"{path}: no such grid file") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not valid TOML: {exc}") from None


def _validate_override(model: type[BaseModel], base: dict, override: dict, path: Path,
                       section: tuple[str, ...], profile: str) -> Any:
    merged = {**base, **override}
    override_keys = set(override)
    try:
        return model.model_validate(merged)
    except ValidationError as exc:
        first = exc.errors()[0]
        in_override = first["loc"] and first["loc"][0] in override_keys
        prefix = ("profile", profile, *section) if in_override else section
        raise SpecError(_format_error(first, model, path, prefix)) from None


def _validate(model: type[BaseModel], data: dict, path: Path, prefix: tuple[str, ...]) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_format_error(exc.errors()[0], model, path, prefix)) from None


def _format_error(error: dict, model: type[BaseModel], path: Path, prefix: tuple) -> str:
    loc = tuple(error["loc"])
    key = _dotted(prefix + loc)
    kind, value = error["type"], error.get("input")
    if kind == "extra_forbidden":
        allowed = ", ".join(_model_at(model, loc[:-1]).model_fields)
        return f"{path}: {key}: unknown key; allowed keys here: {allowed}"
    if kind == "missing":
        return f"{path}: {key}: required key is missing"
    if kind == "literal_error":
        return f"{path}: {key}: {value!r} is not allowed; allowed: {error['ctx']['expected']}"
    if kind in ("greater_than", "greater_than_equal"):
        return f"{path}: {key}: {value!r} is not allowed; must be {error['msg'].removeprefix('Input should be ')}"
    if kind == "string_pattern_mismatch":
        return f"{path}: {key}: {value!r} is not allowed; must match {error['ctx']['pattern']}"
    if kind == "value_error":
        return f"{path}: {key}: {error['msg'].removeprefix('Value error, ')}"
    return f"{path}: {key}: {error['msg']} (got {value!r})"


def _dotted(loc: tuple) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel]:
    """The pydantic model that owns the keys at `loc` (for listing allowed keys)."""
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            continue
        annotation = field.annotation
        candidates = get_args(annotation) if get_origin(annotation) else (annotation,)
        nested = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
        if nested:
            model = nested[0]
    return model


def _check_models(names: list[str], path: Path) -> None:
    for index, name in enumerate(names):
        problem = timm_model_problem(name)
        if problem:
            raise SpecError(f"{path}: grid.model[{index}]: {problem}")


def timm_model_problem(name: str) -> str | None:
    """None when timm knows `name`; otherwise what is wrong, with the closest names.

    Example:
        >>> timm_model_problem("resnet50") is None
        True
        >>> timm_model_problem("resnet-50")
        "'resnet-50' is not a timm model; did you mean resnet50, resnet50t, resnet50s?"
    """
    import timm  # imported late: it is slow and only needed once the input is well-formed

    if timm.is_model(name):
        return None
    close = difflib.get_close_matches(name, timm.list_models(), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}?" if close else "see timm.list_models()"
    return f"{name!r} is not a timm model; {hint}"
