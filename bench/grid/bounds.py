"""The bounds a grid's values have for the model they run on: `last-<N>` at most the model's blocks, an image
side at least a patch-embedding model's patch and a multiple of it.

`bench.grid.spec` bounds every value on its own (`last-1` .. `last-999`, sizes 1 .. 4096) without torch; these
bounds need the model, so they are checked when a grid is about to run, be estimated or predicted (`bench run`,
`estimate`, `predict`), before any cell does, and never by `list` or `--help`. Each model is built once on the
meta device (no weights, no forward: about 0.1 to 0.4 s for a timm ViT) and what it says is kept per model,
keyword arguments, channels and classes, in this process and in the disk cache (`bench.cache`).

Why a size that is not a multiple of the patch is refused: the builder gives timm the cell's size
(`img_size`), so the position embedding always matches, but timm's patch embedding then drops the last
`size % patch` rows and columns: a "200 px" ViT-B/16 cell would measure a 192 px model. A model told to pad
(`model_kwargs = '{"dynamic_img_size": true, "dynamic_img_pad": true}'`, timm's way to accept any size) takes
any size from one patch up, and computes on the padded one.

A model that cannot be built here, and every other way a model refuses its input (a CNN whose stem is larger
than the image, a model that is not a classifier), is left to the cell: a failed row naming the model, the input
and the exception.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from bench.errors import GridFileError
from bench.grid.cell import Cell, axes
from bench.grid.model_ref import ModelSpec, runs_code

if TYPE_CHECKING:
    from bench.grid.spec import Grid

_BUILD_SIZE = 224
"""The side the model is built at to read its blocks and patch (neither depends on it)."""


@dataclass(frozen=True)
class ModelBounds:
    """What a model allows of a cell's checkpointing and image size.

    >>> vit = ModelBounds(blocks=12, full_checkpointing=True, patch=(16, 16), pads=False)
    >>> vit.checkpointing_problem("last-13")
    'it has 12 blocks; allowed: off, full, last-1 .. last-12'
    >>> vit.size_problem(200, 16), vit.size_problem(224, 16) is None
    ('its patch is 16: a side that is not a multiple loses its last pixels; allowed: multiples of 16 from 16 to 4096, \
or any side from 16 with model_kwargs {"dynamic_img_size": true, "dynamic_img_pad": true}', True)
    """

    blocks: int
    """Blocks `last-<N>` can checkpoint (ViT `blocks`, ResNet `layer1..4`; `bench.train.models.checkpoint_slots`)."""
    full_checkpointing: bool
    """Whether the model has timm's `set_grad_checkpointing` (checkpointing `full`)."""
    patch: tuple[int, int] | None
    """The patch embedding's patch (height, width), None for a model without one."""
    pads: bool
    """Whether the model pads a side to a multiple of the patch (timm's `dynamic_img_pad` with `dynamic_img_size`)."""

    def checkpointing_problem(self, mode: str) -> str | None:
        """None when `mode` is one this model takes, else why not and what is allowed."""
        allowed = ["off"] + (["full"] if self.full_checkpointing else [])
        allowed += [f"last-1 .. last-{self.blocks}"] if self.blocks > 1 else ["last-1"] if self.blocks else []
        if mode.startswith("last-") and int(mode.removeprefix("last-")) > self.blocks:
            why = f"it has {self.blocks} blocks" if self.blocks else \
                "it has no blocks last-<N> counts (ViT `blocks`, ResNet `layer1..4`)"
            return f"{why}; allowed: {', '.join(allowed)}"
        if mode == "full" and not self.full_checkpointing:
            return f"it has no set_grad_checkpointing (timm's); allowed: {', '.join(allowed)}"
        return None

    def size_problem(self, side: int, patch: int) -> str | None:
        """None when an input side of `side` pixels suits a patch of `patch` (one of `self.patch`), else why not."""
        if patch <= 1 or (side >= patch and (side % patch == 0 or self.pads)):
            return None
        largest = axes()["image_size"].maximum
        padded = (f", or any side from {patch} with model_kwargs "
                  '{"dynamic_img_size": true, "dynamic_img_pad": true}') if not self.pads else ""
        what = "a side below one patch has no patch" if side < patch else \
            "a side that is not a multiple loses its last pixels"
        allowed = f"{patch} to {largest}" if self.pads else f"multiples of {patch} from {patch} to {largest}"
        return f"its patch is {patch}: {what}; allowed: {allowed}{padded}"


