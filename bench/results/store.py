"""The runs file: one CSV row per cell, written the moment the cell ends.

Rows are appended with a single write and fsync, so killing a grid loses nothing finished;
a row that replaces an earlier one for the same cell (`--force`, `--retry-failed`) rewrites
the file through a temporary file and an atomic rename.

A file written by an earlier version, whose columns are a subset of today's, is read with
the new columns filled in (axes added later at their default, since that is what ran; other
columns empty: not measured then) and rewritten with today's header on the next write.
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path

from bench.errors import ResultsFileError
from bench.grid.cell import extra_axis_defaults
from bench.results.schema import COLUMNS, Column


class RunsFile:
    """`results/<experiment>/<device-tag>/runs.csv`; `columns` is the schema (default: the runner's).

    `key`: the columns that name a row (a row with the same values replaces it): the cell id, or
    the cell id and the GPU in a predictions file (one row per cell and GPU).
    """

    def __init__(self, path: Path, columns: dict[str, Column] = COLUMNS, key: tuple[str, ...] = ("cell_id",)) -> None:
        self.path = Path(path)
        self.columns = list(columns)
        self.key = key

    def rows(self) -> list[dict[str, str]]:
        """Every row as the text the file holds, columns of a newer schema filled in.

        This is the writer's view (it rewrites rows byte for byte); analysis reads typed rows
        through `bench.results.read.read_runs`.
        """
        if not self.path.exists():
            return []
        self._drop_torn_last_line()
        with self.path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            header = reader.fieldnames or []
            unknown = [name for name in header if name not in self.columns]
            if unknown:
                raise ResultsFileError(
                    f"{self.path}: column {unknown[0]!r} is not in this version's schema; "
                    "move the file aside to start afresh"
                )
            filler = {name: _cell_text(extra_axis_defaults().get(name)) for name in self.columns
                      if name not in header}
            return [{**filler, **row} for row in reader]

    def cell_ids(self) -> set[str]:
        return {row["cell_id"] for row in self.rows()}

    def write(self, row: dict) -> None:
        """Append `row`, or replace the earlier row of the same cell."""
        unknown = set(row) - set(self.columns)
        if unknown:
            raise ValueError(f"row has undeclared columns: {sorted(unknown)}")
        existing = self.rows()
        name = tuple(_cell_text(row.get(column)) for column in self.key)
        if any(tuple(old[column] for column in self.key) == name for old in existing):
            kept = [old for old in existing if tuple(old[column] for column in self.key) != name]
            self._rewrite(kept + [row])
        elif not self.path.exists() or self._header() != self.columns:
            self._rewrite(existing + [row])
        else:
            self._append(_csv_text([row], self.columns))

    def header(self) -> list[str]:
        """The column names on the file's first line (empty when there is no file)."""
        if not self.path.exists():
            return []
        return self._header()

    def _header(self) -> list[str]:
        with self.path.open(newline="") as handle:
            return next(csv.reader(handle), [])

    def _append(self, text: str) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def _rewrite(self, rows: list[dict]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".csv.tmp")
        with temporary.open("w", newline="") as handle:
            handle.write(_csv_text(rows, self.columns, header=True))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)

    def _drop_torn_last_line(self) -> None:
        # A kill in the middle of an append can leave a line without its newline.
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            with self.path.open("r+b") as handle:
                handle.truncate(data.rfind(b"\n") + 1)


def _csv_text(rows: list[dict], columns: list[str], header: bool = False) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    if header:
        writer.writeheader()
    for row in rows:
        writer.writerow({key: _cell_text(row.get(key)) for key in columns})
    return buffer.getvalue()


def _cell_text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
