"""The `bench` command: parse, hand over to the command's module (bench/commands/), turn bad input into
one line and exit 2. Third-party warnings go to a log file, never into an answer.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import re
import signal
import sys
import threading
import warnings
from pathlib import Path
from typing import Iterator

from bench.cache import NO_CACHE_ENV
from bench.commands import GROUPS
from bench.commands.common import version
from bench.commands.formats import error_document, text_answer, wants_json
from bench.errors import BadInput, OptionError
from bench.isolation import keep_working_directory_off_import_path, preload_in_children

# Each child of the fork server re-imports the main module (the `bench` script, which imports this one) first.
preload_in_children(__name__)

EXIT_BAD_INPUT = 2
LOG_ENV = "BENCH_LOG"
"""Where warnings and library log lines go (default: <cache>/bench.log, the cache of `bench data make`)."""
CHILD_ENV = "BENCH_LOG_CHILDREN"
"""Set by the command for the processes it starts: the fork server imports this module and logs alike."""

DESCRIPTION = """\
Gradient accumulation against a large batch, measured: peak memory, throughput, MFU and the cost of
a training run for every micro-batch x accumulation pair of a grid file (experiments/*.toml), and
the memory of any timm model predicted without a GPU.
"""

EXAMPLES = """\
examples:
  bench probe resnet50 --gpu A100-40GB        largest micro-batch that fits a 40 GiB A100 (no GPU needed)
  bench list experiments/resnet50.toml --profile cuda
                                              the cells a GPU would run, on any machine
  bench estimate experiments/resnet50.toml    predicted peak memory of every cell, no GPU needed
  bench run experiments/smoke.toml            measure a tiny grid (seconds) -> results/smoke/<device>/
  bench report results/smoke/*/               charts and REPORT.md from the rows
  bench plan resnet50 --effective-batch 1024 --image-size 224
                                              cheapest instance x configuration per training run
                                              (memory estimated, speed predicted: no rows needed)
  bench probe resnet50 --gpu H100-80GB --format json | python -m json.tool

Every command takes --help; the README and docs/ in the repository explain the rest.
"""

EXIT_INTERRUPTED = 130


def entry() -> None:
    """The `bench` command: `main`, then exit. Once torch is loaded, or after an interrupt, the process exits at once
    (`os._exit`), its output and log flushed first: its answer is printed, its rows and files are written (each write
    is synchronous) and its cells have ended or been killed, while tearing torch and timm down would take most of a
    second more (an interrupted run's, seconds)."""
    keep_working_directory_off_import_path()  # `python -m bench` put it first: a ./timm.py must not load
    code = main()
    if code == EXIT_INTERRUPTED or "torch" in sys.modules:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more can reach it
                stream.flush()
        logging.shutdown()  # the warnings log (bench.log)
        os._exit(code)
    sys.exit(code)


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the `bench` command itself; a caller passing argv (the tests) keeps its own warning setup
        _log_warnings()
    as_json = wants_json(sys.argv[1:] if argv is None else argv)
    try:
        args = _parser().parse_args(argv)
        if getattr(args, "no_cache", False):  # an environment variable, so the processes it starts bypass it too
            os.environ[NO_CACHE_ENV] = "1"
        with _terminate_as_interrupt():
            if as_json and getattr(args, "text_only", False):
                return text_answer(args.command, args.handler, args)
            return args.handler(args)
    except BadInput as exc:
        print(f"{getattr(exc, 'prog', 'bench')}: {exc}", file=sys.stderr)
        if as_json:  # the contract of docs/json.md: one object on stdout, exit 2
            print(json.dumps(error_document(exc)), flush=True)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # `bench list ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return _interrupted()
    except Exception as exc:
        if not (_caused_by_interrupt(exc) or _signals_received):
            raise
        return _interrupted()


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """The one signal policy of every command: SIGTERM (`kill`, `timeout`) unwinds like Ctrl-C (both noted in
    `_signals_received`), so a runner kills the cell it waits for, the results lock and temporary files go in their
    `finally`, and the command says so in one line and exits 130. The handlers before it are put back after (a
    caller of `main` keeps its own); an ignored SIGINT (a shell's background job) stays ignored."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set a handler
        yield
        return
    _signals_received.clear()
    previous = {number: signal.signal(number, _raise_keyboard_interrupt) for number in _INTERRUPTS
                if number != signal.SIGINT or signal.getsignal(number) is signal.default_int_handler}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


_INTERRUPTS = (signal.SIGTERM, signal.SIGINT)
_signals_received: list[int] = []
"""The interrupts this command has received: one that lands inside a C extension's import can come back as an
unrelated error with no KeyboardInterrupt in its chain (torch's distributed module turned one into
`TypeError: expected a message argument`), and is still the interrupt."""


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    _signals_received.append(signum)
    raise KeyboardInterrupt(f"signal {signum}")


def _interrupted() -> int:
    print("bench: interrupted; rows of finished cells are kept, rerun to resume", file=sys.stderr)
    return EXIT_INTERRUPTED


def _caused_by_interrupt(exc: BaseException) -> bool:
    """Whether a Ctrl-C or SIGTERM is behind `exc`: one that lands inside a library's import can come back
    wrapped (matplotlib's class creation turns it into a RuntimeError), and is still an interrupt."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def log_file() -> Path:
    """$BENCH_LOG, else bench.log in $BENCH_CACHE_DIR, $XDG_CACHE_HOME/bench or ~/.cache/bench."""
    if os.environ.get(LOG_ENV):
        return Path(os.environ[LOG_ENV])
    cache = os.environ.get("BENCH_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bench"
    return Path(cache) / "bench.log"


def _log_warnings() -> None:
    """Warnings (bitsandbytes', torch's) and library log records into the log file, not the terminal.

    A root handler also stops logging's last-resort handler printing a library's warnings to stderr.
    """
    path = log_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler: logging.Handler = logging.FileHandler(path, delay=True)
    except OSError:  # a read-only home: drop them rather than print them
        handler = logging.NullHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    if not any(getattr(h, "_bench", False) for h in root.handlers):
        handler._bench = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    logging.captureWarnings(True)
    warnings.simplefilter("default")  # each distinct warning once, into the log
    os.environ[CHILD_ENV] = str(path)  # cells forked from the server (it preloads this module) log there too


class _Parser(argparse.ArgumentParser):
    """argparse, with a mistake raised as one `OptionError` line instead of usage text and exit."""

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> object:
        # argparse drops a "--" value, so `--epochs=--` would set epochs to [] and crash later.
        if action.option_strings and action.nargs is None and arg_strings == ["--"]:
            self.error(f"argument {action.option_strings[0]}: expected a value, got --")
        return super()._get_values(action, arg_strings)

    def parse_known_args(self, args=None, namespace=None):
        # argparse hands a list positional only the items before the first option (bpo-15112), so
        # `bench plan MODEL --effective-batch N DIR` left DIR unrecognized: words left over go to that positional.
        namespace, extras = super().parse_known_args(args, namespace)
        (listed, *others) = [a for a in self._actions if not a.option_strings and a.nargs in ("*", "+")] or [None]
        if extras and listed is not None and not others and not any(word.startswith("-") for word in extras):
            given = getattr(namespace, listed.dest) or []
            setattr(namespace, listed.dest, [*given, *self._get_values(listed, extras)])
            extras = []
        return namespace, extras

    def error(self, message: str) -> None:
        where = re.sub(r"^argument ([^:]+): ", r"\1: ", message)  # "argument --x: ..." -> "--x: ..."
        where = re.sub(r"'([^']{57})[^']{4,}'", r"'\1...'", where)  # a 5,000-digit value is not repeated whole
        problem = OptionError(f"{where} (see {self.prog} --help)")
        problem.prog = self.prog
        raise problem


@functools.cache  # built once a process: building it is most of an in-process call that only refuses its input
def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="bench", description=DESCRIPTION, epilog=EXAMPLES,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=version())
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    for group in GROUPS:
        group.register(commands)
    for sub, help_line in subcommand_parsers(parser):
        _describe(sub, help_line)
        sub.set_defaults(command=sub.prog.removeprefix("bench "))
    return parser


def subcommand_parsers(parser: argparse.ArgumentParser) -> list[tuple[argparse.ArgumentParser, str | None]]:
    """(parser, its one-line help) for every subcommand under `parser`, nested ones (`bench catalog import`)
    included."""
    found: list[tuple[argparse.ArgumentParser, str | None]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                found += [(sub, helps.get(name)), *subcommand_parsers(sub)]
    return found


def _describe(sub: argparse.ArgumentParser, help_line: str | None) -> None:
    """A subcommand's help page: its one-line help as the description, its example last."""
    from bench.commands.examples import EXAMPLES as SUBCOMMAND_EXAMPLES

    command = sub.prog.removeprefix("bench ")
    if sub.description is None and help_line:
        sub.description = help_line[0].upper() + help_line[1:] + "."
    if sub.epilog is None and command in SUBCOMMAND_EXAMPLES:
        sub.epilog = f"example: {SUBCOMMAND_EXAMPLES[command]}"
    sub.formatter_class = argparse.RawDescriptionHelpFormatter


if os.environ.get(CHILD_ENV) and __name__ != "__main__":  # imported by the fork server of a `bench` command
    os.environ.setdefault(LOG_ENV, os.environ[CHILD_ENV])
    _log_warnings()
