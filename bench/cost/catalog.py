"""The cloud instance catalog: GPU instances and their hourly prices, one dated, sourced row each.

The built-in catalog is `bench/data/instances.csv`; a user's file with the same columns
replaces it (`bench cost --catalog FILE`). A price that has been superseded keeps its row
with `valid_until` set; rows with an empty `valid_until` are the current prices, and only
those are used unless superseded ones are asked for.

Every problem is one `CatalogError` line naming the file, the row and the column.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
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

from bench.errors import CatalogError
from bench.measure.hardware import GpuSpec, gpu_keys, gpu_spec

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


class Instance(BaseModel):
    """One priced instance type.

    Example:
        >>> p4d = Instance(provider="aws", instance="p4d.24xlarge", gpu="A100-40GB", gpu_count=8,
        ...                gpu_memory_gb=40, usd_per_hour=32.7726, region="us-east-1",
        ...                observed="2024-09", source="SkyPilot catalog")
        >>> p4d.current, p4d.usd_per_gpu_hour
        (True, 4.096575)
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: str = Field(min_length=1)
    instance: str = Field(min_length=1)
    gpu: str
    gpu_count: int = Field(gt=0)
    gpu_memory_gb: float = Field(gt=0)
    usd_per_hour: float = Field(gt=0)
    spot_usd_per_hour: float | None = Field(default=None, gt=0)
    region: str = Field(min_length=1)
    observed: str = Field(pattern=_DATE)
    valid_until: str | None = Field(default=None, pattern=_DATE)
    source: str = Field(min_length=1)
    vcpus: int | None = Field(default=None, gt=0)

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, gpu: str) -> str:
        if gpu_spec(gpu) is None:
            raise ValueError(f"not in the GPU catalog (bench/data/gpus.csv); known: {', '.join(gpu_keys())}")
        return gpu

    @field_validator("gpu_memory_gb")
    @classmethod
    def _memory_matches_gpu(cls, memory_gb: float, info) -> float:
        spec = gpu_spec(info.data.get("gpu", ""))
        if spec is not None and memory_gb != spec.memory_gib:
            raise ValueError(f"{memory_gb:g} disagrees with the GPU catalog's {spec.gpu} ({spec.memory_gib:g})")
        return memory_gb

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
            text = Path(path).read_text()
        except OSError as exc:
            raise CatalogError(f"{name}: cannot read the instance catalog ({exc.strerror})") from None
    return Catalog(name, _parse(name, text))


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
        raise CatalogError(f"{where}, column {column}: {values.get(column)!r}: {message}") from None
