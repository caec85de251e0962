"""SkyPilot's public price catalogs (`catalogs/<version>/<cloud>/vms.csv` in skypilot-org/skypilot-catalog)
read into this project's instance catalog (`bench.cost.catalog`), so a fresh SkyPilot file refreshes prices
in one command (`bench catalog import FILE`).

What the files hold, and the rules below, are in docs/catalog.md. In short: columns are read by name
(each cloud orders them differently); one row per instance type, region and zone; on GCP the GPUs of an
a2/a3/a4/g2 machine are priced on a row of their own, added to the machine's row. A row becomes one
catalog price per (instance, region): on-demand from `Price`, spot the cheapest zone's `SpotPrice`
(SkyPilot's own rule), the GPU named by a bench `gpu` key. What cannot be read so is left out and said.
The files carry no date: the date the prices were seen is the user's (`--observed`).
"""

from __future__ import annotations

import csv
import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from bench.cost.catalog import Instance
from bench.errors import CatalogError, OptionError
from bench.measure.hardware import gpu_spec

READ = ("InstanceType", "AcceleratorName", "AcceleratorCount", "vCPUs", "Price", "SpotPrice", "Region")
"""The columns an import reads; every SkyPilot vms.csv layout has them (in its own order)."""
LAYOUTS = {
    "aws, gcp (catalogs/v7)": ("InstanceType", "AcceleratorName", "AcceleratorCount", "vCPUs", "MemoryGiB",
                               "GpuInfo", "Price", "SpotPrice", "Region", "AvailabilityZone"),
    "azure (catalogs/v6)": ("InstanceType", "AcceleratorName", "AcceleratorCount", "vCPUs", "MemoryGiB", "GpuInfo",
                            "Price", "SpotPrice", "Region", "Generation"),
    "lambda (catalogs/v7)": ("InstanceType", "AcceleratorName", "AcceleratorCount", "vCPUs", "MemoryGiB", "Price",
                             "Region", "GpuInfo", "SpotPrice"),
    "runpod (catalogs/v7)": ("InstanceType", "AcceleratorName", "AcceleratorCount", "vCPUs", "MemoryGiB", "GpuInfo",
                             "Region", "SpotPrice", "Price", "AvailabilityZone"),
}
"""The headers seen (read 2026-12-01); any header holding the READ columns is accepted."""

GPU_KEYS = {
    "A100": "A100-40GB", "A100-80GB": "A100-80GB", "A100-80GB-SXM": "A100-80GB",
    "H100": "H100-80GB", "H100-SXM": "H100-80GB", "H100-MEGA": "H100-80GB", "H100-NVL": "H100-NVL",
    "H200": "H200", "H200-SXM": "H200", "B200": "B200",
    "L4": "L4", "L40S": "L40S", "L40": "L40", "A10G": "A10G", "A10": "A10", "T4": "T4", "V100": "V100-16GB",
    "RTX3090": "RTX-3090", "RTX4090": "RTX-4090",
}
"""SkyPilot's accelerator name -> bench `gpu` key, where the name alone decides (matched case-insensitively).
SkyPilot's `H100` is the SXM card on aws p5 and gcp a3; `A100` the 40 GB SXM4 one; `V100` the 16 GB card."""

PROVIDER_GPU_KEYS = {
    "runpod": {"A100-80GB": "A100-80GB-PCIe", "H100": "H100-PCIe"},
}
"""Where one provider's name means another card: RunPod's `A100-80GB` and `H100` are its PCIe cards
(gpuTypeId 'NVIDIA A100 80GB PCIe', 'NVIDIA H100 PCIe': GPU_NAME_MAP in skypilot sky/provision/runpod/utils.py)."""

NOT_MAPPED = {
    ("azure", "H100"): "Azure's H100 is the SXM card on ND H100 v5 and another variant on NC H100 v5; "
                       "the catalog does not say which",
    ("lambda", "H100"): "Lambda's H100 is PCIe or SXM by instance name (_pcie / _sxm5); this name says neither",
}
"""(provider, accelerator) pairs that no single key fits; see `bench_gpu` for the instance names that decide."""

