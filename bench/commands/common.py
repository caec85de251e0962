"""Argument types shared by every subcommand."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Iterable

from bench.errors import ResultsFileError


def add_device_option(parser: argparse.ArgumentParser, default: str = "auto", help: str | None = None) -> None:
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default=default,
                        help=help or "auto: CUDA if present, else the CPU profile")


def finite(text: str) -> float:
    """A number, NaN and infinities refused (`--epochs nan` would price a run at NaN dollars)."""
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
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
