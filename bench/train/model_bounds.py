"""What a model allows of a cell (`bench.grid.bounds.ModelBounds`: its blocks, its patch), read by building it once
on the meta device, and the grid check that uses it.

torch and timm load only when the answer is not in the cache: a grid whose models were read before is checked
without them.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from bench.grid.bounds import ModelBounds, cell_problem, check_model_bounds
from bench.grid.cell import Cell, Profile
from bench.grid.model_ref import ModelSpec, runs_code
from bench.grid.spec import MAX_CELLS, Grid, load_grid

_BUILD_SIZE = 224
"""The side the model is built at to read its blocks and patch (neither depends on it)."""


def load_checked_grid(path, profile: Profile, max_cells: int = MAX_CELLS) -> Grid:
    """A grid file validated, expanded and checked against its models' bounds: the one validation of `list`, `run`,
    `estimate`, `predict` and the API, so that no command accepts what another refuses.

    >>> len(load_checked_grid("experiments/smoke.toml", "cpu").cells)
    4
    """
    grid = load_grid(path, profile, max_cells=max_cells)
    check_grid(grid)
    return grid


def check_grid(grid: Grid) -> None:
    """`bench.grid.bounds.check_model_bounds` with the models read here: GridFileError naming the file, the key and
    what is allowed, before any cell runs.

    >>> from bench.grid.spec import load_grid
    >>> check_grid(load_grid("experiments/smoke.toml", "cpu")) is None
    True
    """
    check_model_bounds(grid, bounds_of)


def problem(cell: Cell) -> tuple[str, object, str] | None:
    """`bench.grid.bounds.cell_problem` with the models read here (for a command's options)."""
    return cell_problem(cell, bounds_of)


def bounds_of(cell: Cell) -> ModelBounds | None:
    """The bounds of `cell`'s model (its reference, keyword arguments, channels and classes)."""
    return model_bounds(cell.model, cell.model_kwargs, cell.in_chans, cell.num_classes)


def model_bounds(model: str, model_kwargs: str = "{}", in_chans: int = 3, num_classes: int = 1000) -> ModelBounds | None:
    """The bounds of a model, from the disk cache or built once on the meta device; None when it cannot be built
    (a code model is never read from the disk cache: its file may have changed).

    >>> model_bounds("test_vit")
    ModelBounds(blocks=6, full_checkpointing=True, patch=(16, 16), pads=False, batch_norm=False)
    """
    key = {"model": model, "model_kwargs": model_kwargs, "in_chans": in_chans, "num_classes": num_classes}
    return _cached_bounds(json.dumps(key, sort_keys=True))


@cache
def _cached_bounds(key_text: str) -> ModelBounds | None:
    from bench.cache import DiskCache

    key = json.loads(key_text)
    store = None if runs_code(key["model"]) else \
        DiskCache("model-bounds", sources=("grid/bounds.py", "train/model_bounds.py", "train/models.py",
                                           "train/model_build.py"), check=_cached_bounds_problem)
    stored = store.get(key) if store else None
    if stored is not None:
        return ModelBounds(stored["blocks"], stored["full_checkpointing"],
                           tuple(stored["patch"]) if stored["patch"] else None, stored["pads"], stored["batch_norm"])
    bounds = _built_bounds(ModelSpec(key["model"], _BUILD_SIZE, 0, key["in_chans"], key["num_classes"],
                                     key["model_kwargs"]))
    if store and bounds:
        store.put(key, {"blocks": bounds.blocks, "full_checkpointing": bounds.full_checkpointing,
                        "patch": list(bounds.patch) if bounds.patch else None, "pads": bounds.pads,
                        "batch_norm": bounds.batch_norm})
    return bounds


def _cached_bounds_problem(value: Any) -> str | None:
    """What makes a cached value no `ModelBounds` (as `_cached_bounds` stores it), or None."""
    def whole(number: Any, least: int) -> bool:
        return isinstance(number, int) and not isinstance(number, bool) and number >= least

    if not isinstance(value, dict) or set(value) != {"blocks", "full_checkpointing", "patch", "pads", "batch_norm"}:
        return "not a model's bounds"
    patch = value["patch"]
    if not (whole(value["blocks"], 0) and isinstance(value["full_checkpointing"], bool)
            and isinstance(value["pads"], bool) and isinstance(value["batch_norm"], bool)
            and (patch is None or isinstance(patch, list) and len(patch) == 2 and all(whole(n, 1) for n in patch))):
        return f"not a model's bounds: {value!r}"[:160]
    return None


def _built_bounds(spec: ModelSpec) -> ModelBounds | None:
    import torch

    from bench.train.model_build import create
    from bench.train.models import checkpoint_slots, has_batch_norm_layer

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
    # timm pads a side to a multiple of the patch only with dynamic_img_pad, and the position embedding then
    # follows only when the size is dynamic too (strict_img_size off)
    pads = bool(getattr(embed, "dynamic_img_pad", False)) and not getattr(embed, "strict_img_size", True)
    return ModelBounds(len(checkpoint_slots(model)), hasattr(model, "set_grad_checkpointing"), patch, pads,
                       has_batch_norm_layer(model))
