"""The user's cache folder, and answers kept there between commands (timm's model names, traces).

An entry is one JSON file named by the digest of its key; the key holds what the answer depends on:
the inputs, the torch and timm versions, and the digest of bench's own source that computes it, so an
upgrade or an edited checkout never reads an old answer. A file that cannot be read, is not UTF-8 JSON, whose
stored key is not the one asked for, or whose value its namespace's `check` refuses (a peak of NaN, -1 or `true`,
a row of `{}`) is ignored with one warning on stderr and recomputed: never a wrong answer.
`BENCH_NO_CACHE=1` (the commands' `--no-cache`) bypasses it, reading and writing nothing.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import tempfile
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Callable, Iterable

CACHE_ENV = "BENCH_CACHE_DIR"
NO_CACHE_ENV = "BENCH_NO_CACHE"
FORMAT = 1
"""The entry file's layout; entries of another layout are ignored (a warning) and rewritten."""
ESTIMATOR_SOURCES = ("memory", "train", "measure/memory.py", "grid/cell.py", "units.py")
"""The source an estimated peak depends on: the fake step, the runner's step and models, the memory trace."""


def cache_dir() -> Path:
    """$BENCH_CACHE_DIR, else $XDG_CACHE_HOME/bench, else ~/.cache/bench."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "bench"


def enabled() -> bool:
    return os.environ.get(NO_CACHE_ENV, "") in ("", "0")


def use_cache_folder(root: str) -> None:
    """In a child process: the parent's cache folder, on (a fork server's environment is the one it started with,
    not the parent's now)."""
    os.environ[CACHE_ENV] = root
    os.environ.pop(NO_CACHE_ENV, None)


@cache
def package_versions() -> dict[str, str]:
    """torch's, timm's and bench's installed versions, read from the package metadata (nothing imported)."""
    found = {}
    for name in ("torch", "timm", "bench"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found


@cache
def source_digest(*modules: str) -> str:
    """A digest of the named bench subpackages' or modules' source files (`"memory"`, `"train/step.py"`)."""
    root = Path(__file__).parent
    digest = hashlib.sha256()
    for module in modules:
        path = root / module
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            digest.update(file.relative_to(root).as_posix().encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


class DiskCache:
    """JSON answers under `<cache_dir>/<namespace>/`, keyed by a dict of what they depend on.

    >>> names = DiskCache("example", sources=("cache.py",), root=Path(tempfile.mkdtemp()))
    >>> names.get({"model": "resnet50"}) is None
    True
    >>> names.put({"model": "resnet50"}, [1, 2]); names.get({"model": "resnet50"})
    [1, 2]
    """

    def __init__(self, namespace: str, sources: Iterable[str], root: Path | None = None,
                 check: Callable[[Any], str | None] | None = None):
        self.namespace = namespace
        self.sources = tuple(sources)
        self.root = root
        """The cache folder (None: `cache_dir()`, read when used)."""
        self.check = check
        """What is wrong with a stored value (None: nothing), so a value a caller cannot use is recomputed."""

    def _full_key(self, key: dict[str, Any]) -> dict[str, Any]:
        return {"format": FORMAT, "namespace": self.namespace, **package_versions(),
                "source": source_digest(*self.sources), **key}

    def _path(self, full_key: dict[str, Any]) -> Path:
        name = hashlib.sha256(json.dumps(full_key, sort_keys=True).encode()).hexdigest()[:32]
        return (self.root or cache_dir()) / self.namespace / f"{name}.json"

    def has(self, key: dict[str, Any]) -> bool:
        """Whether an entry for `key` exists (not read or checked: `get` may still refuse it)."""
        return enabled() and self._path(self._full_key(key)).is_file()

    def get(self, key: dict[str, Any]) -> Any | None:
        """The stored answer, or None (absent, bypassed, or unreadable: then one warning)."""
        if not enabled():
            return None
        full_key = self._full_key(key)
        path = self._path(full_key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            return _ignored(path, exc.strerror or str(exc))
        try:
            entry = json.loads(data.decode("utf-8"))
        except UnicodeDecodeError:  # a ValueError too, but a different damage
            return _ignored(path, "not UTF-8")
        except ValueError:
            return _ignored(path, "not JSON")
        if not isinstance(entry, dict) or entry.get("key") != json.loads(json.dumps(full_key)) or "value" not in entry:
            return _ignored(path, "written for another key or layout")
        problem = self.check(entry["value"]) if self.check else None
        return _ignored(path, f"its value is {problem}") if problem else entry["value"]

    def put(self, key: dict[str, Any], value: Any) -> None:
        """Store `value` (JSON-serialisable) atomically; a cache that cannot be written is skipped silently:
        the answer was computed and is returned all the same."""
        if not enabled():
            return
        full_key = self._full_key(key)
        path = self._path(full_key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as handle:
                json.dump({"key": full_key, "value": value}, handle)
            os.replace(handle.name, path)
        except OSError:
            try:
                os.unlink(handle.name)
            except (OSError, UnboundLocalError):
                pass


def _ignored(path: Path, reason: str) -> None:
    print(f"bench: warning: ignoring cache file {path} ({reason}); recomputing", file=sys.stderr)
    return None


def byte_count_problem(value: Any) -> str | None:
    """What makes `value` no count of bytes (a peak), or None: a finite number above 0, not true/false.

    >>> byte_count_problem(2.5e9), byte_count_problem(float("nan")), byte_count_problem(True)
    (None, 'not a finite number of bytes above 0: nan', 'not a finite number of bytes above 0: True')
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
        return None
    return f"not a finite number of bytes above 0: {value!r}"[:120]
