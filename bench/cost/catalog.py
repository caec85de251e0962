"""The cloud instance catalog: GPU instances and their hourly prices, one dated, sourced row each.

The built-in catalog is `bench/data/instances.csv`; a user's file with the same columns
replaces it (`bench cost --catalog FILE`). A price that has been superseded keeps its row
with `valid_until` set; rows with an empty `valid_until` are the current prices, and only
those are used unless superseded ones are asked for.

Every problem is one `CatalogError` line naming the file, the row and the column.
"""

from __future__ import annotations

import calendar
import csv
import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime, timezone
from importlib import resources
from pathlib import Path

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from bench.errors import CatalogError, OptionError
from bench.measure.hardware import GpuSpec, gpu_key_hint, gpu_keys, gpu_spec

# The header a catalog file must have. Units are in the names.
COLUMNS: dict[str, str] = {
    "provider": "cloud or GPU host, lower case (aws, gcp, azure, lambda, runpod, ...)",
    "instance": "the provider's instance type name",
    "gpu": "GPU model: a `gpu` key of bench/data/gpus.csv",
    "gpu_count": "GPUs in one instance",
    "gpu_memory_gb": "memory per GPU as the provider labels it (the nominal '80GB'); must agree with gpus.csv",
    "usd_per_hour": "on-demand price of the whole instance, USD per hour",
    "spot_usd_per_hour": "spot/preemptible price of the whole instance, USD per hour; empty if not known",
    "region": "region the price was read for (prices differ by region)",
    "observed": "when the price was seen, YYYY-MM or YYYY-MM-DD",
    "valid_until": "empty for the current price; the date it stopped applying for a superseded one",
    "source": "where the price comes from",
    "vcpus": "CPU cores (vCPUs) of the whole instance, as the provider lists them; empty if not known",
}
_OPTIONAL = {"spot_usd_per_hour", "valid_until", "vcpus"}
_ADDED_LATER = {"vcpus"}
"""Columns a catalog written before they existed may lack (read as empty)."""
_DATE = r"^\d{4}-(0[1-9]|1[0-2])(-(0[1-9]|[12]\d|3[01]))?$"
MAX_GPUS_PER_INSTANCE = 64
"""Most GPUs one instance may have (the largest cloud instances have 16): past it a row is a typo, not an offer."""
MAX_USD_PER_HOUR = 10_000.0
"""Highest price of one instance per hour (the dearest listed are about $100): a larger one is a typo, and a
$1e308 price prints `usd_per_run inf`."""
MAX_VCPUS = 4096
"""Most vCPUs of one instance (the largest have under 1,000)."""
MAX_TEXT_CHARS = {"provider": 40, "instance": 100, "region": 100, "source": 1000}
"""Longest text of each text column."""