GCP_MACHINE_GPUS = {
    **{f"a2-highgpu-{n}g": ("A100", n) for n in (1, 2, 4, 8)}, "a2-megagpu-16g": ("A100", 16),
    **{f"a2-ultragpu-{n}g": ("A100-80GB", n) for n in (1, 2, 4, 8)},
    **{f"a3-highgpu-{n}g": ("H100", n) for n in (1, 2, 4, 8)}, "a3-megagpu-8g": ("H100-MEGA", 8),
    "a3-ultragpu-8g": ("H200", 8), "a4-highgpu-8g": ("B200", 8),
    **{f"g2-standard-{v}": ("L4", 1) for v in (4, 8, 12, 16, 32)},
    "g2-standard-24": ("L4", 2), "g2-standard-48": ("L4", 4), "g2-standard-96": ("L4", 8),
}
"""GCP machine types that come with GPUs, priced on a separate accelerator row of the file
(`_ACC_INSTANCE_TYPE_DICTS` in skypilot sky/catalog/gcp_catalog.py)."""

PRICE_SPREAD_FLAG = 2.0
"""On-demand prices of one instance type more than this factor apart across regions are flagged (seen:
gcp H100 x8 in us-central1 at 33.6 USD/h against 78.4 in us-east4, both in one file)."""


@dataclass(frozen=True)
class Imported:
    """What an import found: the prices, and every row it left out or doubts, in words."""

    path: str
    provider: str
    rows_read: int
    instances: tuple[Instance, ...]
    left_out: tuple[str, ...]
    """One line per reason and accelerator name: `3 row(s): accelerator V100-32GB: no bench GPU row`."""
    flags: tuple[str, ...]
    """Prices imported with a doubt (spot not below on-demand, zones disagreeing, regions far apart)."""


def provider_from_path(path: Path) -> str | None:
    """`.../catalogs/v7/aws/vms.csv` -> `aws`; None when the file is not a `<cloud>/vms.csv`.

    >>> provider_from_path(Path("skypilot-catalog/catalogs/v7/gcp/vms.csv")), provider_from_path(Path("x.csv"))
    ('gcp', None)
    """
    if path.name != "vms.csv" or not re.fullmatch(r"[A-Za-z0-9_-]+", path.parent.name):
        return None
    return path.parent.name.lower()


def bench_gpu(provider: str, accelerator: str, instance: str) -> tuple[str | None, str]:
    """(the bench `gpu` key, or None; why) for SkyPilot's accelerator name on `provider`'s `instance`.

    >>> bench_gpu("lambda", "H100", "gpu_1x_h100_pcie")[0], bench_gpu("runpod", "H100", "1x_H100_SECURE")[0]
    ('H100-PCIe', 'H100-PCIe')
    >>> bench_gpu("aws", "V100-32GB", "p3dn.24xlarge")
    (None, 'no bench GPU row for it (bench/data/gpus.csv)')
    """
    name = accelerator.upper()
    if provider == "lambda" and name == "H100":
        if "_pcie" in instance.lower():
            return "H100-PCIe", "Lambda _pcie instance"
        if "_sxm" in instance.lower():
            return "H100-80GB", "Lambda _sxm instance"
    if (provider, name) in NOT_MAPPED:
        return None, NOT_MAPPED[provider, name]
    keys = {k.upper(): v for k, v in {**GPU_KEYS, **PROVIDER_GPU_KEYS.get(provider, {})}.items()}
    if name in keys:
        return keys[name], "by name"
    return None, "no bench GPU row for it (bench/data/gpus.csv)"


@dataclass(frozen=True)
class _Offer:
    """One instance type in one region and zone, priced whole (GCP: machine + its GPUs)."""

    instance: str
    region: str
    zone: str
    gpu: str
    gpu_count: int
    vcpus: int | None
    usd_per_hour: float
    spot_usd_per_hour: float | None
    detail: str
    line: int


