"""A model the fake-tensor trace cannot run: one line naming the op, where the model calls it and what to try.

Fake tensors have shapes but no values, so an op whose output shape depends on values (`x[x > 0]`,
`nonzero`), a read of a value (`.item()`, `if tensor:`), an op without a fake kernel, or an attention
call restricted to kernels that refuse its arguments (`sdpa_kernel(...)`: "No available kernel")
cannot be traced. These are the estimator's limits, not the model's: the answer is to measure.
"""

from __future__ import annotations

import contextlib
import traceback
from pathlib import Path
from typing import Iterator

import torch
from torch._subclasses import fake_tensor

from bench.errors import ModelRefused

_WHY = {
    fake_tensor.DynamicOutputShapeException: "its output's shape depends on tensor values, which fake tensors "
                                             "do not have",
    fake_tensor.DataDependentOutputException: "it reads a tensor's value (.item(), `if tensor:`), which fake "
                                              "tensors do not have",
    fake_tensor.UnsupportedOperatorException: "fake tensors have no kernel for it",
}
_MEASURE = "measure it instead of estimating (bench probe --device cuda on a GPU)"
_NO_KERNEL = "No available kernel"
_LIBRARIES = (*(str(Path(module.__file__).parent) for module in (torch, contextlib)), str(Path(__file__).parents[1]))


@contextlib.contextmanager
def named_untraceable_op(model: str) -> Iterator[None]:
    """Within: a fake-tensor limit becomes one `ModelRefused` line naming the op, the model's line that
    called it and what to try; other errors pass unchanged (a model refusing its input says so itself).

    >>> with named_untraceable_op("mine.py:build"):
    ...     with fake_tensor.FakeTensorMode():
    ...         x = torch.empty(4)
    ...         y = x[x > 0]
    Traceback (most recent call last):
    ...
    bench.errors.ModelRefused: mine.py:build: the estimator cannot trace aten.nonzero.default (at <doctest ...
    """
    try:
        yield
    except tuple(_WHY) as exc:
        raise ModelRefused(f"{model}: the estimator cannot trace {exc.func}{_called_at(exc)}: "
                           f"{_WHY[type(exc)]}; {_MEASURE}") from None
    except RuntimeError as exc:
        if not str(exc).startswith(_NO_KERNEL):
            raise
        raise ModelRefused(f"{model}: the estimator cannot trace aten.scaled_dot_product_attention{_called_at(exc)}: "
                           "the attention kernels allowed there (torch.nn.attention.sdpa_kernel) refuse its "
                           f"arguments on CPU; allow the math kernel there, or {_MEASURE}") from None


def _called_at(exc: BaseException) -> str:
    """" (at file:line in function)" for the innermost frame outside torch and bench: the model's own code."""
    frames = [frame for frame in traceback.extract_tb(exc.__traceback__) if not frame.filename.startswith(_LIBRARIES)]
    if not frames:
        return ""
    frame = frames[-1]
    return f" (at {Path(frame.filename).name}:{frame.lineno} in {frame.name})"
