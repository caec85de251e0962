"""Argument types shared by every subcommand."""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path
from typing import Annotated, Any, Iterable

from bench.errors import ResultsFileError


def add_device_option(parser: argparse.ArgumentParser, default: str = "auto", help: str | None = None) -> None:
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default=default,
                        help=help or "auto: CUDA if present, else the CPU profile")


MAX_NUMBER = 1e12
"""Largest number any option takes: past it a figure means nothing here (1e12 epochs, GiB or dollars) and
sums with it lose their digits; each option's help says what is sensible."""


def finite(text: str) -> float:
    """A number, NaN, infinities, subnormals and magnitudes over `MAX_NUMBER` refused (`--epochs nan` would price
    a run at NaN dollars, `--epochs 1e308` at infinitely many)."""
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    if abs(value) > MAX_NUMBER:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_NUMBER:g} in size, got {text}")
    if value != 0 and abs(value) < sys.float_info.min:
        raise argparse.ArgumentTypeError(f"is too small to compute with (a subnormal number), got {text}")
    return value


def positive(text: str) -> float:
    value = finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {text}")
    if value > MAX_NUMBER:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_NUMBER:g}, got {text}")
    return value


def fraction(text: str) -> float:
    value = finite(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def non_negative(text: str) -> float:
    value = finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def axis_value(name: str):
    """An argparse type for axis `name`: a whole number within its bounds, or text matching its pattern."""
    from bench.grid.cell import axes, field_types

    spec = axes()[name]

    def parse(text: str) -> Any:
        if field_types()[name] is int:
            value = positive_int(text)
            if spec.minimum is not None and value < spec.minimum:
                raise argparse.ArgumentTypeError(f"must be >= {spec.minimum}, got {text}")
            if spec.maximum is not None and value > spec.maximum:
                raise argparse.ArgumentTypeError(f"must be <= {spec.maximum}, got {text}")
            return value
        if spec.pattern and not re.fullmatch(spec.pattern, text):
            raise argparse.ArgumentTypeError(f"{text!r} must match {spec.pattern}")
        return text
    parse.__name__ = name  # argparse names the type in its error
    return parse


def setting_value(model: Any, name: str):
    """An argparse type for field `name` of a pydantic settings model (`RunSettings`): the bounds a grid file's
    key has, so that a flag and the key accept the same values.

    >>> from bench.grid.spec import RunSettings
    >>> setting_value(RunSettings, "measured_steps")("20")
    20
    >>> setting_value(RunSettings, "measured_steps")("1000000")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: must be <= 10000, got 1000000
    """
    from pydantic import TypeAdapter, ValidationError

    field = model.model_fields[name]
    adapter = TypeAdapter(Annotated[field.annotation, *field.metadata])
    whole = field.annotation is int or field.annotation == (int | None)

    def parse(text: str) -> Any:
        value = int(text) if whole else finite(text)
        try:
            return adapter.validate_python(value)
        except ValidationError as exc:
            error = exc.errors()[0]
            bound = {"greater_than": "must be > {gt}", "greater_than_equal": "must be >= {ge}",
                     "less_than_equal": "must be <= {le}", "less_than": "must be < {lt}"}.get(error["type"])
            raise argparse.ArgumentTypeError(f"{bound.format(**error['ctx']) if bound else error['msg']}, "
                                             f"got {text}") from None
    parse.__name__ = name  # argparse names the type in its error
    return parse


def pair_value(text: str) -> int:
    """A micro-batch or accumulation count, bounded as in a grid file's `pairs` (`MAX_PAIR_VALUE`)."""
    from bench.grid.spec import MAX_PAIR_VALUE

    value = positive_int(text)
    if value > MAX_PAIR_VALUE:
        raise argparse.ArgumentTypeError(f"must be <= {MAX_PAIR_VALUE:,} (as in a grid file), got {text}")
    return value


def positive_int_list(text: str) -> list[int]:
    """`1,2,4` -> [1, 2, 4], each a positive whole number."""
    return [positive_int(part) for part in text.split(",")]


def version() -> str:
    """`bench 0.1.0`: the installed package's version (`bench --version`, and every JSON document)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return f"bench {installed('bench')}"
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "bench (not installed)"


def require_folders(folders: Iterable[Path]) -> None:
    """Refuse a results folder that does not exist, before the command loads its libraries (torch, pandas)."""
    for folder in folders:
        if not folder.is_dir():
            raise ResultsFileError(f"{folder}: no such folder; pass a results folder such as "
                                   "results/<experiment>/<device-tag>")


def add_cache_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-cache", action="store_true",
                        help="neither read nor write the disk cache of traces (~/.cache/bench, $BENCH_CACHE_DIR)")
