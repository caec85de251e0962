"""`--format text|json`: the option, and an answer turned into one JSON document (schemas: docs/json.md).

In JSON mode the document is the only thing on stdout: whatever else the command, a library or a
child process writes to stdout while it works goes to stderr instead (at the file-descriptor level,
so a forked trial's prints are caught too). Every command takes the option: a command without a
document of its own answers with its text lines in one (`text_answer`). Bad input in JSON mode is one
object on stdout, `{"error", "file", "key"}` (`error_document`), and exit 2.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import io
import os
import re
import sys
from datetime import date, datetime
from pathlib import Path
from typing import Any, Callable, Iterator

SCHEMA_VERSION = 1
"""Raised when a document's keys change meaning or go away (new keys may appear without it)."""

INTERACTIVE = sys.stdout.isatty() and sys.stderr.isatty()
"""Progress bars only on a terminal: read once, before any redirection, so piped output stays quiet."""


def add_format_option(parser: argparse.ArgumentParser, *, text_only: bool = False, default: object = "text") -> None:
    """`--format`; `text_only`: the command prints text, which JSON mode wraps in a document (`text_answer`)."""
    parser.add_argument("--format", choices=("text", "json"), default=default,
                        help="text (default) or json: one JSON document on stdout and nothing else "
                             "(schema: docs/json.md)" + ("; the text answer's lines as `output`" if text_only else ""))
    if text_only:
        parser.set_defaults(text_only=True)


def wants_json(argv: list[str]) -> bool:
    """Whether the command line asks for JSON: known before parsing, so a parse error answers in JSON too.

    >>> wants_json(["catalog", "--format", "json"]), wants_json(["list", "--format=json"]), wants_json(["list"])
    (True, True, False)
    """
    return any(arg == "--format=json" or (arg == "--format" and following == "json")
               for arg, following in zip(argv, [*argv[1:], ""]))


def text_answer(command: str, handler: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a text-only command and emit what it printed as one document: `exit_code` and `output` (its lines)."""
    printed = io.StringIO()
    with answer_only(True), contextlib.redirect_stdout(printed):
        code = handler(args)
    emit(command, {"exit_code": code, "output": printed.getvalue().splitlines()})
    return code


_WHERE = re.compile(r"^(?P<first>[^:\s][^:]*?): (?:(?P<second>[\w.\[\]-]+|line \d+(?:, column [\w.-]+)?"
                    r"|row \d+(?:, column [\w.-]+)?): )?")


def error_document(exc: Exception) -> dict[str, Any]:
    """Bad input as JSON: the one-line message, and the file and key it names (None where it names none).

    An exception may say them (`file`, `key` attributes); otherwise an option's message starts with the option
    (and its value: `--catalog FILE: ...`), a file's with the file and then its key, line or row.

    >>> from bench.errors import OptionError, ResultsFileError
    >>> error_document(ResultsFileError("runs.csv: line 3, column status: 'x' is not ok"))
    {'error': "runs.csv: line 3, column status: 'x' is not ok", 'file': 'runs.csv', 'key': 'line 3, column status'}
    >>> error_document(OptionError("--catalog my.csv: no such file"))
    {'error': '--catalog my.csv: no such file', 'file': 'my.csv', 'key': '--catalog'}
    """
    from bench.errors import OptionError

    message = str(exc)
    if hasattr(exc, "key"):
        return {"error": message, "file": getattr(exc, "file", None), "key": exc.key}
    found = _WHERE.match(message)
    file = key = None
    if found and isinstance(exc, OptionError):
        key, _, value = found["first"].partition(" ")
        file = value if value and ("/" in value or "." in value) else None
    elif found and " " not in found["first"]:
        file, key = found["first"], found["second"]
    return {"error": message, "file": file, "key": key}


def jsonable(value: Any) -> Any:
    """`value` as JSON types: dataclasses as dicts of their fields, paths and dates as text, NaN as null.

    >>> from pathlib import Path
    >>> jsonable({"path": Path("a/b"), "ratio": float("nan"), "sizes": (1, 2)})
    {'path': 'a/b', 'ratio': None, 'sizes': [1, 2]}
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: jsonable(getattr(value, field.name)) for field in dataclasses.fields(value)
                if not callable(getattr(value, field.name))}
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(item) for item in value]
    if isinstance(value, (Path, date, datetime)):
        return str(value) if isinstance(value, Path) else value.isoformat()
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, (str, bytes)):
        value = value.item()  # numpy / torch scalars
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def document(command: str, body: dict[str, Any]) -> dict[str, Any]:
    """The envelope every command's document shares: `command`, `schema_version`, `bench_version`, then
    the command's own keys."""
    from bench.commands.common import version

    return {"command": command, "schema_version": SCHEMA_VERSION, "bench_version": version().split(" ", 1)[1],
            **jsonable(body)}


def emit(command: str, body: dict[str, Any], stream=None) -> None:
    """Print the document (strict JSON: no NaN) to `stream` (stdout)."""
    print(json.dumps(document(command, body), indent=2, allow_nan=False), file=stream or sys.stdout, flush=True)


@contextlib.contextmanager
def answer_only(enabled: bool) -> Iterator[None]:
    """While the command works, send stdout (fd 1) to stderr, so the JSON printed after is alone on stdout."""
    if not enabled:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)  # a child process's or a C library's writes
    try:
        with contextlib.redirect_stdout(sys.stderr):  # Python's, wherever sys.stdout pointed
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


