"""What a failure was: out-of-memory or another error, and its message in one line."""

from __future__ import annotations

import torch


OUT_OF_MEMORY_MESSAGES = (
    "can't allocate memory",  # the CPU allocator
    "out of memory",
    "could not create a primitive",  # oneDNN when its allocation fails (CPU, under a memory cap)
    "unable to find an engine",  # cuDNN when no engine fits the memory left for its workspace
    "CUBLAS_STATUS_ALLOC_FAILED",  # cuBLAS failing to allocate its handle or workspace
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_NOT_ENOUGH_WORKSPACE",
)
"""Messages of out-of-memory in disguise: libraries that report a failed allocation as their own error."""


def is_out_of_memory(exc: BaseException) -> bool:
    """Out-of-memory by exception type first, then by the messages of libraries that disguise it.

    >>> is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory")), is_out_of_memory(ValueError("x"))
    (True, False)
    >>> is_out_of_memory(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"))
    True
    """
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(message in text for message in OUT_OF_MEMORY_MESSAGES)


def first_line(exc: BaseException) -> str:
    """The exception's message, first line only (at most 500 characters).

    >>> first_line(RuntimeError("boom\\nstack details"))
    'boom'
    """
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else repr(exc))[:500]
