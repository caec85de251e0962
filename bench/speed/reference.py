"""The calibration data: timm's RTX 3090 training throughput, a traced subset of it, and its families.

`bench/data/reference/timm_rtx3090_train_amp.csv` holds the measurements (source and conditions
in the README beside it). Tracing all ~800 models would take an hour, so `select_rows` takes an
even spread of `PER_FAMILY` models from each of `FAMILIES` (slowest to fastest), both memory
formats; `trace_reference` traces them (AMP fp16, SGD, the row's batch, `attention = "eager"`:
PyTorch 1.12 had no fused attention) and `write_reference_ops` stores their op tables, grouped,
in `reference_ops.csv.gz`, which the fit reads. Only the channels-last row of a model is traced:
its contiguous row is the same ops with the convolutions' inputs marked not channels-last (the
op sequence of the two formats is the same; what differs is the convolution kernels' speed).
"""

from __future__ import annotations

import csv
import gzip
import io
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable

import numpy as np
import timm

from bench.grid.cell import Cell
from bench.memory.estimate import FakeModels
from bench.speed.trace import DTYPES, OP_CLASSES, OpTable, trace_step_ops

REFERENCE_FOLDER = "reference"
MEASUREMENTS_FILE = "timm_rtx3090_train_amp.csv"
OPS_FILE = "reference_ops.csv.gz"
REFERENCE_GPU = "RTX-3090"
REFERENCE_PRECISION = "fp16"
PER_FAMILY = 6

FAMILIES: dict[str, str] = {
    "resnet": r"(resnet|resnetv2|resnext|seresnet|seresnext|resnetrs|ecaresnet|wide_resnet)\d.*",
    "vit": r"(vit|deit|deit3|beit|cait)_.*",
    "convnext": r"convnext_.*",
    "efficientnet": r"(tf_)?(efficientnet|efficientnetv2|mixnet|mnasnet|tinynet)_.*",
    "mobilenet": r"(tf_)?(mobilenetv2|mobilenetv3|lcnet|ghostnet|fbnetc|fbnetv3)_.*",
    "regnet": r"regnet[xyz]_.*",
    "swin": r"swin(v2)?_.*",
    "xcit": r"xcit_.*",
    "nfnet": r"(nf_|nfnet_|dm_nfnet_|eca_nfnet_).*",
    "mlp": r"(mixer|resmlp|gmixer|gmlp)_.*",
    "vgg": r"(vgg|repvgg_)\w*",
    "densenet": r"densenet\d+\w*",
}
"""The families of the leave-one-family-out validation: timm name patterns, each matched whole."""


@dataclass(frozen=True)
class ReferenceRow:
    model: str
    memory_format: str
    samples_per_s: float
    batch_size: int
    image_size: int
    family: str

    @property
    def trace(self) -> str:
        """The row's key in the ops file: `resnet34:channels_last`."""
        return f"{self.model}:{self.memory_format}"

    def cell(self) -> Cell:
        """The cell that reproduces the row's conditions (one optimizer step, no accumulation)."""
        return Cell(experiment="reference", profile="cuda", model=self.model, image_size=self.image_size,
                    micro_batch=self.batch_size, accum_steps=1, precision=REFERENCE_PRECISION,
                    checkpointing="off", optimizer="sgd", channels_last=self.memory_format == "channels_last",
                    warmup_steps=1, measured_steps=1, attention="eager")


def family_of(model: str) -> str | None:
    """The validation family a timm name belongs to, or None.

    >>> family_of("resnet34d"), family_of("vit_small_patch16_224"), family_of("dla34")
    ('resnet', 'vit', None)
    """
    found = [name for name, pattern in FAMILIES.items() if re.fullmatch(pattern, model)]
    if len(found) > 1:
        raise ValueError(f"{model} matches families {found}: patterns must not overlap")
    return found[0] if found else None