# --- the documents' parts, one builder each (docs/json.md) -------------------------------------

def grid_document(grid) -> dict[str, Any]:
    """A loaded grid: name, file, profile and its cells (every axis, and the stable cell id)."""
    return {"name": grid.name, "file": grid.path, "profile": grid.profile,
            "profile_description": grid.profile_description or None,
            "cells": [{"cell_id": cell.cell_id, **jsonable(cell)} for cell in grid.cells]}


def estimate_document(found) -> dict[str, Any]:
    """`bench estimate`, one grid (a `bench.memory.estimate_grid.GridEstimate`): its file, rows, where they went,
    the chart, and per model the estimator's measured agreement with public fit/OOM rows."""
    grid = found.grid
    return {"name": grid.name, "file": grid.path, "profile": grid.profile, "runs_file": found.runs_file,
            "chart": found.chart, "rows": list(found.rows),
            "estimator_agreement": {model: measured and measured.document()
                                    for model, measured in found.agreements.items()}}


def probe_document(report, model_sources: str | None = None) -> dict[str, Any]:
    """`bench probe`: the configuration (`model_sources`: for an hf-hub model, which of its config and the options
    set its classes, input and kwargs) and, per budget asked for (`--gpu` repeated), the estimator's answer with
    its predicted peaks (whole bytes), the estimator's measured agreement with public fit/OOM rows at the budget's
    headroom and, after trials, the device's: a `bench.memory.probe.ProbeReport`, as `probe_text` says it. The
    first answer is also given at the top level."""
    from bench.units import GIB

    def whole(nbytes: float | None) -> int | None:
        return None if nbytes is None else round(nbytes)

    def search(found) -> dict[str, Any] | None:
        return None if found is None else {
            "largest_micro_batch": found.largest,
            "trials": [{"micro_batch": n, "fits": ok} for n, ok in found.trials]}

    def answer(budget, result, agreement) -> dict[str, Any]:
        largest = result.predicted.largest
        return {"budget": {"bytes": whole(budget.nbytes), "gib": budget.nbytes / GIB, "source": budget.source,
                           "headroom": budget.headroom,
                           "device": None if budget.device is None else budget.device.name},
                "predicted": search(result.predicted),
                "predicted_peak_bytes": whole(result.peak_at(largest)),
                "predicted_peak_above_bytes": whole(result.peak_at(largest + 1)),
                "estimator_agreement": agreement and agreement.document(),
                "traced_steps": result.traced_steps,
                "found": search(result.found), "doubling_trials": result.doubling_trials}

    config = report.config
    answers = [answer(found.budget, found.result, found.agreement) for found in report.answers]
    return {"model": config.base.model, "configuration": config.describe(), "model_sources": model_sources,
            "cell": {k: v for k, v in jsonable(config.base).items() if k not in ("micro_batch", "experiment")},
            **answers[0], "answers": answers}


def _assumptions(workload, assumptions) -> dict[str, Any]:
    return {"dataset_size": workload.dataset_size, "epochs": workload.epochs,
            "samples_per_run": workload.samples_per_run, **jsonable(assumptions)}


def cost_document(folder, table, catalog: str, loader_costs, written) -> dict[str, Any]:
    """One folder of `bench cost`: every (row, instance) line as a cost.csv record, and the rows refused."""
    from datetime import date as day

    from bench.cost.catalog import stale_note
    from bench.cost.price import record

    return {"folder": folder, "catalog": catalog, "ok_rows": len({line.row.cell_id for line in table.lines}
                                                                 | {r.row.cell_id for r in table.refused}),
            "assumptions": _assumptions(table.workload, table.assumptions),
            "oldest_price_observed": table.oldest_price_observed,
            "stale_prices": stale_note([line.instance for line in table.priced], day.today()),
            "lines": [record(line, table.workload.samples_per_run, loader_costs, strategy=table.strategy(line.row))
                      for line in table.lines],
            "refused": [{"cell_id": r.row.cell_id, "reason": r.reason} for r in table.refused],
            "written": written}


def claims_document(findings, written) -> dict[str, Any]:
    """`bench claims`: every claim's verdict, the checks behind it and where the rows came from."""
    from collections import Counter

    def verdict(f) -> dict[str, Any]:
        return {"verdict": f.verdict, "where": f.where, "source": f.source, "rows_file": f.rows_file,
                "cell_ids": f.cell_ids, "checks": [{"claimed": c.claimed, "measured": c.measured,
                                                    "outcome": c.outcome, "at": c.at} for c in f.checks],
                "note": f.note}

    return {"counts": dict(Counter(finding.verdict for finding in findings)),
            "predicted_counts": dict(Counter(finding.predicted.verdict for finding in findings if finding.predicted)),
            "claims": [{"id": f.claim.id, "article": f.claim.article, "summary": f.claim.summary,
                        "quote": f.claim.quote, **verdict(f), "where_it_holds": f.where_it_holds or None,
                        "supporting": f.supporting,
                        "predicted": {**verdict(f.predicted), "gpu": f.predicted.device_name} if f.predicted else None}
                       for f in findings],
            "written": written}
