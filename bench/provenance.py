"""Where a row came from: harness commit and library versions."""

from __future__ import annotations

import platform
import subprocess
from importlib import metadata
from pathlib import Path

import torch


def git_state(repo: Path | None = None) -> tuple[str, bool | None]:
    """(commit, dirty) of the harness checkout; ("", None) outside a git checkout."""
    repo = repo or Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                                text=True, check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                                capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "", None
    return commit, bool(status.strip())


def library_versions() -> dict[str, str]:
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
