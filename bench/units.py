"""Units, defined once, and how a figure in each is written.

Every console line, plan, probe, cost table and claim writes its bytes, shares and rates through these, so a
figure of one kind reads the same everywhere; where two outputs show the same kind of figure to different
precision (a plan's 1-decimal GiB, a probe's 2), the caller passes its `decimals`.
"""

from __future__ import annotations

GIB = 2**30
MIB = 2**20
GB = 1e9  # decimal: the articles' gigabytes ("304M params x 4 bytes = 1.2GB"), the data sets' sizes
MB = 1e6
TFLOP = 1e12
GFLOP = 1e9


def _number(value: float, decimals: int | None, signed: bool = False) -> str:
    """`value` with `decimals` places, or in its shortest form (`:g`) when `decimals` is None."""
    return format(value, ("+" if signed else "") + ("g" if decimals is None else f".{decimals}f"))


def byte_unit(largest: float) -> tuple[int, str]:
    """(bytes per unit, name) for figures whose largest is `largest`: GiB from one GiB up, MiB below (and for NaN).

    >>> byte_unit(3 * 2**20), byte_unit(2**31)
    ((1048576, 'MiB'), (1073741824, 'GiB'))
    """
    return (GIB, "GiB") if largest >= GIB else (MIB, "MiB")


def gib(nbytes: float, decimals: int | None = 2, unit: bool = True) -> str:
    """`nbytes` in GiB (2**30 bytes); `unit=False` leaves off " GiB" (a table cell, "x of y GiB").

    >>> gib(3 * 2**29), gib(40 * 2**30, None), gib(2**30, 3, unit=False)
    ('1.50 GiB', '40 GiB', '1.000')
    """
    return _number(nbytes / GIB, decimals) + (" GiB" if unit else "")


def mib(nbytes: float, decimals: int | None = 0, signed: bool = False, unit: bool = True) -> str:
    """`nbytes` in MiB (2**20 bytes); `signed` writes a growth's sign.

    >>> mib(3 * 2**20), mib(2**19, 2, signed=True), mib(2**21, unit=False)
    ('3 MiB', '+0.50 MiB', '2')
    """
    return _number(nbytes / MIB, decimals, signed) + (" MiB" if unit else "")


def mb(nbytes: float) -> str:
    """A data set's size in decimal megabytes, thousands separated.

    >>> mb(1_234_567_890)
    '1,234.6 MB'
    """
    return f"{nbytes / MB:,.1f} MB"


def percent(fraction: float, decimals: int = 0, signed: bool = False) -> str:
    """A fraction as a percentage, "%" attached (Python's `%` format).

    >>> percent(0.1), percent(0.0451, 1), percent(-0.25, signed=True)
    ('10%', '4.5%', '-25%')
    """
    return format(fraction, ("+" if signed else "") + f".{decimals}%")


def tflop_per_s(flops_per_s: float, decimals: int | None = None, significant: int | None = None) -> str:
    """A rate in TFLOP/s: `decimals` places, `significant` digits, or (neither) its shortest form.

    >>> tflop_per_s(312e12), tflop_per_s(989.5e12, 0), tflop_per_s(19.5e12 / 3, significant=4)
    ('312 TFLOP/s', '990 TFLOP/s', '6.5 TFLOP/s')
    """
    value = flops_per_s / TFLOP
    text = format(value, f".{significant}g") if significant is not None else _number(value, decimals)
    return f"{text} TFLOP/s"


def gflop(flops: float, decimals: int = 1) -> str:
    """A count in GFLOP.

    >>> gflop(24.6e9)
    '24.6 GFLOP'
    """
    return f"{flops / GFLOP:.{decimals}f} GFLOP"


def plural(count: int, noun: str) -> str:
    """`count` and `noun`, with an s unless the count is one.

    >>> plural(1, "GPU"), plural(8, "GPU"), plural(0, "option")
    ('1 GPU', '8 GPUs', '0 options')
    """
    return f"{count:,} {noun}{'' if count == 1 else 's'}"
