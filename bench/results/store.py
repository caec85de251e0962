"""The runs file: one CSV row per cell, written the moment the cell ends, and the results folder around it.

Rows are appended with a single write and fsync, so killing a grid loses nothing finished;
a measured row that replaces an earlier one for the same cell (`--force`, `--retry-failed`) is
appended too, and every reader takes a cell's last row, so a measurement once written is never
overwritten. A runs file is written whole (through a temporary file of this process's own and an
atomic rename) only when it is created; files of computed rows (estimates, predictions, recomputed
whole each time) replace a row in place. Every write
checks its result: a short write, a full or read-only disk or a permission error puts the file
back as it was and raises `RowNotWritten`, which carries the row so the runner can print it.

A file written by an earlier version, whose columns are a subset of today's, is read with
the new columns filled in (`bench.results.read.read_text`). Its header has no place for today's
columns, so before the first new row `bench run` writes it once under today's header
(`RunsFile.upgrade_older_header`): every line as the reader gives it, through a temporary file and
an atomic rename, so a kill or a full disk leaves the old file or the new one, never half of one.
That is the only rewrite a runs file gets.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import re
import sys
import tempfile
from pathlib import Path

from bench.errors import ResultsFileError
from bench.results.provenance import utc_now
from bench.results.read import cell_text, read_text
from bench.results.schema import COLUMNS, Column

ESTIMATE_FOLDER = "estimate"
"""`<root>/<grid>/estimate/`: the fake-tensor estimator's rows for a grid (`bench estimate`, the claims' autotune)."""
PREDICTED_FOLDER = "predicted"
"""`<root>/<grid>/predicted/`: the throughput model's rows for a grid (`bench predict`)."""
PEAKS_FOLDER = "peaks"
"""`<root>/peaks/<device-tag>/peaks.csv`: a CPU's measured matmul peaks, one file per device (`bench.results.peaks`)."""
EQUIVALENCE_FOLDER = "equivalence"
"""`<root>/equivalence/<cpu|cuda>/`: the equivalence study's files (`bench equivalence --study`)."""
EQUIVALENCE_CSV = "equivalence.csv"
"""The equivalence study's table, in its folder in place of a runs file (`bench equivalence`)."""

FOLDER_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$")
"""A name that becomes a folder under the results root: no `.` or `..`, no separator, at most 100 characters."""


class RowNotWritten(ResultsFileError):
    """A row could not be written; `row_text` is the row (with its header) as CSV, to print instead."""

    def __init__(self, path: Path, cause: OSError, row_text: str) -> None:
        super().__init__(f"{path}: the row could not be written ({cause.strerror or cause}); the file is as "
                         "before and the row is printed below so the measurement is not lost; free space or fix "
                         "permissions, then rerun")
        self.row_text = row_text


def results_folder(root: Path, *names: str) -> Path:
    """`root/<names...>`, each name a safe folder name, the result checked to lie inside `root`.

    >>> results_folder(Path("results"), "smoke", "cpu-x")
    PosixPath('results/smoke/cpu-x')
    >>> results_folder(Path("results"), "..", "cpu-x")
    Traceback (most recent call last):
    ...
    bench.errors.ResultsFileError: results: folder name '..' is not allowed; names are letters, digits, _ and - \
(at most 100, not starting with - or _)
    """
    for name in names:
        if not FOLDER_NAME_PATTERN.match(name):
            raise ResultsFileError(f"{root}: folder name {name!r} is not allowed; names are letters, digits, _ and - "
                                   "(at most 100, not starting with - or _)")
    folder = Path(root).joinpath(*names)
    if not folder.resolve().is_relative_to(Path(root).resolve()):
        raise ResultsFileError(f"{folder}: resolves outside the results root {root}")
    return folder


def preflight(folder: Path, what: str = "rows", unwritten: str = "nothing was measured", *,
              keep_folder: bool = True) -> None:
    """Make `folder` and write, sync and remove a probe file there: a folder that cannot take `what` (read-only,
    no permission, a file where a folder should be, a full disk) fails here with one `ResultsFileError` line,
    before the command computes or writes anything (`unwritten` says what was spared). `keep_folder=False`
    removes again the folders this call made, for a command that may still refuse before it writes.

    Every command that writes calls it on its output folder first: `run` and `measure` (rows), `estimate`,
    `predict`, `report`, `cost`, `claims`, `catalog import --out`, `plan --launch-spec`."""
    probe = Path(folder) / f".preflight-{os.getpid()}"
    made = [parent for parent in [Path(folder), *Path(folder).parents] if not parent.exists()]
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, b"bench preflight: this folder takes rows\n" * 100)
            os.fsync(fd)
        finally:
            os.close(fd)
            probe.unlink(missing_ok=True)
            for parent in made if not keep_folder else []:  # innermost first
                parent.rmdir()
    except OSError as exc:
        raise ResultsFileError(f"{folder}: cannot take {what} ({exc.strerror or exc}); {unwritten}") from None


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of `data` or raise `OSError`: `os.write` may write less than asked."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(28, "no space left on device (a write wrote nothing)")
        view = view[written:]