def reference_rows() -> list[ReferenceRow]:
    """Every measured row of a model timm still builds and a family knows."""
    text = resources.files("bench.data").joinpath(REFERENCE_FOLDER, MEASUREMENTS_FILE).read_text()
    rows = []
    for row in csv.DictReader(text.splitlines()):
        family = family_of(row["model"])
        if family and timm.is_model(row["model"]):
            rows.append(ReferenceRow(row["model"], row["memory_format"], float(row["train_samples_per_s"]),
                                     int(row["batch_size"]), int(row["image_size"]), family))
    return rows


def select_rows(rows: list[ReferenceRow], per_family: int = PER_FAMILY) -> list[ReferenceRow]:
    """`per_family` models per family, evenly spread from slowest to fastest, both memory formats."""
    formats: dict[str, set[str]] = {}
    for row in rows:
        formats.setdefault(row.model, set()).add(row.memory_format)
    chosen: set[str] = set()
    for family in FAMILIES:
        ranked = sorted({(row.samples_per_s, row.model) for row in rows if row.family == family
                         and row.memory_format == "channels_last" and len(formats[row.model]) == 2})
        picks = np.unique(np.linspace(0, len(ranked) - 1, min(per_family, len(ranked))).round().astype(int))
        chosen |= {ranked[i][1] for i in picks}
    return sorted((row for row in rows if row.model in chosen), key=lambda r: r.trace)


def trace_reference(rows: list[ReferenceRow], on_trace: Callable[[ReferenceRow, str], None] | None = None
                    ) -> dict[str, OpTable]:
    """Each row's one-step op table, grouped; a model that cannot be traced is reported and left out."""
    tables = {}
    for row in rows:
        if row.memory_format != "channels_last":
            continue
        try:
            table = trace_step_ops(row.cell(), FakeModels()).for_step(1)
            tables[row.trace] = table.grouped()
            contiguous = ReferenceRow(row.model, "contiguous", 0.0, row.batch_size, row.image_size, row.family)
            tables[contiguous.trace] = OpTable(table.op_class, table.dtype, table.flops, table.bytes_moved,
                                               np.zeros_like(table.channels_last), table.count).grouped()
            outcome = "traced"
        except Exception as exc:  # noqa: BLE001 - a model fake tensors cannot run is left out, named
            outcome = f"left out: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}"
        if on_trace:
            on_trace(row, outcome)
    return tables


_OPS_COLUMNS = ("trace", "op_class", "dtype", "flops", "bytes_moved", "channels_last", "count")


def write_reference_ops(tables: dict[str, OpTable], path: Path) -> None:
    """The grouped tables as a gzip'd CSV, byte-for-byte the same for the same tables."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(_OPS_COLUMNS)
    for trace in sorted(tables):
        t = tables[trace]
        for i in range(len(t.count)):
            writer.writerow((trace, OP_CLASSES[t.op_class[i]], DTYPES[t.dtype[i]], int(t.flops[i]),
                             int(t.bytes_moved[i]), int(t.channels_last[i]), int(t.count[i])))
    with path.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as handle:
        handle.write(text.getvalue().encode())


def read_reference_ops(path: Path | None = None) -> dict[str, OpTable]:
    """The stored tables, by trace key."""
    data = path.read_bytes() if path else \
        resources.files("bench.data").joinpath(REFERENCE_FOLDER, OPS_FILE).read_bytes()
    rows: dict[str, list[tuple]] = {}
    for row in csv.DictReader(io.StringIO(gzip.decompress(data).decode())):
        rows.setdefault(row["trace"], []).append(
            (OP_CLASSES.index(row["op_class"]), DTYPES.index(row["dtype"]), float(row["flops"]),
             float(row["bytes_moved"]), row["channels_last"] == "1", float(row["count"])))
    tables = {}
    for trace, entries in rows.items():
        c = list(zip(*entries))
        tables[trace] = OpTable(np.array(c[0], dtype=np.int8), np.array(c[1], dtype=np.int8), np.array(c[2]),
                                np.array(c[3]), np.array(c[4], dtype=bool), np.array(c[5]))
    return tables
