"""Command line: `bench list`, `run`, `report`, `cost`, `plan`, `estimate`, `probe`, `equivalence`,
`claims`.

Parse, hand over to the command's module (bench/commands/), turn bad input into one line and exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys

from bench.catalog import CatalogError
from bench.commands import GROUPS
from bench.commands.common import EXIT_BAD_INPUT
from bench.device import DeviceUnavailable
from bench.plan import PlanError
from bench.results import ResultsFileError
from bench.spec import SpecError


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.handler(args)
    except (SpecError, ResultsFileError, DeviceUnavailable, CatalogError, PlanError) as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("bench: interrupted; rows of finished cells are kept, rerun to resume", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `bench list ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bench", description=__doc__)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    for group in GROUPS:
        group.register(commands)
    return parser
