"""Markdown tables for the reports written next to results."""

from __future__ import annotations

import pandas as pd


def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub markdown table; empty cells for missing values.

    >>> print(markdown_table(pd.DataFrame({"a": [1], "b": [None]})))
    | a | b |
    |---|---|
    | 1 |  |
    """
    def text(value: object) -> str:
        return "" if value is None or (pd.api.types.is_scalar(value) and pd.isna(value)) else str(value)
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(text(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)
