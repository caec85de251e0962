"""Reports: charts and REPORT.md regenerated from a results folder's rows, nothing typed in."""

from bench.report.build import build_report

__all__ = ["build_report"]
