"""Where a result came from, named the same in every file the harness writes.

Every writer (runs files, estimates, the equivalence study, the claims' autotune rows, the overhead
benchmark, the device peaks) stamps its rows with `provenance()` and, for when it started,
`utc_now()`: `git_commit`, `git_dirty`, the library versions, `started_utc`; a runner's rows also carry the
`new_run_id()` of the run that measured them.
"""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import datetime, timezone
from functools import cache
from importlib import metadata
from pathlib import Path

PROVENANCE_COLUMNS = ("torch_version", "timm_version", "bitsandbytes_version", "cuda_version", "python_version",
                      "git_commit", "git_dirty")
"""The keys of `provenance()`, in the order runs files hold them."""


def provenance() -> dict[str, object]:
    """The harness commit (and whether the checkout had uncommitted changes) and the library versions.

    >>> sorted(provenance()) == sorted(PROVENANCE_COLUMNS)
    True
    """
    commit, dirty = git_state()
    return {**library_versions(), "git_commit": commit, "git_dirty": dirty}


def utc_now() -> str:
    """Now, ISO 8601 in UTC to the second: the `started_utc` of what is about to run."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_run_id() -> str:
    """A name for one run of a grid: its start (UTC, to the second) and the runner's process id, which no other
    run on the host had at that second. Every row the run writes carries it, so a cell measured again keeps both
    measurements told apart.

    >>> import re; bool(re.fullmatch(r"\\d{8}T\\d{6}Z-\\d+", new_run_id()))
    True
    """
    return f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-{os.getpid()}"


def git_state(repo: Path | None = None) -> tuple[str, bool | None]:
    """(commit, dirty) of the harness checkout; ("", None) outside a git checkout. Dirty: a tracked file differs from
    the commit, outside `results/` (measured data, not the harness: re-measuring a committed folder changes it)."""
    repo = repo or Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                                text=True, check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results"],
                                cwd=repo, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "", None
    return commit, bool(status.strip())


@cache
def library_versions() -> dict[str, str]:
    import torch  # here, not at the top: reading a runs file needs the column names, not torch

    return {
        "torch_version": torch.__version__,
        "timm_version": _version("timm"),
        "bitsandbytes_version": _version("bitsandbytes"),
        "cuda_version": torch.version.cuda or "",
        "python_version": platform.python_version(),
    }


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return ""
