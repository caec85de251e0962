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

The `[grid]` keys and the `exclude` keys are the axes of `bench.grid.cell.Cell` (its one list
of axes), plus `effective_batch` and `pairs`. Every problem becomes one `GridFileError` line
naming the file, the key and what is allowed.

Values are strict: a whole number is a TOML integer (not `"32"`, `32.0` or `true`), a boolean is
`true`/`false`, a number is finite; every number has an upper bound (`MAX_PAIR_VALUE`, the axes'
`maximum`, `RunSettings`). A value listed twice in one axis is an error (it would be the same cells
twice). The cell count is the product of the axes' lengths, checked against `MAX_CELLS` on the file's lists
before any value is validated, and again before anything is expanded.
"""

from __future__ import annotations

import difflib
import itertools
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Iterable, get_args, get_origin

import tomllib
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
)
from pydantic.functional_validators import AfterValidator

from bench.errors import GridFileError, OptionError, shown
from bench.frames import Tabular
from bench.grid.cell import (
    MODEL_CHARACTERS,
    MODEL_PATTERN,
    REQUIRED,
    Cell,
    Profile,
    axes,
    extra_axis_defaults,
    field_docs,
    field_types,
)

PAIR_FIELDS = ("micro_batch", "accum_steps")
"""The `Cell` fields that `[grid] pairs` sets together."""
MAX_PAIR_VALUE = 65_536
"""Largest micro-batch, accumulation steps or effective batch a grid file may ask for."""
MAX_CELLS = 10_000
"""Largest grid (`bench run --max-cells` overrides): a bigger one is more likely a mistake than a plan."""
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]*$"
"""Experiment names: one folder under the results root, so no `.`, `..` or separators."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class ExperimentInfo(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=NAME_PATTERN)
    """Experiment name (letters, digits, _ and -, at most 64); also the results folder name."""
    description: str = ""
    """What the study asks, in a sentence."""
    runs_model_code: bool = False
    """Allow `grid.model` to name code (package.module:factory, path/to/file.py:factory), which runs when the cells
    are built; without it a grid file names timm and hf-hub: models only."""


def _value_type(name: str) -> Any:
    """The type of one value of `Cell` field `name`, with its axis's bounds and pattern."""
    spec = axes().get(name)
    constraints: dict[str, Any] = {}
    if spec is not None and spec.minimum is not None:
        constraints["ge"] = spec.minimum
    if spec is not None and spec.maximum is not None:
        constraints["le"] = spec.maximum
    if spec is not None and spec.pattern is not None:
        constraints["pattern"] = spec.pattern
    if name in PAIR_FIELDS:
        constraints.update(ge=1, le=MAX_PAIR_VALUE)
    kind = field_types()[name]
    return Annotated[kind, Field(**constraints)] if constraints else kind


class _Exclusion(_Strict):
    def matches(self, cell: Cell) -> bool:
        return all(getattr(cell, key) == value for key, value in self if value is not None)


Exclusion = create_model(
    "Exclusion", __base__=_Exclusion, __doc__="Cells matching every given key are dropped from the product "
                                              "(like a CI matrix `exclude`).",
    **{name: (_value_type(name) | None, None) for name in field_docs() if name in axes() or name in PAIR_FIELDS},
)


def _no_repeats(values: list) -> list:
    """An axis lists each value once: a repeat would be the same cells twice. One pass (a dict of first positions),
    so a long axis costs linear time."""
    first: dict = {}
    for index, value in enumerate(values):
        key = (type(value), value)  # 1 and true are different values of different axes, never a repeat
        if key in first:
            raise ValueError(f"[{index}] {value!r} repeats [{first[key]}]; list each value once "
                             "(a repeat is the same cells twice)")
        first[key] = index
    return values


class _Axes(_Strict):
    @field_validator(*axes(), mode="before", check_fields=False)
    @classmethod
    def _scalar_to_list(cls, value: Any) -> Any:
        return value if isinstance(value, list) else [value]

    @field_validator("pairs", mode="before", check_fields=False)
    @classmethod
    def _pairs_as_tuples(cls, value: Any) -> Any:
        # TOML has no tuples: each [micro_batch, accum_steps] list is one (still strictly typed inside).
        return [tuple(pair) if isinstance(pair, list) else pair for pair in value] if isinstance(value, list) else value

    @field_validator("pairs", check_fields=False)
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


