"""Result objects as tables: `to_frame()` gives a pandas DataFrame, and Jupyter shows the same table (`_repr_html_`).

A class mixes in `Tabular` and says what its rows are (`frame_rows`: plain values, units in the keys); pandas is
imported only when a frame is asked for, so `import bench` stays cheap. `write_csv` writes plain rows under a
declared header.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd


class Tabular:
    """`to_frame()` and the notebook's table, from `frame_rows()`."""

    def frame_rows(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def to_frame(self) -> pd.DataFrame:
        """One row per entry of `frame_rows()`, its keys the columns."""
        import pandas as pd

        return pd.DataFrame(self.frame_rows())

    def _repr_html_(self) -> str:
        return self.to_frame().to_html(index=False, na_rep="")


def write_csv(rows: list[dict], path: Path, columns: Sequence[str]) -> None:
    """`rows` under the header `columns` (no rows: an empty file); a row with a key not declared there raises
    ValueError and nothing is written."""
    text = io.StringIO()
    if rows:
        writer = csv.DictWriter(text, columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    path.write_text(text.getvalue())
