"""`bench compare A B`: two sets of rows side by side (run against run, predicted against measured)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from bench.commands.common import fraction


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("compare", help="two results side by side: run against run, or predicted "
                                                 "against measured, each figure's ratio and whether it is real")
    parser.set_defaults(handler=compare_command)
    parser.add_argument("a", type=Path, metavar="A", help="a results folder, a runs file (measured, estimated or "
                        "predicted rows) or a plan's JSON (bench plan --format json)")
    parser.add_argument("b", type=Path, metavar="B", help="the same kinds; ratios are B/A")
    parser.add_argument("--format", choices=("text", "markdown", "json"), default="text",
                        help="text (default), markdown, or json: one JSON document on stdout and nothing else "
                             "(schema: docs/json.md)")
    parser.add_argument("--threshold", type=fraction, default=0.10,
                        help="relative difference taken as noise where a row keeps no spread (default 0.10: "
                             "asv's factor 1.1)")


def compare_command(args: argparse.Namespace) -> int:
    from bench.api import compare
    from bench.commands.formats import answer_only, emit

    with answer_only(args.format == "json"):
        print(f"compare: reading {args.a} and {args.b}", file=sys.stderr, flush=True)
        result = compare(args.a, args.b, threshold=args.threshold)
    if args.format == "json":
        emit("compare", comparison_document(result))
    elif args.format == "markdown":
        print(_markdown(result))
    else:
        _print_text(result)
    return 0


def comparison_document(comparison) -> dict[str, Any]:
    """`bench compare`'s document (docs/json.md): every pair's figures, the unmatched rows, the summary."""
    from bench.commands.formats import jsonable
    from bench.report.compare import method_notes, summarise

    def entry(found) -> dict[str, Any]:
        return {"label": found.label, "kind": found.kind, "device": found.device, "instance": found.instance,
                "configuration": dict(found.key), "flags": list(found.flags)}

    def value(found) -> dict[str, Any]:
        return {"value": found.value, "low": found.low, "high": found.high, "interval": found.interval}

    return jsonable({
        "a": comparison.a_source, "b": comparison.b_source, "threshold": comparison.threshold,
        "pairs": [{"a": entry(pair.a), "b": entry(pair.b),
                   "figures": [{"figure": f.figure, "a": value(f.a), "b": value(f.b), "ratio": f.ratio,
                                "verdict": f.verdict, "method": f.method, "how": f.how} for f in pair.figures]}
                  for pair in comparison.pairs],
        "unmatched_a": [entry(found) for found in comparison.unmatched_a],
        "unmatched_b": [entry(found) for found in comparison.unmatched_b],
        "left_out_a": comparison.left_out_a, "left_out_b": comparison.left_out_b,
        "summary": summarise(comparison), "methods": method_notes(comparison)})


def _footer(comparison) -> list[str]:
    from bench.report.compare import method_notes, summarise, summary_line, unmatched_lines

    return [*(summary_line(s) for s in summarise(comparison)), *unmatched_lines(comparison),
            *method_notes(comparison)]


def _markdown(comparison) -> str:
    import pandas as pd

    from bench.report.compare import table_rows
    from bench.results.markdown import markdown_table

    lines = [f"A: `{comparison.a_source}`, B: `{comparison.b_source}`; {len(comparison.pairs)} matched pairs", "",
             markdown_table(pd.DataFrame(table_rows(comparison))), ""]
    return "\n".join(lines + [f"- {line}" for line in _footer(comparison)])


def _print_text(comparison) -> None:
    from rich.table import Table

    from bench.report.compare import table_rows
    from bench.report.console import console

    table = Table(title=f"A: {comparison.a_source}   B: {comparison.b_source}   ({len(comparison.pairs)} pairs)",
                  title_justify="left")
    rows = table_rows(comparison)
    for column in rows[0]:
        table.add_column(column, justify="right" if column in ("A", "B", "B/A") else "left",
                         overflow="fold")
    for row in rows:
        table.add_row(*row.values())
    console.print(table)
    for line in _footer(comparison):
        console.print(line, markup=False, highlight=False)
