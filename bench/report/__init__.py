"""Reports: charts and REPORT.md regenerated from a results folder's rows, nothing typed in."""

from __future__ import annotations

from typing import Any

__all__ = ["build_report"]


def __getattr__(name: str) -> Any:
    """`build_report` imported when first asked for: the stage's light modules (the console's progress and tables)
    load without matplotlib."""
    if name == "build_report":
        from bench.report.build import build_report

        return build_report
    raise AttributeError(f"module 'bench.report' has no attribute {name!r}")
