"""The bounds a grid's values have for the model they run on: `last-<N>` at most the model's blocks, an image
side at least a patch-embedding model's patch and a multiple of it.

`bench.grid.spec` bounds every value on its own (`last-1` .. `last-999`, sizes 1 .. 4096) without torch; these
bounds need the model, so they are checked when a grid is about to run, be estimated or predicted (`bench run`,
`estimate`, `predict`), before any cell does, and never by `list` or `--help`. The rules are here, torch-free;
what a model says (its blocks, its patch) is read by `bench.train.model_bounds`, which builds each model once on
the meta device (no weights, no forward: about 0.1 to 0.4 s for a timm ViT) and keeps the answer per model,
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
from typing import TYPE_CHECKING, Any, Callable

from bench.errors import GridFileError
from bench.grid.cell import Cell, axes

if TYPE_CHECKING:
    from bench.grid.spec import Grid


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
    batch_norm: bool = False
    """Whether the model normalises over the batch (BatchNorm): it cannot train on one sample once a layer's output
    is 1x1 (its per-channel statistics then have a single value), so its smallest micro-batch is 2."""

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


BoundsOf = Callable[[Cell], "ModelBounds | None"]
"""What reads a cell's model's bounds: `bench.train.model_bounds.bounds_of` (it builds the model; this stage
cannot import the one below it that does)."""


def cell_problem(cell: Cell, bounds_of: BoundsOf) -> tuple[str, Any, str] | None:
    """The first of `cell`'s values its model does not allow, as (axis, value, why and what is allowed); None when
    all are allowed or the model cannot be built here (`bounds_of` gives None: its cell reports that).

    >>> vit = ModelBounds(blocks=6, full_checkpointing=True, patch=(16, 16), pads=False)
    >>> cell_problem(Cell(experiment="e", profile="cpu", model="test_vit", image_size=30, micro_batch=1,
    ...                   accum_steps=1, precision="fp32", checkpointing="off", optimizer="sgd",
    ...                   channels_last=False, warmup_steps=1, measured_steps=1), lambda cell: vit)[:2]
    ('image_size', 30)
    """
    bounds = bounds_of(cell)
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


def check_model_bounds(grid: Grid, bounds_of: BoundsOf) -> None:
    """GridFileError, one line naming the file, the key and what is allowed, for the first cell whose model does
    not allow its checkpointing or image size (`bench.train.model_bounds.check_grid` passes the reader).

    >>> from bench.grid.spec import load_grid
    >>> check_model_bounds(load_grid("experiments/smoke.toml", "cpu"), lambda cell: None) is None
    True
    """
    for cell in grid.cells:
        found = cell_problem(cell, bounds_of)
        if found:
            axis, value, problem = found
            several = len({c.model for c in grid.cells}) > 1
            exclude = (f"; or leave the pair out: grid.exclude = [{{model = {json.dumps(cell.model)}, {axis} = "
                       f"{json.dumps(value)}}}]") if several else ""
            raise GridFileError(f"{grid.path}: {_key(grid, axis, value)}: {value!r} is not allowed for {cell.model}, "
                                f"{problem}{exclude}")


def _key(grid: Grid, axis: str, value: Any) -> str:
    """Where the grid file sets `axis` to `value`: `grid.image_size[1]`, or the profile's override of it."""
    try:
        raw = tomllib.loads(grid.path.read_bytes().decode("utf-8-sig"))
    except (OSError, ValueError):
        return f"grid.{axis}"
    override = raw.get("profile", {}).get(grid.profile, {}).get("grid", {})
    where, section = (f"profile.{grid.profile}.grid.{axis}", override) if axis in override else \
        (f"grid.{axis}", raw.get("grid", {}))
    values = section.get(axis)
    return f"{where}[{values.index(value)}]" if isinstance(values, list) and value in values else where