def _axes_fields() -> dict[str, Any]:
    """`[grid]`'s keys in `Cell` order: each axis a list, `pairs` (and the batch it makes) in place of
    micro_batch and accum_steps, `exclude` last."""
    keys: dict[str, Any] = {}
    for name in field_docs():
        spec = axes().get(name)
        if spec is not None:
            values = Field(min_length=1, description=field_docs()[name])
            default = ... if spec.grid_default is REQUIRED else [spec.grid_default]
            keys[name] = (Annotated[list[_value_type(name)], values, AfterValidator(_no_repeats)], default)
        elif name == PAIR_FIELDS[0]:
            keys["effective_batch"] = (int, Field(gt=0, le=MAX_PAIR_VALUE,
                                                  description="samples per optimizer step, every pair"))
            pair = tuple[_value_type("micro_batch"), _value_type("accum_steps")]
            keys["pairs"] = (Annotated[list[pair], AfterValidator(_no_repeats)],
                             Field(min_length=1, description="(micro_batch, accum_steps) pairs; each product must "
                                                             "equal effective_batch"))
    keys["exclude"] = (list[Exclusion], Field(default=[], description="partial cells to drop from the product"))
    return keys


GridAxes = create_model("GridAxes", __base__=_Axes, __doc__="The axes whose cartesian product is the grid.",
                        **_axes_fields())


class RunSettings(_Strict):
    """How each cell is run."""

    warmup_steps: int = Field(default=2, gt=0, le=10_000)
    """Optimizer steps before measuring (at least one, so optimizer state exists; at most 10,000)."""
    measured_steps: int = Field(default=5, gt=0, le=10_000)
    """Timed optimizer steps at least (at most 10,000); more are timed until target_ci95_rel is met."""
    adaptive_timing: bool = True
    """Time until target_ci95_rel is met and warm up until step times settle (a noisy cell is measured once more);
    false: exactly warmup_steps and measured_steps, once (a cell whose steps grow on purpose, such as a kept graph,
    never settles)."""
    target_ci95_rel: float = Field(default=0.05, gt=0, le=1)
    """Timing stops once the 95 % interval of the median step time is this narrow, relative to the median."""
    timing_budget_s: float = Field(default=60.0, gt=0, le=86_400)
    """Seconds the timed steps of one cell may take before it stops short of the target (the row says so)."""
    timeout_s: float = Field(default=900.0, gt=0, le=86_400)
    """Wall-clock limit for one cell's process, in seconds (a finite number, at most a day)."""
    threads: int | None = Field(default=None, ge=1, le=1024)
    """Intra-op threads per cell on a CPU; unset: the cores this process may use (affinity, cgroup quota).
    `bench run --threads` overrides it."""
    quiet_wait_s: float = Field(default=120.0, ge=0, le=86_400)
    """Before each cell, seconds to wait at most for other work to leave the cell's cores free."""
    seed: int = Field(default=0, ge=0, le=2**32 - 1)

    @field_validator("target_ci95_rel", "timing_budget_s", "timeout_s", "quiet_wait_s")
    @classmethod
    def _not_subnormal(cls, value: float) -> float:
        # as the command line's numbers (`bench.commands.common.finite`): 5e-324 s passes `gt=0` and means nothing
        if value != 0 and abs(value) < sys.float_info.min:
            raise ValueError(f"{value!r} is too small to compute with (a subnormal number)")
        return value