def read_skypilot(path: Path, *, observed: str, provider: str | None = None, source: str = "",
                  regions: tuple[str, ...] = ()) -> Imported:
    """The GPU instance prices of a SkyPilot `vms.csv`, as catalog rows observed on `observed`.

    `provider` defaults to the folder the file is in (`.../<cloud>/vms.csv`); `source` is added to
    every row's provenance; `regions` keeps only those regions.
    """
    name = str(path)
    rows = _read_rows(Path(path))
    provider = (provider or provider_from_path(Path(path)) or "").strip().lower()
    if not provider:
        raise OptionError(f"--provider: needed: {name} is not a <cloud>/vms.csv path, so which cloud it prices "
                          f"cannot be read from it (aws, gcp, azure, lambda, runpod, ...)")
    left_out: dict[str, Counter] = defaultdict(Counter)
    flags: list[str] = []
    machines, gpus = [], {}
    offers: list[_Offer] = []
    for line, row in rows:
        instance, accelerator = row["InstanceType"].strip(), row["AcceleratorName"].strip()
        region, zone = row["Region"].strip(), (row.get("AvailabilityZone") or "").strip()
        if regions and region not in regions:
            continue
        if accelerator.lower().startswith("tpu-"):
            left_out["TPU, not a GPU"][accelerator] += 1
        elif not instance and accelerator:
            count = _number(row, "AcceleratorCount", name, line)
            if count is None:
                left_out["GPU count missing or a fraction of a GPU"][accelerator] += 1
            else:
                gpus[accelerator.upper(), count, region, zone] = (row, line)
        elif not accelerator and instance in GCP_MACHINE_GPUS:
            machines.append((row, line))
        elif not accelerator:
            left_out["no accelerator (CPU-only instance types)"][""] += 1
        else:
            offer = _offer(row, line, name, provider, left_out)
            if offer is not None:
                offers.append(offer)
    joined = set()
    for row, line in machines:
        offer = _gcp_offer(row, line, gpus, name, provider, left_out, joined)
        if offer is not None:
            offers.append(offer)
    for key in gpus.keys() - joined:
        left_out["GCP accelerator row matching no machine row of the file (GPUs attached to N1 machines, or a "
                 "machine type not in the file)"][f"{key[1]:g}x {key[0]}"] += 1
    instances = _collapse(offers, name, provider, observed, _provenance(name, source), flags)
    return Imported(name, provider, len(rows), instances, tuple(_left_out_lines(left_out)), tuple(flags))


def _left_out_lines(left_out: dict[str, Counter], shown: int = 6) -> list[str]:
    """`3 row(s): reason: name, name (2)`, one line per reason, the names most frequent first."""
    lines = []
    for reason, names in left_out.items():
        named = [f"{n} ({c})" if c > 1 else n for n, c in names.most_common() if n]
        more = f", ... ({len(named) - shown} more)" if len(named) > shown else ""
        lines.append(f"{sum(names.values())} row(s): {reason}" + (f": {', '.join(named[:shown])}{more}" if named else ""))
    return lines


