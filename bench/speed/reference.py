"""The calibration data: public throughput measurements on several GPUs, their traces, and their families.

Three sources, copied into `bench/data/reference/` with their provenance (README there):

- timm's RTX 3090 training benchmark (AMP fp16, SGD, PyTorch 1.12, eager attention): `select_rows`
  takes an even spread of `PER_FAMILY` models from each of `FAMILIES`, both memory formats.
- NVIDIA DeepLearningExamples ConvNets (ResNeXt101-32x4d, SE-ResNeXt101-32x4d, EfficientNet-B0/B4)
  training and inference on A100-40/80GB, V100-16/32GB and T4, one GPU, AMP / TF32 / FP32. Their
  training rows ran with a real data loader (DALI): an input-bound row reads slower than the model.
- timm's inference benchmark (AMP fp16, PyTorch 2.4 and 2.9, fused attention) on the RTX 3090 and 4090:
  4 models per family (`timm_infer_sample.csv`), traced forward-only through the same recorder.
- Lambda's PyTorch training benchmark on H100, H200 and B200 (`lambda_v2_train.csv`): its one-GPU BERT rows
  (`lambda_rows`), traced through a ViT of BERT's encoder shapes (`STANDINS`): the only Hopper and Blackwell rows.

Only the channels-last trace of a configuration is recorded: its contiguous row is the same ops with the
convolutions' inputs marked not channels-last. fp16 and bf16 share a trace, tf32 and fp32 share one (the
same shapes); the GPU rates tell them apart. `write_reference_ops` stores the grouped tables in
`reference_ops.csv.gz`, which the fit reads, so it is fast and byte-for-byte reproducible.
"""

from __future__ import annotations

import csv
import gzip
import io
import re
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Callable, Literal

import numpy as np
import timm
import torch

from bench.grid.cell import Cell
from bench.measure.hardware import gpu_keys
from bench.memory.fake_models import FakeModels
from bench.measure.ops import OpRecorder
from bench.measure.op_table import DTYPES, OP_CLASSES, OpTable
from bench.memory.traces import trace_step_ops
from bench.train.models import synthetic_batch
from bench.train.step import autocast_for, configure_precision

REFERENCE_FOLDER = "reference"
MEASUREMENTS_FILE = "timm_rtx3090_train_amp.csv"
DLE_FILE = "dle_convnets_perf.csv"
INFER_FILE = "timm_infer_sample.csv"
LAMBDA_FILE = "lambda_v2_train.csv"
OPS_FILE = "reference_ops.csv.gz"
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

DLE_GPUS = {"A100-SXM4-40GB": "A100-40GB", "A100-SXM4-80GB": "A100-80GB", "V100-SXM2-16GB": "V100-16GB",
            "V100-SXM2-32GB": "V100-32GB", "T4": "T4"}
"""DLE's GPU names -> catalog keys (the DGX-2's V100-SXM3-32GB has no sourced clock or bandwidth: left out)."""
DLE_PRECISIONS = {"AMP": "fp16", "TF32": "tf32", "FP32": "fp32"}
DLE_DOUBTS = ("SUSPECT", "old_stack_APEX_AMP_NCHW", "Throughput_Avg_differs")
"""Flags of rows whose compiler doubted them (throughput_sources.md): a suspect 1-GPU table, 19.10's APEX
stack with no stated batch, a throughput that disagrees with its own latency. Left out of the fit."""
INFER_GPUS = {"RTX 3090": "RTX-3090", "RTX 4090": "RTX-4090"}
"""The RTX 5090 and RTX PRO 6000 rows are left out: no dense tensor peak of theirs has a source."""
LAMBDA_DOUBTS = ("BERT_STEPS_SHORT", "BACKUP_FOLDER")
TIMM_TRAIN_STACK = "PyTorch 1.12"
"""timm's RTX 3090 training table's software (the folder's README); DLE's rows name their NGC container."""
CUDNN8_SOURCES = ("timm-train", "dle-train", "dle-infer")
"""Sources measured on PyTorch 1.x and cuDNN 8: timm's RTX 3090 training table (PyTorch 1.12) and DLE's tables
(NGC containers 19.10-21.03). timm's inference tables (PyTorch 2.4, 2.9) and Lambda's (NGC 24.03-25.06) are
torch 2 with cuDNN 9."""
"""Flags of Lambda rows left out: a run that stopped before the steps its figure counts, a scratch folder of mixed
containers (the folder's README)."""


