"""The configuration key: which rows describe the same configuration. The only way to group rows.

A configuration is every axis of `bench.grid.cell.Cell` plus the micro-batch x accumulation split,
so a new axis is a new part of every key without touching a caller. A caller that compares rows
across one part (the split, the world size) names that part in `ignore`; everything else must
match, so two rows that differ only in an axis nobody thought of (channels_last, attention, ...)
never merge.

Example: a channels-last row and its plain twin have different keys; ignoring the split, a 64x1
and an 8x8 row of the same configuration share one:
    >>> plain = {"model": "m", "image_size": 224, "precision": "bf16", "checkpointing": "off",
    ...          "optimizer": "adamw", "channels_last": False, "micro_batch": 64, "accum_steps": 1}
    >>> configuration_key(plain) == configuration_key({**plain, "channels_last": True})
    False
    >>> split = ("micro_batch", "accum_steps")
    >>> configuration_key(plain, ignore=split) == configuration_key({**plain, "micro_batch": 8, "accum_steps": 8},
    ...                                                             ignore=split)
    True
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from typing import Any

from bench.grid.cell import REQUIRED, axes

SPLIT = ("micro_batch", "accum_steps")
"""The batch split: not axes of a grid (its `pairs` set them) but part of a cell's configuration."""

Key = tuple[tuple[str, Any], ...]
"""(column, value) pairs in `Cell` field order: hashable, sortable by `str`, readable in a repr."""


@cache
def key_columns() -> tuple[str, ...]:
    """Every column a configuration key holds: the axes, then the split.

    >>> key_columns()[:3], key_columns()[-2:]
    (('model', 'image_size', 'precision'), ('micro_batch', 'accum_steps'))
    """
    return (*axes(), *SPLIT)


@cache
def _defaults() -> dict[str, Any]:
    return {name: spec.grid_default for name, spec in axes().items() if spec.grid_default is not REQUIRED}


def _value(row: Mapping[str, Any], name: str) -> Any:
    """The row's value, its axis default where the row predates the axis (absent, None or empty)."""
    value = row.get(name)
    try:
        missing = value is None or value == "" or value != value  # value != value: NaN from a pandas row
    except TypeError:  # pandas' NA has no truth value
        missing = True
    if missing:
        return _defaults().get(name)
    if hasattr(value, "item"):  # a numpy scalar: the plain Python value, so keys compare and hash alike
        value = value.item()
    return value


def configuration_key(row: Mapping[str, Any], ignore: Iterable[str] = ()) -> Key:
    """The configuration `row` (a runs-file record, a pandas row, a dict) was measured at, less `ignore`.

    Rows with equal keys differ at most in the ignored columns; anything that is not part of the
    configuration (the device, the outcome, the provenance) is never in a key.

    >>> configuration_key({"model": "m", "image_size": 32}, ignore=key_columns()[2:])
    (('model', 'm'), ('image_size', 32))
    """
    skipped = set(ignore)
    unknown = skipped - set(key_columns())
    if unknown:
        raise ValueError(f"not configuration columns: {sorted(unknown)}")
    return tuple((name, _value(row, name)) for name in key_columns() if name not in skipped)


def varying(keys: Iterable[Key]) -> tuple[str, ...]:
    """The columns whose value is not the same in every key: what tells the keys apart.

    >>> a = configuration_key({"model": "m", "image_size": 32, "channels_last": False})
    >>> varying([a, configuration_key({"model": "m", "image_size": 32, "channels_last": True})])
    ('channels_last',)
    """
    values: dict[str, set] = {}
    for key in keys:
        for name, value in key:
            values.setdefault(name, set()).add(value)
    return tuple(name for name, seen in values.items() if len(seen) > 1)


def away_from_default(key: Key) -> tuple[str, ...]:
    """The columns of `key` whose axis has a default and is not at it.

    >>> away_from_default(configuration_key({"model": "m", "channels_last": True, "world_size": 2}))
    ('channels_last', 'world_size')
    """
    defaults = _defaults()
    return tuple(name for name, value in key if name in defaults and value != defaults[name])


def variant(row: Mapping[str, Any], named: Sequence[str] = ()) -> str:
    """The axes of `row` away from their grid default, other than `named` (those a label already shows):
    `channels_last`, `attention=eager`; "" for a row at every default.

    >>> variant({"channels_last": True, "attention": "eager", "optimizer": "sgd"}, named=("optimizer",))
    'channels_last attention=eager'
    """
    words = []
    for name, default in _defaults().items():
        value = _value(row, name)
        if name in named or value == default:
            continue
        words.append(name if value is True else f"{name}={value}")
    return " ".join(words)


def sort_key(key: Key) -> tuple[str, ...]:
    """An order for keys whose values mix types (None, numbers, text)."""
    return tuple(str(value) for _, value in key)
