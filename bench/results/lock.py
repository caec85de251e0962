"""One runner per results folder: an advisory lock (`fcntl.flock`) on `<results>/.bench-run.lock`, which
exists only while a runner holds it (it is removed on exit, so nothing is left to commit by mistake).

Two runners on one folder would measure on the same cores (each contaminating the other's
timings) and race on the runs files. The lock file names its holder (pid, host, start time), so a
second runner can say who holds it. The kernel drops a lock when its process dies, however it
dies: a lock file left by a dead runner is simply taken over (and said so).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
from pathlib import Path
from typing import Iterator

from bench.errors import ResultsFileError
from bench.results.provenance import utc_now
from bench.results.store import write_all

LOCK_NAME = ".bench-run.lock"
_HELD: set[str] = set()
"""The lock files this process holds (their real paths)."""


class FolderLocked(ResultsFileError):
    """Another runner holds the results folder's lock."""


@contextlib.contextmanager
def runner_lock(root: Path, *, wait: bool = False, within: bool = False) -> Iterator[None]:
    """Hold the results root's lock for the block; `FolderLocked` naming the holder when another runner
    has it, unless `wait` (then block until it is free). The lock file is removed when the block ends,
    so a committed results folder is left as it was.

    `within`: a block inside a runner that may already hold it (`run_grid`, inside `bench run`'s lock over all
    its grids): when this process holds it, the block neither locks nor removes; otherwise it locks as
    above, so the library's callers are locked too. Without `within`, every holder counts as another."""
    path = Path(root) / LOCK_NAME
    held = os.path.realpath(path)
    if within and held in _HELD:
        yield
        return
    while True:
        fd = _open(root, path)
        try:
            previous = _holder(fd)
            _lock(fd, root, previous, wait)
        except BaseException:
            os.close(fd)
            raise
        if _same_file(fd, path):
            break
        os.close(fd)  # its holder removed the file before we locked it: lock the one there now
    try:
        if previous.get("pid") and not _alive(previous["pid"], previous.get("host")):
            print(f"note: {path}: taking over the lock of a runner that is gone ({_describe(previous)})",
                  file=sys.stderr)
        _claim(fd)
        _HELD.add(held)
        yield
    finally:
        _HELD.discard(held)
        with contextlib.suppress(OSError):
            path.unlink()  # while still locked: a runner waiting on this file sees it gone and retries
        os.close(fd)  # closing releases the lock


def _open(root: Path, path: Path) -> int:
    try:
        Path(root).mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ResultsFileError(f"{root}: cannot be used as the results folder ({exc.strerror or exc})") from None


def _lock(fd: int, root: Path, previous: dict, wait: bool) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        if not wait:
            raise FolderLocked(f"{root}: another `bench run` is using this results folder ({_describe(previous)}); "
                               "wait for it, pass --wait to queue behind it, or use another --results") from None
        print(f"waiting for the runner using {root} ({_describe(previous)})", file=sys.stderr)
        fcntl.flock(fd, fcntl.LOCK_EX)


def _same_file(fd: int, path: Path) -> bool:
    """Whether `path` still names the file `fd` locked (a finished runner removes it)."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _holder(fd: int) -> dict:
    """What the lock file says about its last holder (empty when nothing readable)."""
    try:
        text = os.pread(fd, 4096, 0).decode()
        holder = json.loads(text) if text.strip() else {}
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _claim(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    write_all(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started_utc": utc_now()}).encode())
    os.fsync(fd)


def _describe(holder: dict) -> str:
    if not holder:
        return "holder unknown"
    return f"pid {holder.get('pid')} on {holder.get('host')}, since {holder.get('started_utc')}"


def _alive(pid: int, host: str | None) -> bool:
    if host is not None and host != socket.gethostname():
        return True  # cannot tell from here
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, OverflowError):
        return True
    return True
