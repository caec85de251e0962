"""The one reader of runs files: typed rows as a DataFrame, the same for every command.

Types come from the schema (`bench.results.schema.COLUMNS`): whole numbers as nullable integers,
true/false as nullable booleans, numbers as floats, text and JSON as text. One rule for missing
values: an empty field is missing (NA) in a number or boolean column and the empty string in a
text column; no other text is missing, so values such as `none` or `null` stay values.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from bench.errors import ResultsFileError
from bench.results.schema import COLUMNS, REQUIRED_COLUMNS, Column
from bench.results.store import RunsFile

_PANDAS_TYPES = {"int": "Int64", "float": "float64", "bool": "boolean", "str": "str", "json": "str"}


def read_runs(path: Path, columns: dict[str, Column] = COLUMNS) -> pd.DataFrame:
    """The rows of a runs file, one column per schema column, typed (an empty frame if there is no file).

    Example:
        >>> rows = read_runs(Path("results/resnet50/cpu-intel-xeon-processor/runs.csv"))
        >>> rows.micro_batch.dtype, rows.git_dirty.dtype, rows.zero_grad.iloc[0]
        (Int64Dtype(), BooleanDtype, 'none')
    """
    runs = RunsFile(path, columns)
    text_rows = runs.rows()
    missing = [name for name in REQUIRED_COLUMNS if name in columns and runs.path.exists() and name not in runs.header()]
    if missing:
        raise ResultsFileError(f"{path}: missing columns {', '.join(missing)}; a runs.csv written by `bench run` "
                               "has them")
    frame = pd.DataFrame(text_rows, columns=list(columns), dtype=object).fillna("")
    return typed(frame, columns, str(path))


def typed(frame: pd.DataFrame, columns: dict[str, Column], where: str) -> pd.DataFrame:
    """`frame`'s text columns converted to the schema's types; a value that does not parse is a
    `ResultsFileError` naming the file, the line and the column."""
    converted = {}
    for name in frame.columns:
        kind = columns[name].type
        text = frame[name].astype(str)
        if kind in ("str", "json"):
            converted[name] = text.astype("str")
            continue
        missing = text == ""
        if kind == "bool":
            values = text.map({"true": True, "false": False, "True": True, "False": False})
            bad = values.isna() & ~missing
        else:
            values = pd.to_numeric(text.where(~missing), errors="coerce")
            bad = values.isna() & ~missing
            if kind == "int" and not bad.any():
                bad = (values.notna() & (values != values.round()))
        if bad.any():
            row = int(bad.to_numpy().nonzero()[0][0])
            raise ResultsFileError(f"{where}: line {row + 2}, column {name}: {text.iloc[row]!r} is not "
                                   f"{'a whole number' if kind == 'int' else 'true/false' if kind == 'bool' else 'a number'}")
        converted[name] = values.astype(_PANDAS_TYPES[kind])
    return pd.DataFrame(converted, index=frame.index)


def records(rows: pd.DataFrame) -> list[dict]:
    """Each row as a dict of plain values, None where the field is empty.

    >>> records(pd.DataFrame({"a": pd.array([1, None], dtype="Int64")}))
    [{'a': 1}, {'a': None}]
    """
    return rows.astype(object).where(rows.notna(), None).to_dict("records")
