"""Command line: `bench list`, `run`, `data make`, `report`, `cost`, `plan`, `estimate`, `probe`, `equivalence`,
`claims`.

Parse, hand over to the command's module (bench/commands/), turn bad input into one line and exit 2.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

from bench.commands import GROUPS
from bench.errors import BadInput, OptionError

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


def entry() -> None:
    """The `bench` command: `main`, then exit. An interrupted run exits at once: its rows are on disk
    and its cell is killed, and tearing torch down would take seconds more."""
    code = main()
    if code == EXIT_INTERRUPTED:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        return args.handler(args)
    except BadInput as exc:
        print(f"{getattr(exc, 'prog', 'bench')}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("bench: interrupted; rows of finished cells are kept, rerun to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `bench list ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


class _Parser(argparse.ArgumentParser):
    """argparse, with a mistake raised as one `OptionError` line instead of usage text and exit."""

    def error(self, message: str) -> None:
        where = re.sub(r"^argument ([^:]+): ", r"\1: ", message)  # "argument --x: ..." -> "--x: ..."
        problem = OptionError(f"{where} (see {self.prog} --help)")
        problem.prog = self.prog
        raise problem


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="bench", description=__doc__)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    for group in GROUPS:
        group.register(commands)
    return parser
