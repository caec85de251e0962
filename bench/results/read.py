"""The one reader of runs files: every row checked against the schema, then typed rows as a DataFrame.

Every command reads runs files here (and the other results tables: `read_table`), and nothing here writes. A
row is checked field by field against `bench.results.schema.COLUMNS` (or the schema a caller passes): the number
of fields, the cell id's form, the status, whole numbers, numbers, true/false and JSON. A file that fails is
one `ResultsFileError` naming the file, the line and the column. A last line without its newline
(an append cut short by a kill or a full disk) is left out and reported; only `bench run` repairs it
(`bench.results.store.RunsFile.repair_torn_tail`).

A file is only ever appended to: a cell measured again has a later row, and the later row is the
cell's (the earlier stays in the file, as measured).

Types come from the schema: whole numbers as nullable integers, true/false as nullable booleans,
numbers as floats, text and JSON as text. One rule for missing values: an empty field is missing
(NA) in a number or boolean column and the empty string in a text column; no other text is missing,
so values such as `none` or `null` stay values.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bench.errors import ResultsFileError
from bench.grid.cell import CELL_ID_MAX_CHARS, extra_axis_defaults
from bench.results.derived import derive
from bench.results.schema import (COLUMNS, REQUIRED_COLUMNS, SCHEMAS, STATUSES, Column, RowSchema, Status,
                                  schema_for_header)

_PANDAS_TYPES = {"int": "Int64", "float": "float64", "bool": "boolean", "str": "str", "json": "str"}
CELL_ID_PATTERN = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9_.+-]{{0,{CELL_ID_MAX_CHARS - 1}}}$")
"""What a cell id looks like: `resnet50-32px-16x1-fp32-ckpt_off-adamw-cl-3474e652`."""
_BOOLS = {"true": True, "false": False, "True": True, "False": False}
MAX_RUNS_FILE_BYTES = 128 * 2**20
"""Largest runs file read: a file past it is refused before it is read, so a reader's time and memory stay bounded
(a grid of at most 10,000 cells at about 4 KiB a row makes some 40 MiB)."""


@dataclass(frozen=True)
class RunsText:
    """A runs file as text: its header, its checked rows (new columns filled in), its torn tail."""

    header: list[str]
    rows: list[dict[str, str]]
    torn_tail: bytes
    """Bytes after the last newline: an interrupted append, not read as a row."""


def read_text(path: Path, columns: dict[str, Column] = COLUMNS, *, every_row: bool = False,
              key: tuple[str, ...] | None = None) -> RunsText:
    """The file's rows as the text it holds, each checked against `columns`; never modifies the file. A cell measured
    again has its last row only, unless `every_row` (each measurement, in the order they were appended). `key`: the
    columns that name a row (default: the cell id, and the GPU in a predictions file).

    A file written by an earlier version (its columns a subset of today's) reads with the new
    columns filled in: axes added later at their default (that is what ran), others empty.
    """
    path = Path(path)
    try:
        size = path.stat().st_size if path.exists() else 0
        if size > MAX_RUNS_FILE_BYTES:
            raise ResultsFileError(f"{path}: {size / 2**20:,.0f} MiB is more than a runs file holds (at most "
                                   f"{MAX_RUNS_FILE_BYTES // 2**20} MiB; the largest grid, 10,000 cells at about "
                                   "4 KiB a row, makes some 40 MiB); move it aside")
        data = path.read_bytes() if path.exists() else b""
    except OSError as exc:
        raise ResultsFileError(f"{path}: cannot be read as a runs file ({exc.strerror or exc})") from None
    cut = data.rfind(b"\n") + 1
    if b"\r" in data[cut:]:  # not an append cut short: lines ended by CR alone, which setting aside would take whole
        line = data[:cut].count(b"\n") + 1
        raise ResultsFileError(f"{path}: line {line}: lines end with a carriage return alone "
                               "(CR, classic Mac OS line endings); a runs file's lines end with LF or CRLF: convert "
                               "them (e.g. tr '\\r' '\\n'); the file is left as it is")
    try:
        text = data[:cut].decode("utf-8-sig")  # a BOM (a spreadsheet's "CSV UTF-8") is not part of the header
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ResultsFileError(f"{path}: line {line}: not UTF-8 text; {set_aside_hint(path)}") from None
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader, [])
        repeated = next((name for index, name in enumerate(header) if name in header[:index]), None)
        if repeated is not None:  # rows would keep one of its fields and drop the other
            first = header.index(repeated)
            raise ResultsFileError(f"{path}: column {repeated!r} appears twice in the header (fields {first + 1} "
                                   f"and {header.index(repeated, first + 1) + 1}); each column once: fix the header "
                                   "or move the file aside")
        unknown = [name for name in header if name not in columns]
        if unknown:
            raise ResultsFileError(f"{path}: column {unknown[0]!r} is not in this version's schema; "
                                   "move the file aside to start afresh")
        filler = {name: cell_text(extra_axis_defaults().get(name)) for name in columns if name not in header}
        if key is None:  # a predictions file: a row per cell and GPU
            key = tuple(name for name in ("cell_id", "gpu") if name in header)
        seen: dict[tuple[str, ...], dict[str, str]] = {}
        every: list[dict[str, str]] = []
        for fields in reader:
            if not fields:  # a blank line holds nothing
                continue
            if len(fields) != len(header):
                raise ResultsFileError(f"{path}: line {reader.line_num}: {len(fields)} fields where the header has "
                                       f"{len(header)}; {set_aside_hint(path)}")
            row = dict(zip(header, fields))
            check_row(row, columns, path, reader.line_num)
            name = tuple(row.get(column, "") for column in key)
            # A cell measured again (--force, --retry-failed) is appended: its last row stands, where the last is.
            seen.pop(name, None)
            seen[name] = {**filler, **row}
            every.append(seen[name])
        rows = every if every_row else list(seen.values())
    except csv.Error as exc:
        raise ResultsFileError(f"{path}: line {reader.line_num}: not valid CSV ({exc}); "
                               f"{set_aside_hint(path)}") from None
    return RunsText(header, rows, data[cut:])


def file_schema(path: Path) -> RowSchema:
    """The kind of rows the runs file at `path` holds, told by its header (`schema_for_header`), never by the folder
    it lies in; the runner's for a file that is missing or whose first line cannot be read (its reader says why)."""
    try:
        with Path(path).open("rb") as handle:
            first = handle.readline(MAX_HEADER_BYTES).decode("utf-8-sig")
        header = next(csv.reader([first]), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        header = []
    return schema_for_header(header)


MAX_HEADER_BYTES = 64 * 2**10
"""More than any schema's header (a few KiB): a first line longer than this is no header."""


def set_aside_hint(path: Path) -> str:
    """What to do with a bad line of the file at `path`: set it aside in a side file named after the file."""
    return f"move that line into a side file (e.g. {Path(path).name}.bad) to keep the other rows"


def check_row(row: dict[str, str], columns: dict[str, Column], path: Path, line: int) -> None:
    """Raise a `ResultsFileError` at the first field of `row` (line `line` of `path`) that its column's type does not
    allow.

    >>> check_row({"cell_id": "a-1", "status": "ok", "micro_batch": "8"}, COLUMNS, Path("runs.csv"), 2)
    >>> check_row({"cell_id": "a-1", "status": "estimated"}, COLUMNS, Path("runs.csv"), 2)
    Traceback (most recent call last):
    ...
    bench.errors.ResultsFileError: runs.csv: line 2, column status: 'estimated' is not one of ok, oom, error, \
skipped, timeout; move that line into a side file (e.g. runs.csv.bad) to keep the other rows
    """
    statuses = statuses_of(columns)
    for name, value in row.items():
        column = columns.get(name)  # a column given without a type (a caller's own list of names) is text
        problem = _field_problem(name, value, column if isinstance(column, Column) else Column("str"), statuses)
        if problem:
            shown = value if len(value) <= 60 else value[:57] + "..."
            raise ResultsFileError(f"{path}: line {line}, column {name}: {shown!r} is not {problem}; "
                                   f"{set_aside_hint(path)}")


def statuses_of(columns: dict[str, Column]) -> tuple[Status, ...]:
    """The statuses a row read with `columns` may have: those of the kind (`SCHEMAS`) whose schema `columns` is (a
    measured row is never `estimated`, a computed one never `ok`), every status for a caller's own column set.

    >>> statuses_of(COLUMNS), statuses_of(SCHEMAS["estimated"].columns)
    (('ok', 'oom', 'error', 'skipped', 'timeout'), ('estimated', 'oom', 'error', 'skipped'))
    """
    return next((schema.statuses for schema in SCHEMAS.values() if schema.columns == columns), STATUSES)


def _field_problem(name: str, value: str, column: Column, statuses: tuple[Status, ...]) -> str | None:
    """What `value` should have been, or None when it is fine (`statuses`: those a row of its kind may have)."""
    kind = column.type
    if "\x00" in value:  # no writer puts a NUL byte in a field: a damaged file
        return "text (it holds a NUL byte)"
    if name == "cell_id":
        return None if CELL_ID_PATTERN.match(value) else "a cell id (letters, digits, _ . + -)"
    if name == "status":
        return None if value in statuses else f"one of {', '.join(statuses)}"
    if value == "" or kind == "str":
        return None
    if kind == "bool":
        return None if value in _BOOLS else "true/false"
    if kind == "json":
        try:
            json.loads(value)
        except ValueError:
            return "JSON"
        return None
    try:
        number = float(value)
    except ValueError:
        return "a whole number" if kind == "int" else "a number"
    if not math.isfinite(number) and not column.overflow:  # inf, nan, 1e400: no configuration is one, nor a
        return "a finite number" if kind == "float" else _whole_number(column)  # measurement but an overflow
    if kind == "int" and not (number == round(number) and column.minimum <= number <= column.maximum):
        return _whole_number(column)
    return None


def _whole_number(column: Column) -> str:
    """A whole-number column's allowed values, in words: `a whole number from 1 to 65,536`."""
    return f"a whole number from {column.minimum:,} to {column.maximum:,}"


def read_runs(path: Path, columns: dict[str, Column] = COLUMNS, *, every_row: bool = False) -> pd.DataFrame:
    """The rows of a runs file, one column per schema column, typed (an empty frame if there is no file): a cell's
    last row, or with `every_row` each of its measurements (`read_text`).

    Example:
        >>> rows = read_runs(Path("results/resnet50/cpu-amd-epyc-f25m17-avx512bf16-2c/runs.csv"))
        >>> rows.micro_batch.dtype, rows.git_dirty.dtype, rows.zero_grad.iloc[0]
        (Int64Dtype(), BooleanDtype, 'none')
    """
    path = Path(path)
    text = read_text(path, columns, every_row=every_row)
    missing = [name for name in REQUIRED_COLUMNS if name in columns and path.exists() and name not in text.header]
    if missing:
        raise ResultsFileError(f"{path}: missing columns {', '.join(missing)}; a runs.csv written by `bench run` "
                               "has them")
    if text.torn_tail:
        print(f"note: {path}: the last line is incomplete ({len(text.torn_tail)} bytes, an interrupted write); "
              "left out here, the next `bench run` sets it aside", file=sys.stderr)
    frame = typed(text.rows, columns)
    # The figures that depend on other rows, from the rows as read (bench.results.derived), whatever the file holds.
    return derive(frame) if columns is COLUMNS else frame


def read_table(path: Path, columns: dict[str, Column]) -> pd.DataFrame:
    """A results table that is not a runs file (the estimator's validation sides and parameter counts), every line
    checked and typed as a runs file's are (`read_text`, `typed`): each row as written, in order, none replacing
    another; an empty frame where there is no file."""
    return typed(read_text(path, columns, every_row=True).rows, columns)


EQUIVALENCE_COUNTS = ("accum_steps", "bn_updates_large_batch", "bn_updates_accumulated")
"""The equivalence table's whole-number columns that may be empty (a variant without K)."""


def read_equivalence(path: Path) -> pd.DataFrame:
    """The equivalence study's table (`equivalence.csv`, written by `bench equivalence`): an empty field is missing,
    any other text is kept as written, and the counts are whole numbers."""
    frame = pd.read_csv(path, keep_default_na=False, na_values=[""])
    return frame.astype({name: "Int64" for name in EQUIVALENCE_COUNTS if name in frame})


def typed(rows: list[dict[str, str]], columns: dict[str, Column]) -> pd.DataFrame:
    """Rows of text (already checked by `check_row`; a missing or empty field is empty) as a frame of the schema's
    types. Column by column from plain lists: a runs file has some 130 columns and few rows, so pandas' per-column
    conversions (`where`, `to_numeric`, `astype`) cost 4x this (55 ms a file of any length, what every read paid).

    >>> from bench.results.schema import Column
    >>> frame = typed([{"n": "3", "x": "", "ok": "true"}, {"n": "", "x": "1e400", "ok": ""}],
    ...               {"n": Column("int"), "x": Column("float"), "ok": Column("bool")})
    >>> frame.n.tolist(), frame.x.tolist(), frame.ok.tolist()
    ([3, <NA>], [nan, inf], [True, <NA>])
    """
    converted = {}
    for name, column in columns.items():
        texts = [row.get(name) or "" for row in rows]
        if column.type in ("str", "json"):
            converted[name] = pd.Series(texts, dtype="str")
        elif column.type == "bool":
            converted[name] = pd.array([_BOOLS.get(text) for text in texts], dtype="boolean")
        else:
            numbers = pd.array([float(text) if text else math.nan for text in texts], dtype="float64")
            converted[name] = numbers.astype(_PANDAS_TYPES[column.type])
    return pd.DataFrame(converted, index=pd.RangeIndex(len(rows)))


def records(rows: pd.DataFrame) -> list[dict]:
    """Each row as a dict of plain values, None where the field is empty.

    >>> records(pd.DataFrame({"a": pd.array([1, None], dtype="Int64")}))
    [{'a': 1}, {'a': None}]
    """
    return rows.astype(object).where(rows.notna(), None).to_dict("records")


def cell_text(value: object) -> str:
    """How a value is written in a runs file: empty for None, true/false for booleans."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