class Instance(BaseModel):
    """One priced instance type.

    Example:
        >>> p4d = Instance(provider="aws", instance="p4d.24xlarge", gpu="A100-40GB", gpu_count=8,
        ...                gpu_memory_gb=40, usd_per_hour=32.7726, region="us-east-1",
        ...                observed="2024-09", source="SkyPilot catalog")
        >>> p4d.current, p4d.usd_per_gpu_hour
        (True, 4.096575)
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    provider: str = Field(min_length=1)
    instance: str = Field(min_length=1)
    gpu: str
    gpu_count: int = Field(gt=0, le=MAX_GPUS_PER_INSTANCE)
    gpu_memory_gb: float = Field(gt=0)
    usd_per_hour: float = Field(gt=0, le=MAX_USD_PER_HOUR)
    spot_usd_per_hour: float | None = Field(default=None, gt=0, le=MAX_USD_PER_HOUR)
    region: str = Field(min_length=1)
    observed: str = Field(pattern=_DATE)
    valid_until: str | None = Field(default=None, pattern=_DATE)
    source: str = Field(min_length=1)
    vcpus: int | None = Field(default=None, gt=0, le=MAX_VCPUS)

    @field_validator(*MAX_TEXT_CHARS)
    @classmethod
    def _printable_text(cls, text: str, info) -> str:
        # a NUL or a newline in a name breaks the tables that print it and the CSV that stores it
        limit = MAX_TEXT_CHARS[info.field_name]
        if len(text) > limit:
            raise ValueError(f"{len(text)} characters; at most {limit}")
        if not text.isprintable():
            bad = next(char for char in text if not char.isprintable())
            raise ValueError(f"holds the control character U+{ord(bad):04X}; allowed: printable text")
        return text

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, gpu: str) -> str:
        if gpu_spec(gpu) is None:
            raise ValueError(f"not in the GPU catalog (bench/data/gpus.csv); {gpu_key_hint(gpu)}")
        return gpu

    @field_validator("gpu_memory_gb")
    @classmethod
    def _memory_matches_gpu(cls, memory_gb: float, info) -> float:
        spec = gpu_spec(info.data.get("gpu", ""))
        if spec is not None and memory_gb != spec.memory_gib:
            raise ValueError(f"{memory_gb:g} disagrees with the GPU catalog's {spec.gpu} ({spec.memory_gib:g})")
        return memory_gb

    @field_validator("observed", "valid_until")
    @classmethod
    def _a_real_past_date(cls, text: str | None) -> str | None:
        if text is None:
            return None
        try:
            when = observed_date(text)
        except ValueError:
            raise ValueError("not a calendar date (YYYY-MM or YYYY-MM-DD)") from None
        today = datetime.now(timezone.utc).date()
        if when > today:
            raise ValueError(f"after today ({today.isoformat()}): a price cannot be observed in the future")
        return text

    @model_validator(mode="after")
    def _valid_after_observed(self) -> Instance:
        if self.valid_until is not None and self.valid_until < self.observed:
            raise ValueError(f"valid_until {self.valid_until} is before observed {self.observed}")
        return self

    @property
    def current(self) -> bool:
        """True for a price still in force (no `valid_until`)."""
        return self.valid_until is None

    @property
    def usd_per_gpu_hour(self) -> float:
        return self.usd_per_hour / self.gpu_count

    @property
    def gpu_spec(self) -> GpuSpec:
        spec = gpu_spec(self.gpu)
        assert spec is not None  # checked when the row was loaded
        return spec

    @property
    def label(self) -> str:
        """`aws p4d.24xlarge (8x A100-40GB)`."""
        return f"{self.provider} {self.instance} ({self.gpu_count}x {self.gpu})"


@dataclass(frozen=True)
class Catalog:
    """The rows of one catalog file, in file order."""

    path: str
    instances: tuple[Instance, ...]

    def select(self, *, include_superseded: bool = False, providers: tuple[str, ...] = ()) -> tuple[Instance, ...]:
        """Current prices only unless `include_superseded`; only `providers` if any are given."""
        return tuple(i for i in self.instances
                     if (include_superseded or i.current) and (not providers or i.provider in providers))

    @property
    def providers(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(i.provider for i in self.instances))


def load_catalog(path: Path | None = None) -> Catalog:
    """The built-in instance catalog, or the user's file at `path`.

    Example:
        >>> catalog = load_catalog()
        >>> [i.usd_per_hour for i in catalog.select() if i.instance == "p5.48xlarge"]
        [55.04]
    """
    if path is None:
        name = "bench/data/instances.csv"
        text = resources.files("bench.data").joinpath("instances.csv").read_text()
    else:
        name = str(path)
        try:
            text = Path(path).read_bytes().decode("utf-8-sig")  # a spreadsheet's BOM is not part of the header
        except OSError as exc:
            raise CatalogError(f"{name}: cannot read the instance catalog ({exc.strerror})") from None
        except UnicodeDecodeError as exc:
            line = Path(path).read_bytes()[:exc.start].count(b"\n") + 1
            raise CatalogError(f"{name}: line {line}: not UTF-8 text; an instance catalog is a UTF-8 CSV") from None
    return Catalog(name, _parse(name, text))


def select_instances(path: Path | None = None, *, include_superseded: bool = False, providers: tuple[str, ...] = (),
                     gpus: tuple[str, ...] = ()) -> tuple[str, tuple[Instance, ...]]:
    """(what was loaded, in words; the instances selected) from the catalog at `path` (default: the built-in one):
    current prices unless `include_superseded`, only `providers` and `gpus` (catalog GPU keys) where given. An
    unknown provider or GPU key raises `OptionError` naming it, with the closest names."""
    catalog = load_catalog(path)
    unknown = [name for name in providers if name not in catalog.providers]
    if unknown:
        close = difflib.get_close_matches(unknown[0].lower(), catalog.providers, n=2)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise OptionError(f"--provider {unknown[0]}: not in {catalog.path}; {hint}known: "
                          f"{', '.join(catalog.providers)}")
    unknown = [gpu for gpu in gpus if gpu not in gpu_keys()]
    if unknown:
        raise OptionError(f"--gpu {unknown[0]}: not a catalog key; {gpu_key_hint(unknown[0])}")
    which = "current and superseded prices" if include_superseded else "current prices"
    only = f", {', '.join(providers)} only" if providers else ""
    instances = catalog.select(include_superseded=include_superseded, providers=providers)
    return f"{catalog.path} ({which}{only})", tuple(i for i in instances if not gpus or i.gpu in gpus)


def _parse(name: str, text: str) -> tuple[Instance, ...]:
    reader = csv.DictReader(text.splitlines())
    header = reader.fieldnames or []
    missing = [column for column in COLUMNS if column not in header and column not in _ADDED_LATER]
    unknown = [column for column in header if column not in COLUMNS]
    if missing or unknown:
        problems = ([f"missing column(s) {', '.join(missing)}"] if missing else []) + \
                   ([f"unknown column(s) {', '.join(unknown)}"] if unknown else [])
        raise CatalogError(f"{name}: header (line 1): {'; '.join(problems)}; expected {','.join(COLUMNS)}")
    instances: list[Instance] = []
    seen: dict[tuple[str, str, str], int] = {}
    for number, row in enumerate(reader, start=1):
        where = f"{name}: row {number} (line {reader.line_num})"
        instance = _instance(row, where)
        key = (instance.provider, instance.instance, instance.region)
        if instance.current and key in seen:
            raise CatalogError(f"{where}, column valid_until: a second current price for {' '.join(key)} "
                               f"(row {seen[key]} is current too); set valid_until on the older one")
        if instance.current:
            seen[key] = number
        instances.append(instance)
    if not instances:
        raise CatalogError(f"{name}: no instance rows under the header")
    return tuple(instances)


def _instance(row: dict[str, str | None], where: str) -> Instance:
    width = len(row) - (None in row)
    if None in row:  # csv puts fields beyond the header under the key None
        raise CatalogError(f"{where}, column {list(row)[-2]}: {width + len(row[None])} fields, "
                           f"the header has {width}; extra fields after it (a stray comma?)")
    absent = [column for column, value in row.items() if value is None]
    if absent:
        raise CatalogError(f"{where}, column {absent[0]}: missing; the row has {width - len(absent)} "
                           f"fields, the header {width}")
    values: dict[str, str | None] = {}
    for column in COLUMNS:
        value = (row.get(column) or "").strip()
        if not value and column not in _OPTIONAL:
            raise CatalogError(f"{where}, column {column}: is empty ({COLUMNS[column]})")
        values[column] = value or None
    try:
        return Instance(**values)
    except ValidationError as exc:
        error = exc.errors()[0]
        column = str(error["loc"][0]) if error["loc"] else "valid_until"
        message = error["msg"].removeprefix("Value error, ")
        shown = repr(values.get(column))
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise CatalogError(f"{where}, column {column}: {shown}: {message}") from None


# --- how old a price is ------------------------------------------------------------------------

STALE_AFTER_MONTHS = 6
"""A price observed longer ago than this is flagged in every answer that uses it."""


def observed_date(observed: str) -> date:
    """A catalog date as a `date`; a month alone (YYYY-MM) reads as its first day, the earliest it
    could have been seen.

    >>> observed_date("2024-09"), observed_date("2025-06-15")
    (datetime.date(2024, 9, 1), datetime.date(2025, 6, 15))
    """
    year, month, *day = (int(part) for part in observed.split("-"))
    return date(year, month, day[0] if day else 1)


def months_before(today: date, months: int) -> date:
    """The same day `months` earlier, clamped to the month's length.

    >>> months_before(date(2026, 8, 31), 6)
    datetime.date(2026, 2, 28)
    """
    index = today.year * 12 + today.month - 1 - months
    year, month = divmod(index, 12)
    return date(year, month + 1, min(today.day, calendar.monthrange(year, month + 1)[1]))


def stale(instances: Iterable[Instance], today: date, months: int = STALE_AFTER_MONTHS) -> tuple[Instance, ...]:
    """The distinct prices among `instances` observed before `today` minus `months` months, oldest first.

    >>> old = Instance(provider="aws", instance="p3.2xlarge", gpu="V100-16GB", gpu_count=1, gpu_memory_gb=16,
    ...                usd_per_hour=3.06, region="us-east-1", observed="2024-09", source="made up")
    >>> [i.observed for i in stale([old, old], today=date(2025, 3, 2))], stale([old], today=date(2025, 3, 1))
    (['2024-09'], ())
    """
    cutoff = months_before(today, months)
    distinct = dict.fromkeys(instances)
    return tuple(sorted((i for i in distinct if observed_date(i.observed) < cutoff),
                        key=lambda i: observed_date(i.observed)))


def stale_note(instances: Iterable[Instance], today: date, months: int = STALE_AFTER_MONTHS,
               what: str = "prices used") -> str | None:
    """One line flagging the prices older than `months` months, or None when there are none."""
    distinct = tuple(dict.fromkeys(instances))
    old = stale(distinct, today, months)
    if not old:
        return None
    return (f"STALE PRICES: {len(old)} of {len(distinct)} {what} are older than {months} months (observed before "
            f"{months_before(today, months)}, today {today}; oldest {old[0].observed}, {old[0].label} "
            f"{old[0].region}); refresh them: bench catalog import (docs/catalog.md)")


# --- writing and merging -----------------------------------------------------------------------

def write_catalog(instances: Iterable[Instance], path: Path) -> None:
    """Write `instances` as a catalog file (the COLUMNS header) that `load_catalog(path)` reads back."""
    with Path(path).open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(COLUMNS), lineterminator="\n")
        writer.writeheader()
        for instance in instances:
            writer.writerow({column: _cell(getattr(instance, column)) for column in COLUMNS})


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return str(value)


@dataclass(frozen=True)
class Merge:
    """A catalog with new prices merged in: `instances` in file order, and what happened to each new price."""

    instances: tuple[Instance, ...]
    added: tuple[Instance, ...]
    """New current prices (a key not priced before, or one whose old price they supersede)."""
    superseded: tuple[Instance, ...]
    """Old current prices now given `valid_until` = the new price's `observed`."""
    unchanged: tuple[Instance, ...]
    """New prices equal to the current one, observed the same day: not added twice."""
    kept_newer: tuple[Instance, ...]
    """New prices observed before the catalog's current one for the same key: left out."""