def cell_bounds() -> dict[str, tuple[int, int]]:
    """The smallest and largest value a grid can give each whole-number `Cell` field (and the batches derived from
    them), read from the grid's own validators: a runs file's row is checked against the same numbers.

    >>> cell_bounds()["micro_batch"], cell_bounds()["image_size"], cell_bounds()["seed"]
    ((1, 65536), (1, 4096), (0, 4294967295))
    """
    def limits(metadata: list) -> tuple[int, int]:
        low = next((m.ge if hasattr(m, "ge") else m.gt + 1 for m in metadata if hasattr(m, "ge") or hasattr(m, "gt")))
        return low, next(m.le for m in metadata if hasattr(m, "le"))

    bounds = {name: limits(get_args(_value_type(name))[1].metadata) for name, kind in field_types().items()
              if kind is int and (name in PAIR_FIELDS or name in axes())}
    bounds["effective_batch"] = limits(GridAxes.model_fields["effective_batch"].metadata)
    bounds["global_batch"] = (bounds["effective_batch"][0] * bounds["world_size"][0],
                              bounds["effective_batch"][1] * bounds["world_size"][1])
    for name in ("warmup_steps", "measured_steps", "seed"):  # the Cell's copies of the grid's run settings
        bounds[name] = limits(RunSettings.model_fields[name].metadata)
    return bounds


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
class Grid(Tabular):
    """A validated grid resolved for one profile."""

    path: Path
    name: str
    description: str
    profile: Profile
    profile_description: str
    run: RunSettings
    cells: tuple[Cell, ...]

    def frame_rows(self) -> list[dict]:
        """One row per cell: its id and every field (`to_frame()`, and the table a notebook shows)."""
        return [{"cell_id": cell.cell_id, **cell.to_dict()} for cell in self.cells]

    def only(self, wanted: dict[str, str]) -> Grid:
        """The grid with only the cells whose axes have the values `wanted` (axis -> value, as written, any case);
        no cell matching is an `OptionError` (`--only`) saying the values the grid holds."""
        def matches(cell: Cell, name: str) -> bool:
            return str(getattr(cell, name)).lower() == wanted[name].lower()

        unknown = [name for name in wanted if name not in axes()]
        if unknown:
            raise OptionError(f"--only {unknown[0]}={wanted[unknown[0]]}: want AXIS=VALUE with AXIS one of "
                              f"{', '.join(axes())}")
        cells = tuple(c for c in self.cells if all(matches(c, n) for n in wanted))
        if not cells:  # an empty prediction would write no file to read back: say what the grid holds instead
            name = next((n for n in wanted if not any(matches(c, n) for c in self.cells)), next(iter(wanted)))
            values = ", ".join(dict.fromkeys(str(getattr(c, name)) for c in self.cells))
            asked = " ".join(f"{n}={v}" for n, v in wanted.items())
            raise OptionError(f"--only {asked}: no cell of {self.path} matches; its {name} values: {values}")
        return replace(self, cells=cells)


def load_grid(path: str | Path, profile: Profile, *, check_models: bool = True, max_cells: int = MAX_CELLS) -> Grid:
    """Read and validate a grid file, apply `profile`'s overrides, expand to cells (at most `max_cells`).
    The models' own bounds (blocks, patch) need the models: `bench.train.model_bounds.load_checked_grid` adds them,
    and every command loads its grids through it.

    Example:
        >>> grid = load_grid("experiments/smoke.toml", "cpu")
        >>> grid.cells[0].profile
        'cpu'
    """
    path = Path(path)
    raw = _read_toml(path)
    _refuse_oversize(raw, profile, path, max_cells)  # before validation, whose cost grows with the values
    spec = _validate(GridFile, raw, path, prefix=())
    grid_axes, run, profile_description = spec.grid, spec.run, ""
    for name, section in spec.profile.items():  # validate every profile, apply the chosen one
        merged_axes = _validate_override(GridAxes, raw["grid"], section.grid, path, ("grid",), name)
        merged_run = _validate_override(RunSettings, raw.get("run", {}), section.run, path, ("run",), name)
        if name == profile:
            grid_axes, run, profile_description = merged_axes, merged_run, section.description
    _check_count(cell_count(grid_axes), path, max_cells)
    _check_models(grid_axes.model, path, spec.experiment.runs_model_code, resolve=check_models)
    cells = tuple(_expand(spec.experiment.name, profile, grid_axes, run))
    if not cells:
        raise GridFileError(f"{path}: grid.exclude: every cell is excluded; nothing would run")
    return Grid(path, spec.experiment.name, spec.experiment.description, profile,
                profile_description, run, cells)


def _refuse_oversize(raw: dict, profile: Profile, path: Path, max_cells: int) -> None:
    """The cell count of the file as written (`profile`'s overrides applied), from the lengths of its lists alone:
    a 200,000-name axis is refused in microseconds, not after every name is validated. A file too malformed to
    count is left to the validation."""
    section = raw.get("grid")
    override = raw.get("profile", {}).get(profile, {}) if isinstance(raw.get("profile"), dict) else {}
    override = override.get("grid", {}) if isinstance(override, dict) else {}
    if not isinstance(section, dict) or not isinstance(override, dict):
        return
    merged = {**section, **override}
    count = 1
    for name in (*axes(), "pairs"):
        value = merged.get(name)
        count *= len(value) if isinstance(value, list) else 1
    _check_count(count, path, max_cells)


def _check_count(count: int, path: Path, max_cells: int) -> None:
    if count > max_cells:
        raise GridFileError(f"{path}: grid: {count:,} cells (the product of the axes' lengths) is over the limit of "
                            f"{max_cells:,}; split the grid, or pass --max-cells {count} if it is meant")


def cell_count(grid_axes: BaseModel) -> int:
    """The cells the axes make before exclusions and de-duplication: the product of their lengths."""
    count = len(grid_axes.pairs)
    for name in axes():
        count *= len(getattr(grid_axes, name))
    return count