class RunsFile:
    """`results/<experiment>/<device-tag>/runs.csv` (or another results table: a CPU's stored peaks); `columns` is
    the schema (default: the runner's).

    `key`: the columns that name a row (a row with the same values replaces it): the cell id, or
    the cell id and the GPU in a predictions file (one row per cell and GPU).
    `history`: a replacing row is appended (readers take a key's last row), so a measurement is never
    overwritten; the default for the runner's schema. Files of computed rows (estimates, predictions,
    recomputed whole each time) default to replacing in place, so they do not grow with every rerun.
    """

    def __init__(self, path: Path, columns: dict[str, Column] = COLUMNS, key: tuple[str, ...] = ("cell_id",),
                 history: bool | None = None) -> None:
        self.path = Path(path)
        self.schema = columns
        self.columns = list(columns)
        self.key = key
        self.history = columns is COLUMNS if history is None else history

    def rows(self) -> list[dict[str, str]]:
        """Each key's last row as the text the file holds, checked, columns of a newer schema filled in.

        This is the writer's view (it rewrites rows byte for byte); analysis reads typed rows
        through `bench.results.read.read_runs`.
        """
        return read_text(self.path, self.schema, key=self.key).rows

    def cell_ids(self) -> set[str]:
        return {row["cell_id"] for row in self.rows()}

    def header(self) -> list[str]:
        """The column names on the file's first line (empty when there is no file)."""
        return read_text(self.path, self.schema, key=self.key).header

    def repair_torn_tail(self) -> str | None:
        """Cut a last line without its newline (an interrupted append) off the file, keeping its bytes
        in `runs.csv.torn-<UTC time>`; what was done, or None when the file ends cleanly."""
        torn = read_text(self.path, self.schema, key=self.key).torn_tail
        if not torn:
            return None
        side = self.path.with_name(f"{self.path.name}.torn-{utc_now().replace(':', '')}")
        try:
            with side.open("ab") as handle:
                handle.write(torn)
                handle.flush()
                os.fsync(handle.fileno())
            with self.path.open("r+b") as handle:
                handle.truncate(self.path.stat().st_size - len(torn))
                os.fsync(handle.fileno())
        except OSError as exc:
            raise ResultsFileError(f"{self.path}: the incomplete last line could not be set aside "
                                   f"({exc.strerror or exc})") from None
        return (f"{self.path}: the last line was incomplete (an interrupted write); its {len(torn)} bytes "
                f"were moved to {side.name}")

    def refuse_links(self) -> None:
        """A runs file that is a symbolic link would take appends wherever it points, outside the results folder:
        refused (`ResultsFileError`, one line) before anything is measured or written."""
        if self.path.is_symlink():
            raise ResultsFileError(f"{self.path}: a symbolic link (to {os.readlink(self.path)}); rows are written only "
                                   "to a regular runs file inside the results folder: put the file itself there")

    def upgrade_older_header(self) -> str | None:
        """A history file written by an earlier version (its columns a subset of today's) rewritten under today's
        header, every row as it was (today's new columns filled as the reader fills them: an axis at its default, a
        measurement empty), so the rows about to be appended fit. What was done, or None. Call it after
        `repair_torn_tail`: a torn line is set aside, not rewritten. Computed files are recomputed whole anyway."""
        if not self.history or not self.path.exists():
            return None
        header = self.header()
        if not header or header == self.columns:
            return None
        added = [name for name in self.columns if name not in header]
        try:  # every row, a cell's earlier measurements too
            self._rewrite(read_text(self.path, self.schema, key=self.key, every_row=True).rows)
        except OSError as exc:
            raise ResultsFileError(f"{self.path}: written by an earlier version of bench; its rows could not be "
                                   f"rewritten under today's columns ({exc.strerror or exc}), the file is as it was"
                                   ) from None
        return (f"{self.path}: written by an earlier version of bench; rewritten under today's header, its rows as "
                f"they were ({len(added)} columns added, e.g. {added[0]})")

    def write(self, row: dict) -> None:
        """Append `row`; a row of a key already there replaces it, appended (`history`: every reader takes a key's
        last row) or in place. `RowNotWritten` if the disk refuses. A file of an earlier version's header is written
        whole under today's, the row with it (`upgrade_older_header`)."""
        unknown = set(row) - set(self.columns)
        if unknown:
            raise ValueError(f"row has undeclared columns: {sorted(unknown)}")
        self.refuse_links()
        note = self.repair_torn_tail()
        if note:
            print(note, file=sys.stderr)
        current = read_text(self.path, self.schema, key=self.key, every_row=self.history)
        existing = current.rows  # a history file's every row: one of an earlier header is rewritten with them all
        name = tuple(cell_text(row.get(column)) for column in self.key)
        try:
            if not self.history and any(tuple(old[column] for column in self.key) == name for old in existing):
                self._rewrite([old for old in existing if tuple(old[column] for column in self.key) != name] + [row])
            elif not self.path.exists() or current.header != self.columns:
                self._rewrite(existing + [row])  # a new file, or one of an earlier version's header
            else:  # a cell's new row, or its replacement: appended (the reader takes a cell's last row)
                self._append(_csv_text([row], self.columns))
        except OSError as exc:
            raise RowNotWritten(self.path, exc, _csv_text([row], self.columns, header=True)) from None

    def _append(self, text: str) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            size = os.fstat(fd).st_size
            try:
                write_all(fd, text.encode())
                os.fsync(fd)
            except OSError:
                with contextlib.suppress(OSError):  # leave no torn line behind
                    os.ftruncate(fd, size)
                raise
        finally:
            os.close(fd)

    def _rewrite(self, rows: list[dict]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # A temporary file of this process's own: two writers never share one name.
        fd, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        try:
            try:
                write_all(fd, _csv_text(rows, self.columns, header=True).encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.chmod(temporary, 0o644)
            os.replace(temporary, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise


def _csv_text(rows: list[dict], columns: list[str], header: bool = False) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    if header:
        writer.writeheader()
    for row in rows:
        writer.writerow({key: cell_text(row.get(key)) for key in columns})
    return buffer.getvalue()
