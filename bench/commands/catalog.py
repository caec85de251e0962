"""`bench catalog`: the GPUs and priced instances the cost and the plan use, with their dates and stale
prices flagged; `bench catalog import`: a SkyPilot price file merged into a catalog file."""

from __future__ import annotations

import argparse
import os
import re
from datetime import date, timedelta
from importlib import resources
from pathlib import Path

from bench.cost.catalog import (
    STALE_AFTER_MONTHS,
    Catalog,
    Instance,
    Merge,
    load_catalog,
    merge,
    months_before,
    observed_date,
    stale,
    stale_note,
    write_catalog,
)
from bench.commands.formats import add_format_option, emit, jsonable
from bench.errors import OptionError
from bench.units import percent

SOURCE_CHARS = 60
"""Characters of each source printed unless --full."""
EARLIEST_TODAY = date(2000, 1, 1)
"""Earliest `--today`: before any cloud GPU price (and far from the year 1, where six months earlier is no date)."""
CHANGE_FLAG = 1.25
"""An imported price more than this factor above or below the price it supersedes is pointed out."""


def register(commands: argparse._SubParsersAction) -> None:
    catalog = commands.add_parser(
        "catalog", help="list the GPUs and priced instances, with their dates; flag prices older than six months",
        description="List the GPU catalog (bench/data/gpus.csv) and the instance price catalog "
                    "(bench/data/instances.csv, or --catalog FILE) with the date each figure was seen; prices "
                    f"older than {STALE_AFTER_MONTHS} months are flagged. `bench catalog import` refreshes prices "
                    "from a SkyPilot catalog file (docs/catalog.md).",
        epilog="example: bench catalog --instances --catalog my_instances.csv",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    catalog.set_defaults(handler=list_catalog)
    only = catalog.add_mutually_exclusive_group()
    only.add_argument("--gpus", action="store_true", help="only the GPU table")
    only.add_argument("--instances", action="store_true", help="only the instance price table")
    catalog.add_argument("--catalog", type=Path, help="instance catalog CSV (default: bench/data/instances.csv)")
    catalog.add_argument("--include-superseded", action="store_true",
                         help="also list superseded prices (those with valid_until)")
    catalog.add_argument("--full", action="store_true",
                         help=f"print every source whole (default: its first {SOURCE_CHARS} characters)")
    _add_today(catalog)
    add_format_option(catalog)

    actions = catalog.add_subparsers(metavar="ACTION", dest="action")
    load = actions.add_parser(
        "import", help="read a SkyPilot vms.csv into a catalog file (bench cost --catalog FILE uses it)",
        description="Read a SkyPilot catalog file (catalogs/<version>/<cloud>/vms.csv of "
                    "github.com/skypilot-org/skypilot-catalog) into this project's catalog format, merge it into "
                    "a catalog (old prices of the same instance and region become superseded) and write the "
                    "result to a new file. Rows that cannot be read as a GPU instance are left out and counted; "
                    "doubtful prices are flagged. Rules and caveats: docs/catalog.md.",
        epilog="example: bench catalog import ~/skypilot-catalog/catalogs/v7/aws/vms.csv --observed 2026-12-01 "
               "--region us-east-1 --source 'skypilot-catalog commit 001367d'",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    load.set_defaults(handler=import_prices)
    load.add_argument("file", type=Path, metavar="FILE", help="a SkyPilot vms.csv")
    load.add_argument("--observed", metavar="YYYY-MM[-DD]",
                      help="when these prices were seen (needed: the files carry no date; give the day the file was "
                           "fetched, or its commit's date)")
    load.add_argument("--provider", help="the cloud the file prices (default: the folder of .../<cloud>/vms.csv)")
    load.add_argument("--source", default="", metavar="TEXT",
                      help="added to every row's source: where the file came from (a commit, a URL)")
    load.add_argument("--region", action="append", default=[], help="only this region (repeatable; default: all)")
    load.add_argument("--catalog", dest="merge_into", type=Path,
                      help="the catalog to merge into (default: bench/data/instances.csv)")
    load.add_argument("--out", type=Path,
                      help="where to write the merged catalog (default: instances-<provider>-<observed>.csv beside "
                           "FILE); an existing file is only replaced when it is the catalog merged into")
    load.add_argument("--dry-run", action="store_true", help="print what the import finds; write nothing")
    _add_today(load, default=argparse.SUPPRESS)  # so that `bench catalog --today D import ...` keeps D
    add_format_option(load, text_only=True, default=argparse.SUPPRESS)


def _add_today(parser: argparse.ArgumentParser, default: object = None) -> None:
    parser.add_argument("--today", type=_day, metavar="YYYY-MM-DD", default=default,
                        help="judge the age of prices as of this day (default: today)")


def _day(text: str) -> date:
    try:
        day = date.fromisoformat(text) if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text) else _bad_day(text)
    except ValueError:
        return _bad_day(text)
    if day < EARLIEST_TODAY:
        raise argparse.ArgumentTypeError(f"{text} is before {EARLIEST_TODAY}; no catalog price is that old")
    if day > date.today() + timedelta(days=1):  # a day ahead: UTC against the zone the user typed it in
        raise argparse.ArgumentTypeError(f"{text} is in the future; prices are judged as of a day that has come")
    return day


def _bad_day(text: str) -> date:
    raise argparse.ArgumentTypeError(f"{text!r} is not a day YYYY-MM-DD")


# --- listing -----------------------------------------------------------------------------------

def list_catalog(args: argparse.Namespace) -> int:
    today = args.today or date.today()
    if args.format == "json":
        emit("catalog", catalog_document(args, today))
        return 0
    if not args.instances:
        print(gpu_table(args.full))
    if not args.gpus:
        if not args.instances:
            print()
        print(instance_table(load_catalog(args.catalog), today, args.include_superseded, args.full))
    return 0


def catalog_document(args: argparse.Namespace, today: date) -> dict:
    """`bench catalog --format json`: the GPU rows and the instance rows shown, each price's STALE flag."""
    from bench.measure.hardware import gpu_keys, gpu_spec

    body: dict = {"today": today}
    if not args.instances:
        body["gpus"] = [gpu_spec(key) for key in gpu_keys()]
    if not args.gpus:
        catalog = load_catalog(args.catalog)
        shown = catalog.select(include_superseded=args.include_superseded)
        old = set(stale([i for i in shown if i.current], today))
        body["instances"] = {"file": catalog.path, "rows": len(catalog.instances),
                             "shown": [{**jsonable(i.model_dump()), "stale": i in old} for i in shown]}
    return body


def gpu_table(full: bool = False) -> str:
    """The GPU catalog: memory, dense peaks, bandwidth, when each row was recorded and from where."""
    from bench.measure.hardware import gpu_keys, gpu_spec

    specs = [gpu_spec(key) for key in gpu_keys()]
    out = [f"GPUs: bench/data/gpus.csv, {len(specs)} rows; datasheet dense peaks in TFLOP/s, nominal memory in GiB, "
           "memory bandwidth in decimal GB/s; '-': no datasheet figure",
           f"{'gpu':<15} {'memory':>6} {'fp32':>6} {'tf32':>6} {'bf16':>6} {'fp16':>6} {'GB/s':>6}  "
           f"{'observed':<10}  source" + ("" if full else f" (first {SOURCE_CHARS} characters; --full)")]
    for spec in specs:
        peaks = [spec.peak_tflops[column] for column in ("fp32_tflops", "tf32_tflops", "bf16_tflops", "fp16_tflops")]
        out.append(f"{spec.gpu:<15} {spec.memory_gib:>6g} " + " ".join(f"{_g(p):>6}" for p in peaks)
                   + f" {_g(spec.memory_bandwidth_gb_per_s):>6}  {spec.observed:<10}  {_cut(spec.source, full)}")
    return "\n".join(out)


def instance_table(catalog: Catalog, today: date, include_superseded: bool = False, full: bool = False) -> str:
    """The priced instances with their dates, each price older than six months marked STALE."""
    shown = catalog.select(include_superseded=include_superseded)
    current = [i for i in shown if i.current]
    old = set(stale(current, today))
    which = "current and superseded prices" if include_superseded else "current prices"
    out = [f"instances: {catalog.path}, {len(shown)} {which} of {len(catalog.instances)} rows; USD per hour for the "
           f"whole instance; STALE: a current price observed before {months_before(today, STALE_AFTER_MONTHS)} "
           f"(more than {STALE_AFTER_MONTHS} months before {today})",
           f"{'provider':<9} {'instance':<28} {'gpus':<18} {'vcpus':>5} {'usd/h':>9} {'spot usd/h':>10}  "
           f"{'region':<12} {'observed':<10} {'valid_until':<11} {'flag':<5}  source"
           + ("" if full else f" (first {SOURCE_CHARS} characters; --full)")]
    for i in shown:
        out.append(f"{i.provider:<9} {i.instance:<28} {f'{i.gpu_count}x {i.gpu}':<18} {_g(i.vcpus):>5} "
                   f"{i.usd_per_hour!s:>9} {_usd(i.spot_usd_per_hour):>10}  {i.region:<12} {i.observed:<10} "
                   f"{i.valid_until or '-':<11} {'STALE' if i in old else '':<5}  {_cut(i.source, full)}")
    note = stale_note(current, today, what="current prices listed")
    out.append(note or f"no current price listed is older than {STALE_AFTER_MONTHS} months")
    return "\n".join(out)


def _g(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _usd(value: float | None) -> str:
    return "-" if value is None else str(value)


def _cut(text: str, full: bool) -> str:
    return text if full or len(text) <= SOURCE_CHARS else text[:SOURCE_CHARS - 3] + "..."


# --- import ------------------------------------------------------------------------------------

def import_prices(args: argparse.Namespace) -> int:
    from bench.cost.skypilot import read_skypilot

    today = args.today or date.today()
    observed = _observed(args.observed, today)
    base = load_catalog(args.merge_into or args.catalog)
    imported = read_skypilot(args.file, observed=observed, provider=args.provider, source=args.source,
                             regions=tuple(args.region))
    out = args.out or args.file.parent / f"instances-{imported.provider}-{observed}.csv"
    if not args.dry_run:
        _check_out(out, args.merge_into or args.catalog)
    regions = sorted({i.region for i in imported.instances})
    print(f"{imported.path}: {imported.rows_read} rows; provider {imported.provider}; prices observed {observed} "
          f"(--observed)")
    print(f"  read {len(imported.instances)} GPU instance prices "
          f"({sum(i.spot_usd_per_hour is not None for i in imported.instances)} with a spot price) "
          f"in {len(regions)} region(s){': ' + ', '.join(regions) if 0 < len(regions) <= 8 else ''}")
    _print("left out", imported.left_out or ["nothing"])
    _print("check", imported.flags)
    if not imported.instances:
        print("  no GPU instance price to import; nothing written")
        return 1
    merged = merge(base.instances, imported.instances)
    print(f"  merged into {base.path}: {len(merged.added)} price(s) added ({len(merged.superseded)} superseding "
          f"the catalog's price of the same instance and region, which keeps its row with valid_until {observed}); "
          f"{len(merged.unchanged)} unchanged (same price, same date)")
    if merged.kept_newer:
        names = ", ".join(f"{i.instance} {i.region}" for i in merged.kept_newer)
        print(f"  not added: {len(merged.kept_newer)} price(s) older than the catalog's current one: {names}")
    _print("check", _changes(merged))
    _print("note", _beside(base.instances, merged))
    current = [i for i in merged.instances if i.current]
    print(f"  {stale_note(current, today, what='current prices of the merged catalog') or 'no current price is stale'}")
    if args.dry_run:
        print("  --dry-run: nothing written")
        return 0
    _write(merged.instances, out)
    print(f"  wrote {out}: {len(merged.instances)} rows, {len(current)} current; use it with: "
          f"bench cost RESULTS_DIR --catalog {out}")
    return 0


def _print(label: str, lines) -> None:
    for line in lines:
        print(f"  {label}: {line}")


def _changes(merged: Merge, factor: float = CHANGE_FLAG) -> list[str]:
    """Superseded prices the new one differs from by more than `factor`: worth a look (an old file given a new date?)."""
    new = {(i.provider, i.instance, i.region): i for i in merged.added}
    lines = []
    for old in merged.superseded:
        now = new[old.provider, old.instance, old.region]
        if max(now.usd_per_hour, old.usd_per_hour) > factor * min(now.usd_per_hour, old.usd_per_hour):
            lines.append(f"{old.provider} {old.instance} {old.region}: on-demand {now.usd_per_hour} (observed "
                         f"{now.observed}) supersedes {old.usd_per_hour} (observed {old.observed}): "
                         f"{percent(now.usd_per_hour / old.usd_per_hour - 1, signed=True)}; is the file as recent as --observed says?")
    return lines


def _beside(before: tuple[Instance, ...], merged: Merge) -> list[str]:
    """Current prices of the catalog for instances the import priced, in regions it did not price: both stay."""
    priced = {(i.provider, i.instance) for i in merged.added + merged.unchanged + merged.kept_newer}
    regions = {(i.provider, i.instance, i.region) for i in merged.added + merged.unchanged + merged.kept_newer}
    kept = [i for i in before if i.current and (i.provider, i.instance) in priced
            and (i.provider, i.instance, i.region) not in regions]
    if not kept:
        return []
    names = ", ".join(f"{i.instance} {i.region} ({i.observed})" for i in kept[:6]) + (", ..." if len(kept) > 6 else "")
    return [f"{len(kept)} current price(s) of the catalog for the same instances in other regions stay current "
            f"beside the imported ones (bench cost prices each): {names}; give them valid_until by hand if the "
            f"import replaces them"]


def _observed(text: str | None, today: date) -> str:
    if text is None:
        raise OptionError("--observed: needed: a SkyPilot vms.csv carries no date; give the day its prices were "
                          "fetched (YYYY-MM-DD, or YYYY-MM)")
    try:
        if not re.fullmatch(r"\d{4}-\d{2}(-\d{2})?", text):
            raise ValueError
        seen = observed_date(text)
    except ValueError:
        raise OptionError(f"--observed {text}: not a date YYYY-MM or YYYY-MM-DD") from None
    if seen > today:
        raise OptionError(f"--observed {text}: after today ({today})")
    return text


def _check_out(out: Path, merge_into: Path | None) -> None:
    """An existing file is replaced only when it is the catalog merged into (asked for, never by default)."""
    base = merge_into or Path(str(resources.files("bench.data").joinpath("instances.csv")))
    if out.is_dir():
        raise OptionError(f"--out {out}: is a directory; give a file name")
    if out.exists() and out.resolve() != base.resolve():
        raise OptionError(f"--out {out}: exists and is not the catalog merged into ({base}); choose another file, "
                          f"or merge into it with --catalog {out}")
    if not out.parent.is_dir():
        raise OptionError(f"--out {out}: folder {out.parent} does not exist")
    from bench.results.store import preflight  # late: it loads the results reader

    preflight(out.parent, "the merged catalog", "nothing was written")


def _write(instances: tuple[Instance, ...], out: Path) -> None:
    """Write beside `out`, read it back with `load_catalog`, then move it into place: a file that would not
    load is never left behind."""
    temporary = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        write_catalog(instances, temporary)
        load_catalog(temporary)
        os.replace(temporary, out)
    finally:
        temporary.unlink(missing_ok=True)
