"""Bad input: one family of exceptions, turned into one line and exit code 2 in one place (`bench.cli`).

Every message is one line that names where the problem is (the file and key, or the command-line
option) and what is allowed. Failures that are not the user's input (a cell that crashes, a device
that runs out of memory) are rows, never these.
"""

from __future__ import annotations


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


class ModelRefError(BadInput):
    """A model reference (a timm name, hf-hub:, a module path or a file) cannot be resolved, or its model cannot
    train on the input asked for."""


class MissingExtra(BadInput):
    """An optional dependency a command needs is not installed; the message names the extra to install.

    >>> str(MissingExtra.of("submitit", "slurm", "--executor slurm"))
    "--executor slurm needs submitit, which is not installed: pip install 'bench[slurm]'"
    """

    @classmethod
    def of(cls, module: str, extra: str, needed_by: str) -> MissingExtra:
        return cls(f"{needed_by} needs {module}, which is not installed: pip install 'bench[{extra}]'")