def require_precisions(grid: Grid, supported: Iterable[str], device_name: str) -> None:
    """Fail cleanly when a cell asks for a precision this device cannot run."""
    supported = tuple(supported)
    for cell in grid.cells:
        if cell.precision not in supported:
            raise GridFileError(
                f"{grid.path}: grid.precision: {cell.precision!r} cannot run on {device_name}; "
                f"allowed here: {', '.join(supported)}"
            )


def _expand(experiment: str, profile: Profile, grid_axes: BaseModel, run: RunSettings) -> Iterable[Cell]:
    # Pairs vary third, after model and image size, as the grid files read; world size varies
    # before the axes after it, so a configuration's 1-process cell (the scaling baseline) runs first.
    names = list(axes())
    values = [getattr(grid_axes, name) for name in names]
    seen: set[str] = set()
    said = grid_axes.model_fields_set  # the keys the file (or its profile) sets
    hub_configs: dict[str, Any] = {}
    for model, size, (micro, accum), *rest in itertools.product(*values[:2], grid_axes.pairs, *values[2:]):
        cell = synthetic_input_default(single_process_default(hub_config_default(Cell(
            experiment=experiment, profile=profile, micro_batch=micro, accum_steps=accum,
            **dict(zip(names, (model, size, *rest))), warmup_steps=run.warmup_steps,
            measured_steps=run.measured_steps, seed=run.seed,
        ), said, hub_configs)))
        if cell.cell_id not in seen and not any(rule.matches(cell) for rule in grid_axes.exclude):
            seen.add(cell.cell_id)
            yield cell


def hub_config_default(cell: Cell, said: set[str], hub_configs: dict[str, Any]) -> Cell:
    """An hf-hub model's cell built as its cached config says (`bench.grid.model_ref.hub_defaults`, as the command
    line does): `num_classes` and `in_chans` from the config unless the grid file sets them; the config's
    `model_args` go under the cell's `model_kwargs` when timm builds it. `model_config_source` says which won.
    `hub_configs` keeps each model's config across the cells."""
    from bench.grid.model_ref import HubDefaults, hub_defaults, kind_of

    if kind_of(cell.model) != "hf-hub":
        return cell
    if cell.model not in hub_configs:
        hub_configs[cell.model] = hub_defaults(cell.model) or HubDefaults(None, None, {})
    hub = hub_configs[cell.model]
    values = {"num_classes": hub.num_classes, "in_chans": hub.input_size[0] if hub.input_size else None}
    taken = {name: value for name, value in values.items() if name not in said and value is not None}
    sources = {name: "grid" if name in said else "hub config" if name in taken else "default" for name in values}
    own = cell.model_kwargs != "{}"
    sources["model_kwargs"] = ("grid over hub config" if own and hub.model_kwargs else "grid" if own else
                               "hub config" if hub.model_kwargs else "none")
    return replace(cell, **taken, model_config_source=", ".join(f"{name} {source}"
                                                                 for name, source in sources.items()))


def single_process_default(cell: Cell) -> Cell:
    """One process has nothing to synchronise: its `ddp_sync` is the default, so
    `world_size = [1, 2]` x `ddp_sync = [no_sync, every_step]` gives one 1-process cell, not two."""
    return replace(cell, ddp_sync="no_sync") if cell.world_size == 1 else cell


def synthetic_input_default(cell: Cell) -> Cell:
    """Synthetic input has no loader: its `loader_workers` is the default, so `input = [synthetic, loader]`
    x `loader_workers = [2, 4]` gives one synthetic cell, not two."""
    if cell.input != "synthetic":
        return cell
    return replace(cell, loader_workers=extra_axis_defaults()["loader_workers"])


def with_world_size(grid: Grid, world_size: int) -> Grid:
    """`grid` with every cell run on `world_size` processes (`bench run --nproc N`)."""
    cells = {cell.cell_id: cell for cell in
             (single_process_default(replace(c, world_size=world_size)) for c in grid.cells)}
    return replace(grid, cells=tuple(cells.values()))


def _read_toml(path: Path) -> dict:
    try:
        # A BOM (Windows editors' "UTF-8 with signature") is not part of the first key.
        return tomllib.loads(path.read_bytes().decode("utf-8-sig"))
    except FileNotFoundError:
        raise GridFileError(f"{path}: no such grid file") from None
    except IsADirectoryError:
        raise GridFileError(f"{path}: is a directory, not a grid file (TOML)") from None
    except OSError as exc:
        raise GridFileError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise GridFileError(f"{path}: not UTF-8 text (byte {exc.start}); a grid file is TOML in UTF-8") from None
    except RecursionError:
        raise GridFileError(f"{path}: nested too deeply to be a grid file") from None
    except tomllib.TOMLDecodeError as exc:
        raise GridFileError(f"{path}: not valid TOML: {exc}") from None


