"""What a failure was: out-of-memory or another error, and its message in one line."""

from __future__ import annotations

import torch


def is_out_of_memory(exc: BaseException) -> bool:
    """Out-of-memory by exception type first, then by the CPU allocator's message.

    >>> is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory")), is_out_of_memory(ValueError("x"))
    (True, False)
    """
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text)


def first_line(exc: BaseException) -> str:
    """The exception's message, first line only (at most 500 characters).

    >>> first_line(RuntimeError("boom\\nstack details"))
    'boom'
    """
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else repr(exc))[:500]
