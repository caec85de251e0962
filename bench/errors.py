"""Bad input: one family of exceptions, turned into one line and exit code 2 in one place (`bench.cli`).

Every message is one line that names where the problem is (the file and key, or the command-line
option) and what is allowed. Failures that are not the user's input (a cell that crashes, a device
that runs out of memory) are rows, never these.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator


class BadInput(Exception):
    """Input the user can fix. The message is one line: where, what is wrong, what is allowed."""


class GridFileError(BadInput):
    """A grid file (TOML under `experiments/`) is invalid, or asks for what the device cannot run."""


class OptionError(BadInput):
    """A command-line option or argument is invalid; the message starts with its name."""


class ResultsFileError(BadInput):
    """A results folder or runs file cannot be used as asked."""


class CatalogError(BadInput):
    """A GPU or instance catalog file is invalid."""


class DeviceUnavailable(BadInput):
    """The device asked for is not on this machine."""


class DataDirError(BadInput):
    """A data dir (`--data-dir`) cannot be used: missing, empty, or not an ImageFolder tree."""


class MissingExtra(BadInput):
    """An optional dependency a command needs is not installed; the message names the extra to install.

    >>> str(MissingExtra.of("submitit", "slurm", "--executor slurm"))
    "--executor slurm needs submitit, which is not installed: pip install 'bench[slurm]'"
    """

    @classmethod
    def of(cls, module: str, extra: str, needed_by: str) -> MissingExtra:
        return cls(f"{needed_by} needs {module}, which is not installed: pip install 'bench[{extra}]'")


class ModelRefused(BadInput):
    """A model that cannot take the synthetic step at the input tried (a size below a ViT's patch, a
    model that is not a classifier)."""

    file = None
    key = "MODEL"


class ModelRefError(ModelRefused):
    """A model reference (a timm name, hf-hub:, a module path or a file) cannot be resolved, or its model cannot
    train on the input asked for."""


STEP_ERRORS = (RuntimeError, ValueError, TypeError, AssertionError, IndexError, KeyError, NotImplementedError)
"""What building a model or tracing its step raises when the model refuses the input (torch, timm)."""


@contextlib.contextmanager
def refused_step(model: str, tried: str) -> Iterator[None]:
    """Turn a model's refusal of the synthetic step into one `ModelRefused` line naming the model, the input
    tried and the exception, where the estimator or the throughput model traces it.

    >>> with refused_step("vit_tiny_patch16_224", "8 px, micro-batch 1"):
    ...     raise RuntimeError("Kernel size can't be greater than actual input size\\nmore")
    Traceback (most recent call last):
    ...
    bench.errors.ModelRefused: vit_tiny_patch16_224: cannot take the synthetic step on 8 px, micro-batch 1 \
(RuntimeError: Kernel size can't be greater than actual input size)
    """
    try:
        yield
    except BadInput:
        raise
    except STEP_ERRORS as exc:
        raise step_refusal(model, tried, exc) from None


def step_refusal(model: str, tried: str, exc: BaseException) -> ModelRefused:
    """The one line of `refused_step`: the model, the input tried, the exception's type and first line."""
    first = (str(exc).strip().splitlines() or [""])[0]
    first = first if len(first) <= 200 else first[:197] + "..."
    return ModelRefused(f"{model}: cannot take the synthetic step on {tried} ({type(exc).__name__}: {first})")


def shown(value: Any) -> str:
    """`value` as a refusal shows it: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