def cell_problem(cell: Cell) -> tuple[str, Any, str] | None:
    """The first of `cell`'s values its model does not allow, as (axis, value, why and what is allowed); None when
    all are allowed or the model cannot be built here (its cell reports that). Loads torch and timm.

    >>> cell_problem(Cell(experiment="e", profile="cpu", model="test_vit", image_size=30, micro_batch=1,
    ...                   accum_steps=1, precision="fp32", checkpointing="off", optimizer="sgd",
    ...                   channels_last=False, warmup_steps=1, measured_steps=1))[:2]
    ('image_size', 30)
    """
    bounds = model_bounds(cell.model, cell.model_kwargs, cell.in_chans, cell.num_classes)
    if bounds is None:
        return None
    problem = bounds.checkpointing_problem(cell.checkpointing)
    if problem:
        return "checkpointing", cell.checkpointing, problem
    if bounds.patch is not None:
        sides = [("image_size", cell.image_size, bounds.patch[0])]
        sides += [("image_width", cell.image_width, bounds.patch[1])] if cell.image_width else \
            [("image_size", cell.image_size, bounds.patch[1])]
        for axis, side, patch in sides:
            problem = bounds.size_problem(side, patch)
            if problem:
                return axis, side, problem
    return None


def check_model_bounds(grid: Grid) -> None:
    """GridFileError, one line naming the file, the key and what is allowed, for the first cell whose model does
    not allow its checkpointing or image size. Loads torch and timm; each model is built once.

    >>> from bench.grid.spec import load_grid
    >>> check_model_bounds(load_grid("experiments/smoke.toml", "cpu")) is None
    True
    """
    for cell in grid.cells:
        found = cell_problem(cell)
        if found:
            axis, value, problem = found
            several = len({c.model for c in grid.cells}) > 1
            exclude = (f"; or leave the pair out: grid.exclude = [{{model = {json.dumps(cell.model)}, {axis} = "
                       f"{json.dumps(value)}}}]") if several else ""
            raise GridFileError(f"{grid.path}: {_key(grid, axis, value)}: {value!r} is not allowed for {cell.model}, "
                                f"{problem}{exclude}")


def model_bounds(model: str, model_kwargs: str = "{}", in_chans: int = 3, num_classes: int = 1000) -> ModelBounds | None:
    """The bounds of a model, from the disk cache or built once on the meta device; None when it cannot be built
    (a code model is never read from the disk cache: its file may have changed)."""
    key = {"model": model, "model_kwargs": model_kwargs, "in_chans": in_chans, "num_classes": num_classes}
    return _cached_bounds(json.dumps(key, sort_keys=True))


@cache
def _cached_bounds(key_text: str) -> ModelBounds | None:
    from bench.cache import DiskCache

    key = json.loads(key_text)
    store = None if runs_code(key["model"]) else \
        DiskCache("model-bounds", sources=("grid/bounds.py", "train/models.py", "train/model_build.py"))
    stored = store.get(key) if store else None
    if isinstance(stored, dict):
        try:
            return ModelBounds(stored["blocks"], stored["full_checkpointing"],
                               tuple(stored["patch"]) if stored["patch"] else None, stored["pads"])
        except (KeyError, TypeError):
            pass  # an entry of another layout: built again below
    bounds = _built_bounds(ModelSpec(key["model"], _BUILD_SIZE, 0, key["in_chans"], key["num_classes"],
                                     key["model_kwargs"]))
    if store and bounds:
        store.put(key, {"blocks": bounds.blocks, "full_checkpointing": bounds.full_checkpointing,
                        "patch": list(bounds.patch) if bounds.patch else None, "pads": bounds.pads})
    return bounds


def _built_bounds(spec: ModelSpec) -> ModelBounds | None:
    import torch

    from bench.train.model_build import create
    from bench.train.models import checkpoint_slots

    try:
        with torch.device("meta"):
            model = create(spec)
    except Exception:  # noqa: BLE001 - any failure to build is the cell's to report, as a row
        return None
    embed = getattr(model, "patch_embed", None)
    patch = getattr(embed, "patch_size", None)
    if isinstance(patch, int):
        patch = (patch, patch)
    patch = tuple(int(p) for p in patch) if isinstance(patch, (tuple, list)) and len(patch) == 2 else None
    pads = bool(getattr(embed, "dynamic_img_pad", False)) and not getattr(embed, "strict_img_size", True)
    return ModelBounds(len(checkpoint_slots(model)), hasattr(model, "set_grad_checkpointing"), patch, pads)


def _key(grid: Grid, axis: str, value: Any) -> str:
    """Where the grid file sets `axis` to `value`: `grid.image_size[1]`, or the profile's override of it."""
    try:
        raw = tomllib.loads(grid.path.read_text())
    except (OSError, ValueError):
        return f"grid.{axis}"
    override = raw.get("profile", {}).get(grid.profile, {}).get("grid", {})
    where, section = (f"profile.{grid.profile}.grid.{axis}", override) if axis in override else \
        (f"grid.{axis}", raw.get("grid", {}))
    values = section.get(axis)
    return f"{where}[{values.index(value)}]" if isinstance(values, list) and value in values else where