@dataclass(frozen=True)
class Standin:
    """A timm model built to the shapes of a model timm does not have: what its rows are traced through."""

    timm_model: str
    model_kwargs: str
    """The factory's keyword arguments, JSON."""
    sequence: int
    """Tokens per sample: the input is one row of `sequence` 16 x 16 patches."""
    num_classes: int
    why: str


_BERT_KWARGS = ('{"class_token": false, "global_pool": "avg", "drop_rate": 0.1, "proj_drop_rate": 0.1, '
                '"attn_drop_rate": 0.1, "img_size": [16, 6144]}')
STANDINS = {
    "bert_base_squad": Standin("vit_base_patch16_224", _BERT_KWARGS, 384, 2,
                               "BERT-base's encoder: 12 layers, width 768, 12 heads, MLP 3072, dropout 0.1; 384 "
                               "tokens (SQuAD's sequence) as 384 patches, no class token"),
    "bert_large_squad": Standin("vit_large_patch16_224", _BERT_KWARGS, 384, 2,
                                "BERT-large's encoder: 24 layers, width 1024, 16 heads, MLP 4096, dropout 0.1; 384 "
                                "tokens as 384 patches, no class token"),
}
"""Lambda's BERT SQuAD fine-tuning as a ViT of the same encoder shapes. Left different: the patch embedding (a
16 x 16 convolution, under 1 % of the FLOPs) stands for BERT's token embedding lookup, pre-norm for BERT's
post-norm (the same ops), a 2-way pooled head for SQuAD's per-token start/end logits; the optimizer is the
runner's AdamW (BERT's fp16 path uses apex's fused Adam, its fp32 path an unfused one)."""


@dataclass(frozen=True)
class ReferenceRow:
    source: str
    """`timm-train`, `dle-train`, `dle-infer` or `timm-infer`."""
    gpu: str
    """Catalog key."""
    mode: Literal["train", "infer"]
    precision: str
    """fp16 (AMP), tf32 or fp32."""
    model: str
    memory_format: str
    """channels_last or contiguous."""
    samples_per_s: float
    batch_size: int
    image_size: int
    """Pixels; tokens for a model traced through a stand-in (`STANDINS`)."""
    family: str
    attention: str = "eager"
    stack: str = ""
    """The software the row ran on, where the source names it per row (Lambda's NGC container)."""

    @property
    def cudnn8(self) -> bool:
        """The row ran on PyTorch 1.x with cuDNN 8 (`CUDNN8_SOURCES`), whose channels-last grouped convolutions
        train off the tensor cores (`bench.speed.model`); the runner's torch 2 and cuDNN 9 do not."""
        return self.source in CUDNN8_SOURCES

    @property
    def trace(self) -> str:
        """The row's key in the ops file: `train:resnet34:224px:b256:half:eager:channels_last`."""
        kind = "half" if self.precision in ("fp16", "bf16") else "float"
        size = f"{self.image_size}tok" if self.model in STANDINS else f"{self.image_size}px"
        return f"{self.mode}:{self.model}:{size}:b{self.batch_size}:{kind}:{self.attention}:{self.memory_format}"

    def cell(self) -> Cell:
        """The cell that reproduces the row's conditions (one optimizer step, no accumulation)."""
        cell = Cell(experiment="reference", profile="cuda", model=self.model, image_size=self.image_size,
                    micro_batch=self.batch_size, accum_steps=1,
                    precision="fp16" if self.precision in ("fp16", "bf16") else "fp32", checkpointing="off",
                    optimizer="sgd", channels_last=self.memory_format == "channels_last", warmup_steps=1,
                    measured_steps=1, attention=self.attention)
        standin = STANDINS.get(self.model)
        if standin is None:
            return cell
        return replace(cell, model=standin.timm_model, model_kwargs=standin.model_kwargs, image_size=16,
                       image_width=16 * standin.sequence, num_classes=standin.num_classes, optimizer="adamw")


def family_of(model: str) -> str | None:
    """The validation family a timm name belongs to, or None.

    >>> family_of("resnet34d"), family_of("vit_small_patch16_224"), family_of("dla34")
    ('resnet', 'vit', None)
    """
    found = [name for name, pattern in FAMILIES.items() if re.fullmatch(pattern, model)]
    if len(found) > 1:
        raise ValueError(f"{model} matches families {found}: patterns must not overlap")
    return found[0] if found else None