def merge(existing: Iterable[Instance], new: Iterable[Instance]) -> Merge:
    """`new` current prices merged into `existing`, keeping one current price per (provider, instance, region):
    an existing current price for a key gets `valid_until` = the new price's `observed` and stays as history.

    >>> def price(usd, observed):
    ...     return Instance(provider="aws", instance="p5.48xlarge", gpu="H100-80GB", gpu_count=8, gpu_memory_gb=80,
    ...                     usd_per_hour=usd, region="us-east-1", observed=observed, source="made up")
    >>> merged = merge([price(98.32, "2024-09")], [price(55.04, "2025-08")])
    >>> [(i.usd_per_hour, i.valid_until) for i in merged.instances]
    [(98.32, '2025-08'), (55.04, None)]
    """
    rows = list(existing)
    current = {_key(i): index for index, i in enumerate(rows) if i.current}
    added, superseded, unchanged, kept_newer = [], [], [], []
    for instance in new:
        index = current.get(_key(instance))
        old = rows[index] if index is not None else None
        if old is not None and observed_date(old.observed) > observed_date(instance.observed):
            kept_newer.append(instance)
            continue
        if old is not None and old.observed == instance.observed and _same_offer(old, instance):
            unchanged.append(instance)
            continue
        if old is not None:
            rows[index] = old.model_copy(update={"valid_until": instance.observed})
            superseded.append(old)
        current[_key(instance)] = len(rows)
        rows.append(instance)
        added.append(instance)
    return Merge(tuple(rows), tuple(added), tuple(superseded), tuple(unchanged), tuple(kept_newer))


def _key(instance: Instance) -> tuple[str, str, str]:
    return instance.provider, instance.instance, instance.region


def _same_offer(a: Instance, b: Instance) -> bool:
    fields = ("gpu", "gpu_count", "usd_per_hour", "spot_usd_per_hour", "vcpus")
    return all(getattr(a, name) == getattr(b, name) for name in fields)