def _validate_override(model: type[BaseModel], base: dict, override: dict, path: Path,
                       section: tuple[str, ...], profile: str) -> Any:
    merged = {**base, **override}
    override_keys = set(override)
    try:
        return model.model_validate(merged)
    except ValidationError as exc:
        first = _first_error(exc.errors())
        in_override = first["loc"] and first["loc"][0] in override_keys
        prefix = ("profile", profile, *section) if in_override else section
        raise GridFileError(_format_error(first, model, path, prefix)) from None


def _validate(model: type[BaseModel], data: dict, path: Path, prefix: tuple[str, ...]) -> Any:
    try:
        return model.model_validate(data)
    except RecursionError:
        raise GridFileError(f"{path}: nested too deeply to be a grid file") from None
    except ValidationError as exc:
        raise GridFileError(_format_error(_first_error(exc.errors()), model, path, prefix)) from None


def _first_error(errors: list[dict]) -> dict:
    """The error to report: an unknown key first, since a typo'd key also makes the key it meant 'missing'."""
    return next((error for error in errors if error["type"] == "extra_forbidden"), errors[0])


def _format_error(error: dict, model: type[BaseModel], path: Path, prefix: tuple) -> str:
    loc = tuple(error["loc"])
    key = _dotted(prefix + loc)
    kind, value = error["type"], error.get("input")
    if kind == "extra_forbidden":
        allowed = list(_model_at(model, loc[:-1]).model_fields)
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}? " if close else ""
        return f"{path}: {key}: unknown key; {hint}allowed keys here: {', '.join(allowed)}"
    if kind == "missing":
        return f"{path}: {key}: required key is missing"
    if kind == "literal_error":
        return f"{path}: {key}: {value!r} is not allowed; allowed: {error['ctx']['expected']}"
    if kind == "greater_than":
        return f"{path}: {key}: {value!r} is not allowed; must be greater than {error['ctx']['gt']}"
    if kind == "greater_than_equal":
        return f"{path}: {key}: {value!r} is not allowed; must be >= {error['ctx']['ge']}"
    if kind == "less_than_equal":
        return f"{path}: {key}: {value!r} is not allowed; must be <= {error['ctx']['le']}"
    if kind in _TYPE_NAMES:
        return f"{path}: {key}: {shown(value)} is not allowed; must be {_TYPE_NAMES[kind]}"
    if kind == "string_pattern_mismatch" and error["ctx"]["pattern"] == MODEL_PATTERN:
        return (f"{path}: {key}: {shown(value)} is not a model reference; allowed: a timm name, hf-hub:ORG/NAME, "
                f"package.module:factory or path/to/file.py:factory, {MODEL_CHARACTERS}")
    if kind == "string_pattern_mismatch":
        return f"{path}: {key}: {value!r} is not allowed; must match {error['ctx']['pattern']}"
    if kind == "value_error":
        return f"{path}: {key}: {error['msg'].removeprefix('Value error, ')}"
    return f"{path}: {key}: {error['msg']} (got {shown(value)})"


_TYPE_NAMES = {"int_type": "a whole number (a TOML integer, not text, a float or true/false)",
               "bool_type": "true or false", "float_type": "a number", "finite_number": "a finite number",
               "string_type": "text (a quoted TOML string)", "list_type": "a list", "tuple_type": "a list",
               "dict_type": "a table", "model_type": "a table"}


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


def _check_models(names: list[str], path: Path, runs_model_code: bool, *, resolve: bool = True) -> None:
    """Refuse a model the grid may not name, then (`resolve`) one that cannot be found. The opt-in comes first
    and on its own: looking a module up imports its parent packages, which runs their code."""
    from bench.grid.model_ref import model_problem, runs_code

    for index, name in enumerate(names):
        if runs_code(name) and not runs_model_code:
            raise GridFileError(f"{path}: grid.model[{index}]: {name!r} names code, which runs when the model is "
                                "built; a grid file runs it only with experiment.runs_model_code = true")
    for index, name in enumerate(names if resolve else ()):
        problem = model_problem(name)
        if problem:
            raise GridFileError(f"{path}: grid.model[{index}]: {problem}")