def _read(name: str) -> list[dict]:
    return list(csv.DictReader(resources.files("bench.data").joinpath(REFERENCE_FOLDER, name)
                               .read_text().splitlines()))


def timm_train_rows() -> list[ReferenceRow]:
    """Every RTX 3090 training row of a model timm still builds and a family knows."""
    rows = []
    for row in _read(MEASUREMENTS_FILE):
        family = family_of(row["model"])
        if family and timm.is_model(row["model"]):
            rows.append(ReferenceRow("timm-train", "RTX-3090", "train", "fp16", row["model"], row["memory_format"],
                                     float(row["train_samples_per_s"]), int(row["batch_size"]),
                                     int(row["image_size"]), family, stack=TIMM_TRAIN_STACK))
    return rows


def dle_rows(n_gpus: int = 1) -> list[ReferenceRow]:
    """DLE rows on `n_gpus` GPUs of a catalog GPU, a registered timm model and a stated batch size
    (samples/s per GPU), each configuration once (the latest table that holds it)."""
    rows: dict[tuple, ReferenceRow] = {}
    for row in _read(DLE_FILE):
        if int(row["n_gpus"]) != n_gpus or row["gpu"] not in DLE_GPUS or not row["batch_size_per_gpu"] \
                or not timm.is_model(row["timm_equiv"]) or any(doubt in row["flags"] for doubt in DLE_DOUBTS):
            continue
        memory_format = "channels_last" if row["memory_format"] == "nhwc" else "contiguous"
        ref = ReferenceRow(f"dle-{row['mode']}", DLE_GPUS[row["gpu"]], row["mode"], DLE_PRECISIONS[row["precision"]],
                           row["timm_equiv"], memory_format, float(row["img_per_s_per_gpu"]),
                           int(float(row["batch_size_per_gpu"])), int(row["img_size"]), family_of(row["timm_equiv"]),
                           stack=row["container"])
        key = (ref.trace, ref.gpu, ref.precision)
        if key not in rows or row["is_latest_table"] == "1":
            rows[key] = ref
    return sorted(rows.values(), key=lambda r: (r.trace, r.gpu, r.precision))


def timm_infer_rows() -> list[ReferenceRow]:
    """The sampled timm inference rows on the RTX 3090 and 4090."""
    return [ReferenceRow("timm-infer", INFER_GPUS[row["gpu"]], "infer", "fp16", row["model"],
                         "channels_last" if row["memory_format"] == "nhwc" else "contiguous",
                         float(row["samples_per_s"]), int(row["batch_size"]), int(row["img_size"]),
                         family_of(row["model"]), "sdpa") for row in _read(INFER_FILE)]


def lambda_systems() -> list[ReferenceRow]:
    """Lambda's one-GPU BERT training rows of catalog GPUs without a doubt flag, one per system as published
    (sequences/s per GPU)."""
    known = set(gpu_keys())
    return [ReferenceRow("lambda-train", row["gpu"], "train", row["precision"], row["model"], "contiguous",
                         float(row["throughput_per_gpu"]), int(row["batch_per_gpu"]), STANDINS[row["model"]].sequence,
                         "bert", stack=row["container"])
            for row in _read(LAMBDA_FILE)
            if row["model"] in STANDINS and row["gpus"] == "1" and row["gpu"] in known
            and not any(f"[{doubt}]" in row["notes"] for doubt in LAMBDA_DOUBTS)]


def lambda_rows() -> list[ReferenceRow]:
    """`lambda_systems`, one row per configuration (GPU, model, precision, batch, container): the median of its
    systems. The 38 H100 hosts that ran the same four configurations are four measurements, not 152."""
    groups: dict[ReferenceRow, list[float]] = {}
    for row in lambda_systems():
        groups.setdefault(replace(row, samples_per_s=0.0), []).append(row.samples_per_s)
    return [replace(row, samples_per_s=float(np.median(values))) for row, values in groups.items()]


def select_rows(rows: list[ReferenceRow], per_family: int = PER_FAMILY) -> list[ReferenceRow]:
    """`per_family` timm training models per family, evenly spread from slowest to fastest, both formats."""
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


INPUT_HEADROOM = 1.25
"""A TF32 or FP32 training row joins the fit only where its own table shows its input pipeline feeding at
least this multiple of its rate (`input_headroom`): DLE's rows read real ImageNet through a loader, and a
row the loader held back would pull the TF32 efficiency down with it."""