def _read_rows(path: Path) -> list[tuple[int, dict[str, str]]]:
    """(line number, row) of every data row; bad files are one CatalogError line."""
    name = str(path)
    if path.is_dir():
        raise CatalogError(f"{name}: is a directory; pass a SkyPilot vms.csv file (catalogs/<version>/<cloud>/vms.csv)")
    try:
        text = path.read_bytes().decode("utf-8-sig")  # a BOM (a spreadsheet's "CSV UTF-8") is not part of the header
    except OSError as exc:
        raise CatalogError(f"{name}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise CatalogError(f"{name}: not UTF-8 text (byte {exc.start}); a SkyPilot vms.csv is a UTF-8 CSV") from None
    reader = csv.DictReader(text.splitlines())
    header = [column.strip() for column in reader.fieldnames or []]
    missing = [column for column in READ if column not in header]
    if missing:
        layouts = "; ".join(f"{cloud}: {','.join(columns)}" for cloud, columns in LAYOUTS.items())
        raise CatalogError(f"{name}: header (line 1): not a SkyPilot vms.csv: missing column(s) "
                           f"{', '.join(missing)}; known layouts: {layouts}")
    reader.fieldnames = header
    rows = []
    for row in reader:
        if None in row:
            raise CatalogError(f"{name}: line {reader.line_num}: more fields than the header's {len(header)}")
        rows.append((reader.line_num, {key: value or "" for key, value in row.items()}))
    if not rows:
        raise CatalogError(f"{name}: no rows under the header")
    return rows


def _number(row: dict[str, str], column: str, name: str, line: int) -> float | None:
    text = row[column].strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise CatalogError(f"{name}: line {line}, column {column}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise CatalogError(f"{name}: line {line}, column {column}: {text!r} is not a finite number")
    return value


def _whole(value: float | None) -> int | None:
    return int(value) if value is not None and value > 0 and float(value).is_integer() else None


def _offer(row: dict[str, str], line: int, name: str, provider: str, left_out) -> _Offer | None:
    """A whole instance (GPUs included) on one row: aws, azure, lambda, runpod."""
    instance, accelerator = row["InstanceType"].strip(), row["AcceleratorName"].strip()
    gpu, why = bench_gpu(provider, accelerator, instance)
    if gpu is None:
        left_out[f"accelerator {accelerator} not mapped to a bench GPU: {why}"][instance] += 1
        return None
    return _priced(row, line, name, instance, gpu, _number(row, "AcceleratorCount", name, line),
                   _number(row, "Price", name, line), _number(row, "SpotPrice", name, line), "", left_out)


def _gcp_offer(row: dict[str, str], line: int, gpus: dict, name: str, provider: str, left_out,
               joined: set) -> _Offer | None:
    """A GCP machine row plus the accelerator row of its GPUs in the same region and zone."""
    instance = row["InstanceType"].strip()
    accelerator, count = GCP_MACHINE_GPUS[instance]
    gpu, why = bench_gpu(provider, accelerator, instance)
    if gpu is None:
        left_out[f"accelerator {accelerator} not mapped to a bench GPU: {why}"][instance] += 1
        return None
    region, zone = row["Region"].strip(), (row.get("AvailabilityZone") or "").strip()
    key = (accelerator.upper(), float(count), region, zone)
    found = gpus.get(key)
    if found is None:
        left_out["GCP machine row without the accelerator row of its GPUs (same region and zone)"][instance] += 1
        return None
    joined.add(key)
    gpu_row, gpu_line = found
    machine, machine_spot = _number(row, "Price", name, line), _number(row, "SpotPrice", name, line)
    gpus_price, gpus_spot = _number(gpu_row, "Price", name, gpu_line), _number(gpu_row, "SpotPrice", name, gpu_line)
    if machine is None or gpus_price is None:
        left_out["no on-demand price (Price empty)"][instance] += 1
        return None
    spot = None if machine_spot is None or gpus_spot is None else machine_spot + gpus_spot
    detail = (f"GCP machine {machine} + {count}x {accelerator} {gpus_price} (line {gpu_line})"
              + (f", spot {machine_spot} + {gpus_spot}" if spot is not None else ""))
    return _priced(row, line, name, instance, gpu, float(count), machine + gpus_price, spot, detail, left_out)


def _priced(row, line, name, instance, gpu, count, price, spot, detail, left_out) -> _Offer | None:
    if price is None or price <= 0:
        left_out["no on-demand price (Price empty)"][instance] += 1
        return None
    gpu_count = _whole(count)
    if gpu_count is None:
        left_out["GPU count missing or a fraction of a GPU"][instance] += 1
        return None
    named = _count_in_name(instance)
    if named is not None and named != gpu_count:
        left_out["GPU count contradicts the instance name"][f"{instance} says {named}, the file {gpu_count}"] += 1
        return None
    return _Offer(instance, row["Region"].strip(), (row.get("AvailabilityZone") or "").strip(), gpu, gpu_count,
                  _whole(_number(row, "vCPUs", name, line)), round(price, 6),
                  None if spot is None or spot <= 0 else round(spot, 6), detail, line)


def _count_in_name(instance: str) -> int | None:
    """The GPU count an instance name states, if it states one.

    >>> _count_in_name("gpu_8x_h100_sxm5"), _count_in_name("1x_H100_SECURE"), _count_in_name("a3-highgpu-8g")
    (8, 1, 8)
    >>> _count_in_name("p5.48xlarge"), _count_in_name("Standard_ND96isr_H100_v5")
    (None, None)
    """
    found = re.search(r"(?:^|_)(\d+)x_", instance) or re.search(r"gpu-(\d+)g$", instance)
    return int(found.group(1)) if found else None


def _collapse(offers: list[_Offer], name: str, provider: str, observed: str, source: str,
              flags: list[str]) -> tuple[Instance, ...]:
    """One price per (instance, region): the zones' on-demand price (the lowest if they differ, as SkyPilot
    takes it), spot the cheapest zone's; then one `all` row for an instance priced the same in every region."""
    by_region: dict[tuple[str, str], list[_Offer]] = defaultdict(list)
    for offer in offers:
        by_region[offer.instance, offer.region].append(offer)
    regional: list[_Offer] = []
    for (instance, region), zones in by_region.items():
        shapes = {(o.gpu, o.gpu_count, o.vcpus) for o in zones}
        if len(shapes) > 1:
            flags.append(f"{instance} {region}: zones disagree on GPUs or vCPUs ({sorted(shapes, key=str)}); left out")
            continue
        prices = sorted({o.usd_per_hour for o in zones})
        if len(prices) > 1:
            flags.append(f"{instance} {region}: on-demand differs across zones ({', '.join(map(str, prices))}); "
                         f"used the lowest, as SkyPilot does")
        spots = [o for o in zones if o.spot_usd_per_hour is not None]
        cheapest = min(spots, key=lambda o: o.spot_usd_per_hour, default=None)
        spot = cheapest.spot_usd_per_hour if cheapest else None
        if spot is not None and spot >= prices[0]:
            flags.append(f"{instance} {region}: spot {spot} is not below on-demand {prices[0]}; spot left empty")
            spot = None
        details = [zones[0].detail] if zones[0].detail else []
        if spot is not None and len(zones) > 1:
            details.append(f"spot = cheapest of {len(zones)} zones ({cheapest.zone})")
        regional.append(_Offer(instance, region, cheapest.zone if cheapest else zones[0].zone, zones[0].gpu,
                               zones[0].gpu_count, zones[0].vcpus, prices[0], spot, "; ".join(details),
                               zones[0].line))
    instances = []
    by_instance: dict[str, list[_Offer]] = defaultdict(list)
    for offer in regional:
        by_instance[offer.instance].append(offer)
    for instance, offers_ in by_instance.items():
        lowest, highest = min(o.usd_per_hour for o in offers_), max(o.usd_per_hour for o in offers_)
        if highest > PRICE_SPREAD_FLAG * lowest:
            cheap = min(offers_, key=lambda o: o.usd_per_hour)
            dear = max(offers_, key=lambda o: o.usd_per_hour)
            flags.append(f"{instance}: on-demand {cheap.usd_per_hour} in {cheap.region} but {dear.usd_per_hour} "
                         f"in {dear.region} (more than {PRICE_SPREAD_FLAG:g}x apart); check the file before using it")
        same = {(o.usd_per_hour, o.spot_usd_per_hour, o.vcpus, o.gpu, o.gpu_count, o.detail) for o in offers_}
        if len(offers_) > 1 and len(same) == 1:
            first = offers_[0]
            note = f"same price in all {len(offers_)} regions of the file ({', '.join(o.region for o in offers_)})"
            offers_ = [_Offer(instance, "all", "", first.gpu, first.gpu_count, first.vcpus, first.usd_per_hour,
                              first.spot_usd_per_hour, "; ".join(filter(None, [first.detail, note])), first.line)]
        instances += [_instance(o, name, provider, observed, source) for o in offers_]
    return tuple(instances)


COLUMN_OF = {"instance": "InstanceType", "region": "Region", "gpu_count": "AcceleratorCount", "vcpus": "vCPUs",
             "usd_per_hour": "Price", "spot_usd_per_hour": "SpotPrice"}
"""The SkyPilot column each catalog field is read from (named when a value is refused)."""


def _instance(offer: _Offer, name: str, provider: str, observed: str, source: str) -> Instance:
    spec = gpu_spec(offer.gpu)
    assert spec is not None  # every key in the maps above is a gpus.csv row (tests/test_catalog.py)
    try:
        return Instance(provider=provider, instance=offer.instance, gpu=offer.gpu, gpu_count=offer.gpu_count,
                        gpu_memory_gb=spec.memory_gib, usd_per_hour=offer.usd_per_hour,
                        spot_usd_per_hour=offer.spot_usd_per_hour, region=offer.region, observed=observed,
                        source=source.format(line=offer.line) + (f"; {offer.detail}" if offer.detail else ""),
                        vcpus=offer.vcpus)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else ""
        value = repr(error.get("input"))
        value = value if len(value) <= 60 else value[:57] + "..."
        message = error["msg"].removeprefix("Value error, ")
        raise CatalogError(f"{name}: line {offer.line}, column {COLUMN_OF.get(field, field)}: {value}: {message} "
                           f"(catalog column {field})") from None


def _provenance(name: str, source: str) -> str:
    """The source of every imported row, with `{line}` for the row's line in the file."""
    text = f"SkyPilot catalog {name}".replace("{", "{{").replace("}", "}}") + " line {line}"
    note = source.replace("{", "{{").replace("}", "}}")
    return text + (f" ({note})" if note else "") + ", read by bench catalog import"