def input_headroom(row: ReferenceRow, rows: list[ReferenceRow]) -> float | None:
    """How much faster than `row` its input pipeline demonstrably fed: the fastest fp16 row of the same source,
    GPU, model and software over `row`'s samples/s (None: no such row, nothing shows the loader kept up)."""
    partners = [p.samples_per_s for p in rows if (p.source, p.gpu, p.model, p.stack, p.mode, p.precision)
                == (row.source, row.gpu, row.model, row.stack, row.mode, "fp16")]
    return max(partners) / row.samples_per_s if partners else None


def not_input_bound(rows: list[ReferenceRow]) -> list[ReferenceRow]:
    """`rows` without the TF32 and FP32 training rows whose table does not show their loader feeding
    `INPUT_HEADROOM` times their rate (fp16 and inference rows are kept as they are)."""
    return [row for row in rows if row.mode != "train" or row.precision == "fp16"
            or (input_headroom(row, rows) or 0.0) >= INPUT_HEADROOM]


def candidate_rows() -> list[ReferenceRow]:
    """The traced timm training subset, DLE's one-GPU rows, the timm inference sample, Lambda's one-GPU BERT rows."""
    return select_rows(timm_train_rows()) + dle_rows() + timm_infer_rows() + lambda_rows()


def reference_rows() -> list[ReferenceRow]:
    """Every calibration row: `candidate_rows`, TF32 and FP32 training rows only where they are not input-bound."""
    return not_input_bound(candidate_rows())


def trace_forward(row: ReferenceRow, models: FakeModels) -> OpTable:
    """An inference row's ops: one forward pass in eval mode, no gradients, under the row's autocast."""
    cell = row.cell()
    configure_precision(cell.precision)
    model = models.get(cell)
    recorder = OpRecorder()
    model.eval()
    try:
        with models.mode:
            images, _ = synthetic_batch(cell.micro_batch, cell.image_size, channels_last=cell.channels_last,
                                        device="cpu")
            with torch.no_grad(), autocast_for(cell.precision, "cpu"), recorder:
                model(images)
    finally:
        model.train()
    return OpTable.of(recorder.records)


def trace_reference(rows: list[ReferenceRow], on_trace: Callable[[ReferenceRow, str], None] | None = None
                    ) -> dict[str, OpTable]:
    """Each configuration's op table, grouped; a model that cannot be traced is reported and left out."""
    tables: dict[str, OpTable] = {}
    models = FakeModels()
    for row in rows:
        traced = replace(row, memory_format="channels_last")
        if traced.trace in tables:
            continue
        try:
            table = trace_step_ops(traced.cell(), models).for_step(1) if row.mode == "train" else \
                trace_forward(traced, models)
            tables[traced.trace] = table.grouped()
            tables[replace(traced, memory_format="contiguous").trace] = \
                replace(table, channels_last=np.zeros_like(table.channels_last)).grouped()
            outcome = "traced"
        except Exception as exc:  # noqa: BLE001 - a model fake tensors cannot run is left out, named
            outcome = f"left out: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}"
        if on_trace:
            on_trace(row, outcome)
    return tables


_OPS_COLUMNS = ("trace", "op_class", "dtype", "flops", "bytes_moved", "channels_last", "count", "out_elements")


def write_reference_ops(tables: dict[str, OpTable], path: Path) -> None:
    """The grouped tables as a gzip'd CSV, byte-for-byte the same for the same tables."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(_OPS_COLUMNS)
    for trace in sorted(tables):
        t = tables[trace]
        for i in range(len(t.count)):
            writer.writerow((trace, OP_CLASSES[t.op_class[i]], DTYPES[t.dtype[i]], int(t.flops[i]),
                             int(t.bytes_moved[i]), int(t.channels_last[i]), int(t.count[i]),
                             int(t.out_elements[i])))
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
             float(row["bytes_moved"]), row["channels_last"] == "1", float(row["count"]), float(row["out_elements"])))
    tables = {}
    for trace, entries in rows.items():
        c = list(zip(*entries))
        tables[trace] = OpTable(np.array(c[0], dtype=np.int8), np.array(c[1], dtype=np.int8), np.array(c[2]),
                                np.array(c[3]), np.array(c[4], dtype=bool), np.array(c[5]), np.array(c[6]))
    return tables
