"""The estimator judged on timm's RTX 3090 AMP training benchmark: hundreds of fit/OOM observations.

timm's `benchmark.py --bench train --amp` starts every model at batch 512 and, on an out-of-memory
error, retries at `timm.utils.decay_batch_step(batch)` (512, 384, 256, 192, 128, 96, 64, ...).
So each row of `bench/data/reference/timm_rtx3090_train_amp.csv` says two things: its
`batch_size` fitted in the card's memory, and (below 512) the previous size of that sequence did
not. Each side is estimated here under the benchmark's conditions (`validation_cell`) and
compared with what the card holds by the project's fit rule (`CUDA_CONTEXT_NOTE`). Rows are written as they are estimated, so a
run can stop and resume (`validate`).
"""

from __future__ import annotations

import csv
import random
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import pandas as pd

from bench.grid.cell import Cell
from bench.grid.model_ref import kind_of
from bench.memory.allocator import whole_segments
from bench.memory.fake_models import FakeModels
from bench.memory.fit import DEFAULT_HEADROOM, memory_fit
from bench.results.read import read_table
from bench.results.schema import Column

REFERENCE = Path(__file__).resolve().parent.parent / "data" / "reference" / "timm_rtx3090_train_amp.csv"
START_BATCH = 512
"""The batch timm's benchmark began with (the largest in the file; 381 rows ran at it)."""
RTX3090_CAPABILITY = (8, 6)
RTX3090_MEMORY_GIB = 24.0
"""24 GiB of GDDR6X (NVIDIA's RTX 3090 specification: 24 GB, which `nvidia-smi` shows as 24576 MiB)."""
CUDA_CONTEXT_NOTE = (
    "what the card leaves: the project's one fit rule (bench.memory.fit: the predicted reserved peak plus 10 % "
    "of it must fit the nominal 24 GiB), so at most 21.8 GiB of predicted peak fits. The 10 % stands for what "
    "no tensor shows; on this card under PyTorch 1.12 / CUDA 11.3 that includes a CUDA context of roughly "
    "1 GiB (every kernel module loaded eagerly: lazy loading came with CUDA 11.7), about 5 % of a 20 GiB peak")
COLUMNS: dict[str, Column] = {
    "model": Column("str"), "memory_format": Column("str"), "image_size": Column("int", minimum=1),
    "side": Column("str", "fit: the row's batch, observed to fit; oom: the next larger size of timm's sequence"),
    "batch_size": Column("int", minimum=1), "observed": Column("str", "fits or oom"),
    "status": Column("str", "estimated or error"), "predicted_allocated_bytes": Column("int"),
    "predicted_reserved_bytes": Column("int"), "autocast_cache_bytes": Column("int"), "attention": Column("str"),
    "estimate_s": Column("float"), "error": Column("str"),
}
"""One line per (row, side), read with `bench.results.read.read_table`."""


def decay_sequence(start: int = START_BATCH) -> list[int]:
    """timm's retry sizes from `start` down to 1, from timm's own `decay_batch_step`.

    >>> decay_sequence()[:9]
    [512, 384, 256, 192, 128, 96, 64, 48, 32]
    """
    from timm.utils import decay_batch_step

    sizes = [start]
    while sizes[-1] > 1:
        sizes.append(decay_batch_step(sizes[-1]))
    return sizes


def failed_batch(batch_size: int) -> int | None:
    """The size timm tried just before `batch_size` (it ran out of memory); None at the start.

    >>> failed_batch(48), failed_batch(512)
    (64, None)
    """
    sizes = decay_sequence()
    index = sizes.index(batch_size)
    return sizes[index - 1] if index else None


WEIGHT_SOURCE_PREFIXES = ("tf_", "gluon_", "legacy_", "ssl_", "swsl_", "ig_", "tv_", "dm_", "jx_")
"""Prefixes timm gives a model for where its weights came from (TensorFlow ports, GluonCV, torchvision, the
semi-supervised Instagram weights, DeepMind's, JAX's): the architecture is the name without them."""


def family(model: str) -> str:
    """A model's family: the letters its timm name starts with, a version suffix kept (`resnetv2`) and a weight
    source's prefix dropped (`tf_efficientnet_b0` is an EfficientNet).

    >>> family("vit_base_patch16_384"), family("resnet50d"), family("tf_efficientnet_b0"), family("resnetv2_50x1_bitm")
    ('vit', 'resnet', 'efficientnet', 'resnetv2')
    """
    name = next((model[len(prefix):] for prefix in WEIGHT_SOURCE_PREFIXES if model.startswith(prefix)), model)
    match = re.match(r"[a-z]*?(?:v\d+)?(?=[^a-z]|$)", name)
    return match.group(0) if match and match.group(0) else model


def validation_cell(model: str, image_size: int, batch_size: int, channels_last: bool) -> Cell:
    """One step of timm's train benchmark as a cell: fp16 autocast (estimated with 1.12's fp32 list,
    `NOT_CAST_BY_PYTORCH_1_12`), SGD with momentum 0.9 (timm's
    `create_optimizer_v2(opt="sgd")`), gradients zeroed and kept (`zero_grad()` in PyTorch 1.12),
    eager attention (PyTorch 1.12 had no SDPA), no accumulation, no checkpointing."""
    return Cell(experiment="estimate_validation", profile="cuda", model=model, image_size=image_size,
                micro_batch=batch_size, accum_steps=1, precision="fp16", checkpointing="off", optimizer="sgd",
                channels_last=channels_last, warmup_steps=1, measured_steps=1, attention="eager",
                zero_grad="zeros")


@dataclass(frozen=True)
class Observation:
    model: str
    memory_format: str
    image_size: int
    side: str
    batch_size: int

    @property
    def observed(self) -> str:
        return "fits" if self.side == "fit" else "oom"

    @property
    def key(self) -> tuple:
        return self.model, self.memory_format, self.side


def observations(reference: Path = REFERENCE) -> list[Observation]:
    """Every fit and OOM observation of the reference file, in its order."""
    found = []
    with reference.open() as handle:
        for row in csv.DictReader(handle):
            base = dict(model=row["model"], memory_format=row["memory_format"], image_size=int(row["image_size"]))
            batch = int(row["batch_size"])
            found.append(Observation(**base, side="fit", batch_size=batch))
            failed = failed_batch(batch)
            if failed is not None:
                found.append(Observation(**base, side="oom", batch_size=failed))
    return found


def sample_order(found: list[Observation], seed: int = 0) -> list[Observation]:
    """Rows (both sides together) in a seeded random order: a run stopped early is a random sample."""
    rows = sorted({(o.model, o.memory_format) for o in found})
    random.Random(seed).shuffle(rows)
    rank = {row: index for index, row in enumerate(rows)}
    return sorted(found, key=lambda o: (rank[(o.model, o.memory_format)], o.side))


def _estimate(observation: Observation, models: FakeModels) -> dict:
    cell = validation_cell(observation.model, observation.image_size, observation.batch_size,
                           observation.memory_format == "channels_last")
    # The estimating half loads torch; the agreement needs none. Autocast casts as PyTorch 1.12's did.
    from bench.memory.cuda_autocast import NOT_CAST_BY_PYTORCH_1_12
    from bench.memory.estimate import estimate_cell

    began = time.monotonic()
    try:
        estimate = estimate_cell(cell, "cuda", models, capability=RTX3090_CAPABILITY,
                                 autocast_uncast=NOT_CAST_BY_PYTORCH_1_12)
    except Exception as exc:  # noqa: BLE001 - a model that does not build or trace is a row, not a stop
        return {"status": "error", "error": f"{type(exc).__name__}: {str(exc)[:200]}",
                "estimate_s": round(time.monotonic() - began, 2)}
    return {"status": "estimated", "predicted_allocated_bytes": estimate.peak_allocated_bytes,
            "predicted_reserved_bytes": estimate.peak_reserved_bytes,
            "autocast_cache_bytes": estimate.autocast_cache_bytes, "attention": estimate.attention,
            "estimate_s": round(time.monotonic() - began, 2), "error": ""}


def validate(out: Path, limit_s: float | None = None, reference: Path = REFERENCE) -> Iterator[dict]:
    """Estimate every observation not yet in `out` (appending as it goes); stops after `limit_s` seconds."""
    done = set(read_table(out, COLUMNS)[["model", "memory_format", "side"]].itertuples(index=False, name=None))
    out.parent.mkdir(parents=True, exist_ok=True)
    fresh = not out.exists()
    began = time.monotonic()
    with out.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, COLUMNS)
        if fresh:
            writer.writeheader()
        models = None
        current = None
        for observation in sample_order(observations(reference)):
            if observation.key in done:
                continue
            if limit_s is not None and time.monotonic() - began > limit_s:
                return
            if observation.model != current:  # one model's fake copies at a time: memory stays flat
                models, current = FakeModels(), observation.model
            row = {"model": observation.model, "memory_format": observation.memory_format,
                   "image_size": observation.image_size, "side": observation.side,
                   "batch_size": observation.batch_size, "observed": observation.observed,
                   **_estimate(observation, models)}
            writer.writerow(row)
            handle.flush()
            yield row


PARAM_COUNTS = "param_counts.csv"
"""Beside the rows: each model's parameter count as today's timm builds it, beside the reference row's."""
PARAM_COUNT_COLUMNS = {"model": Column("str"), "built_param_count_m": Column("float"),
                       "reference_param_count_m": Column("float")}
SAME_MODEL_WITHIN = 0.02
"""A model whose parameter count today differs from the reference row's by more than this share is another model
under the same name (timm maps some deprecated names to other architectures): its rows are not judged."""


def count_parameters(rows_file: Path, reference: Path = REFERENCE) -> list[dict]:
    """Count, on the meta device, the parameters today's timm builds for every model of `rows_file` not yet in
    `param_counts.csv` beside it, next to the reference row's count (`param_count_m`); appends and returns the new
    lines. A model that does not build is left out (its sides are errors already)."""
    import warnings

    import timm
    import torch

    counts_file = rows_file.with_name(PARAM_COUNTS)
    done = set(read_table(counts_file, PARAM_COUNT_COLUMNS).model)
    published = pd.read_csv(reference).groupby("model").param_count_m.first()
    new = []
    for model in sorted(set(read_table(rows_file, COLUMNS).model) - done):
        try:
            with warnings.catch_warnings(), torch.device("meta"):
                warnings.simplefilter("ignore")  # timm names a deprecated name's new one: the count says what it is
                built = timm.create_model(model)
        except Exception:  # noqa: BLE001 - does not build today: its sides are error rows already
            continue
        new.append({"model": model, "built_param_count_m": round(sum(p.numel() for p in built.parameters()) / 1e6, 2),
                    "reference_param_count_m": float(published[model])})
    if new:
        pd.DataFrame(new).to_csv(counts_file, mode="a", header=not counts_file.is_file(), index=False)
    return new


def renamed_models(rows_file: Path) -> dict[str, tuple[float, float]]:
    """Models whose name today builds another model than the reference row measured: model -> (millions of
    parameters built today, in the row). Empty where `param_counts.csv` is not beside the rows."""
    counts_file = rows_file.with_name(PARAM_COUNTS)
    if not counts_file.is_file():
        return {}
    counts = read_table(counts_file, PARAM_COUNT_COLUMNS)
    other = (counts.built_param_count_m / counts.reference_param_count_m - 1).abs() > SAME_MODEL_WITHIN
    return {row.model: (row.built_param_count_m, row.reference_param_count_m) for row in counts[other].itertuples()}


REBUILT_FAMILIES = {
    "tresnet": "Inplace-ABN then (mapillary's in-place batch norm and activation, which keeps no input of either for "
               "backward; the table's timm raised an ImportError without it, so its rows ran with it), BatchNorm and "
               "LeakyReLU today (timm's tresnet.py converts the Inplace-ABN weights)"}
"""Families whose layers today's timm builds otherwise than the table's timm did, with what changed: the rows
measured another implementation's memory, so they are not judged (their score is said beside, `summary_markdown`)."""


def judged(rows_file: Path, headroom: float = DEFAULT_HEADROOM, extra_bytes: int = 0, *,
           rebuilt: bool = False, segments_only: bool = False) -> pd.DataFrame:
    """One line per reference row with both sides' predictions and whether each came out right (`extra_bytes`
    added to every predicted peak: what memory the estimator does not count would change).

    Rows of a model that today's timm builds as another model (`renamed_models`) are not judged, nor (unless
    `rebuilt`) those of a family it builds with other layers (`REBUILT_FAMILIES`). `segments_only`: the allocated
    peak in whole 2 MiB segments stands for reserved (the estimate without the allocator's replay).
    A side is right when `bench.memory.fit.memory_fit` (predicted reserved peak plus `headroom`
    against 24 GiB) says fits for a fit and does not for an OOM. `both_right`: every side the row
    has (a row at 512 has no OOM side) is right. `fit_ratio`, `oom_ratio`: what the rule needs over
    what the card has (right: <= 1 and > 1).
    """
    sides = read_table(rows_file, COLUMNS)
    left_out = set(renamed_models(rows_file)) | (set() if rebuilt else
                                                 {m for m in sides.model if family(m) in REBUILT_FAMILIES})
    sides = sides[(sides.status == "estimated") & ~sides.model.isin(left_out)]
    peaks = sides.predicted_allocated_bytes.map(whole_segments, na_action="ignore") if segments_only else \
        sides.predicted_reserved_bytes
    fits = [memory_fit(peak + extra_bytes, headroom, RTX3090_MEMORY_GIB) for peak in peaks]
    sides = sides.assign(ratio=[fit.required_bytes / fit.capacity_bytes for fit in fits])
    sides = sides.assign(right=(sides.ratio <= 1) == (sides.side == "fit"))
    wide = sides.pivot_table(index=["model", "memory_format"], columns="side", values=["ratio", "right"],
                             aggfunc="first")
    wide.columns = [f"{side}_{value}" for value, side in wide.columns]
    wide = wide.reset_index()
    if "oom_right" not in wide:
        wide = wide.assign(oom_right=float("nan"), oom_ratio=float("nan"))
    wide = wide[wide.fit_right.notna()]  # a row whose fit side did not estimate is not judged
    has_oom = wide.oom_right.notna()
    oom_right = wide.oom_right.where(has_oom, True).astype(bool)
    fit_right = wide.fit_right.astype(bool)
    return wide.assign(family=wide.model.map(family), has_oom=has_oom, both_right=fit_right & oom_right)


CUDNN_WORKSPACE_NOTE = (
    "cuDNN convolution workspaces count 0 bytes in the estimate: in the PyTorch of these rows (1.12, whose "
    "convolutions use cuDNN's v7 API), a workspace that cannot be allocated makes ATen run the next algorithm, down "
    "to one that needs none (aten/src/ATen/native/cudnn/Conv_v7.cpp, AlgoIterator::try_all catches the "
    "out-of-memory error), so a workspace never decides whether a step fits. Were one held at the peak, every row "
    "would need that much more; the table shows what that would do to the misses.")
"""Why the estimate counts no cuDNN workspace, and what the table beside it shows (`summary_markdown`)."""


VALIDATION_ROWS = Path(__file__).resolve().parents[2] / "docs" / "memory" / "validation.csv"
"""The committed sides `make bench-memory` estimated: what every probe answer quotes (`agreement`); its summary
beside it (`SUMMARY_FILE`)."""
SUMMARY_FILE = "summary.md"


@dataclass(frozen=True)
class Agreement:
    """How often the estimator's fit / does-not-fit answer matched timm's RTX 3090 rows, at one headroom."""

    rows: int
    """Reference rows judged (both sides estimated where the row has two)."""
    both_right_pct: float
    fit_right_pct: float
    oom_sides: int
    oom_right_pct: float
    headroom: float
    source: str
    """The rows file, relative to the repository."""
    family: str | None = None
    """The asked model's family (`family`; a model not from timm stands for itself), when a model was named."""
    family_rows: int = 0
    """Reference rows of that family judged (0: the family has no public row)."""
    family_both_right_pct: float | None = None

    def document(self) -> dict:
        """Every field and the sentence of `describe`: the `estimator_agreement` of each JSON answer."""
        return {**asdict(self), "text": self.describe()}

    def describe(self) -> str:
        """`estimator vs public fit/OOM rows: both sides right on 95.3 % of 258 timm RTX 3090 rows ...`, then the
        model's family's own figure, or that it has no public row."""
        text = (f"estimator vs public fit/OOM rows: both sides right on {self.both_right_pct:.1f} % of {self.rows} "
                f"timm RTX 3090 AMP rows (fits right {self.fit_right_pct:.1f} %, OOMs right {self.oom_right_pct:.1f} "
                f"% of {self.oom_sides}) at {self.headroom:.0%} headroom; {self.source}, docs/estimator.md")
        if self.family is None:
            return text
        if self.family in REBUILT_FAMILIES:
            return (f"{text}; family {self.family!r}: its public rows measured other layers than today's timm builds "
                    "(not judged: docs/memory/summary.md), so the overall figure is all there is")
        if not self.family_rows:
            return f"{text}; family {self.family!r}: no public row (the overall figure is all there is)"
        return (f"{text}; family {self.family!r}: both sides right on {self.family_both_right_pct:.1f} % of "
                f"{self.family_rows} rows")


def agreement(headroom: float = DEFAULT_HEADROOM, rows_file: Path = VALIDATION_ROWS, *,
              model: str | None = None) -> Agreement | None:
    """The estimator's measured agreement with the public fit/OOM rows, judged at `headroom` from the committed
    sides, with `model`'s family's own share when a model is named (None when the package runs without its
    repository's results)."""
    if not rows_file.is_file():
        return None
    rows = judged(rows_file, headroom)
    oom = rows.oom_right[rows.has_oom].astype(bool)
    try:
        source = str(rows_file.relative_to(VALIDATION_ROWS.parents[2]))
    except ValueError:
        source = str(rows_file)
    timm_name = model.removeprefix("hf-hub:timm/") if model else None
    # A model of the user's own (a file, a module, another hub org) has no family among timm's public rows.
    name = None if model is None else family(timm_name) if kind_of(timm_name) == "timm" else model
    own = rows[rows.family == name] if name is not None else rows.iloc[:0]
    return Agreement(rows=len(rows), both_right_pct=100 * rows.both_right.mean(),
                     fit_right_pct=100 * rows.fit_right.astype(bool).mean(), oom_sides=len(oom),
                     oom_right_pct=100 * oom.mean(), headroom=headroom, source=source, family=name,
                     family_rows=len(own), family_both_right_pct=100 * own.both_right.mean() if len(own) else None)


def agreement_text(found: Agreement | None) -> str:
    """`found` in words, or that it is not known where the package runs without its repository's results."""
    return found.describe() if found else ("estimator vs public fit/OOM rows: not known here (the repository's "
                                           "docs/memory/ is not installed)")


def _renamed_line(rows_file: Path, sides: pd.DataFrame) -> list[str]:
    """The rows left out because today's timm builds another model under their name, said with the counts."""
    renamed = {model: counts for model, counts in renamed_models(rows_file).items() if model in set(sides.model)}
    if not renamed:
        return []
    rows = sides[sides.model.isin(renamed) & (sides.side == "fit")]
    named = ", ".join(f"{model} ({built:g} M parameters today, {published:g} M in the row)"
                      for model, (built, published) in sorted(renamed.items()))
    return [f"Not judged: {len(rows)} rows of {len(renamed)} models that today's timm builds as another model (a "
            f"deprecated name mapped elsewhere; the parameter count differs by over {SAME_MODEL_WITHIN:.0%}, "
            f"{PARAM_COUNTS}): {named}.", ""]


def _rebuilt_line(rows_file: Path, headroom: float) -> list[str]:
    """The rows left out because today's timm builds their family with other layers, with how they would score."""
    every = judged(rows_file, headroom, rebuilt=True)
    theirs = every[every.family.isin(REBUILT_FAMILIES)]
    if theirs.empty:
        return []
    changes = "; ".join(f"{name}: {REBUILT_FAMILIES[name]}" for name in sorted(set(theirs.family)))
    return [f"Not judged: {len(theirs)} rows of {theirs.model.nunique()} models whose layers today's timm builds "
            f"otherwise than the table's ({changes}). Judged anyway, {int(theirs.both_right.sum())} of {len(theirs)} "
            f"would be right on both sides ({every.both_right.mean():.1%} of all {len(every)} rows).", ""]


def _by_group_header(name: str) -> list[str]:
    return [f"| {name} | rows | both right | OOM side right | fit: median | fit: p90 | OOM: median | OOM: p10 |",
            "|---|---|---|---|---|---|---|---|"]


def _by_group_line(name: str, group: pd.DataFrame) -> str:
    """One group's agreement and margins (`_by_group_header`'s columns)."""
    oom = group.oom_right[group.has_oom].astype(bool)
    fit_ratio, oom_ratio = group.fit_ratio.dropna(), group.oom_ratio.dropna()
    oom_right = f"{oom.mean():.0%} of {len(oom)}" if len(oom) else "no OOM side"

    def ratio(values: pd.Series, q: float) -> str:
        return f"{values.quantile(q):.2f}" if len(values) else ""
    return (f"| {name} | {len(group)} | {group.both_right.mean():.0%} | {oom_right} | {ratio(fit_ratio, 0.5)} | "
            f"{ratio(fit_ratio, 0.9)} | {ratio(oom_ratio, 0.5)} | {ratio(oom_ratio, 0.1)} |")


def _format_split_lines(rows: pd.DataFrame, sides: pd.DataFrame) -> list[str]:
    """The models whose two memory formats fit different largest batches in the reference, and the misses among
    them: the estimate gives one peak to both formats of a batch (the trace does not tell them apart, bar a few
    models), so it can be right on one of the two at most."""
    estimated = sides[sides.status == "estimated"]
    fitted = estimated[estimated.side == "fit"]
    both = fitted.pivot_table(index="model", columns="memory_format", values="batch_size", aggfunc="first").reindex(
        columns=["channels_last", "contiguous"]).dropna()
    split = both[both.channels_last != both.contiguous]
    judged_rows = rows[rows.model.isin(split.index)]
    contiguous_less = int((split.contiguous < split.channels_last).sum())
    peaks = estimated.pivot_table(index=["model", "batch_size"], columns="memory_format",
                                  values="predicted_reserved_bytes", aggfunc="first").reindex(
                                      columns=["channels_last", "contiguous"]).dropna()
    apart = int(((peaks.channels_last / peaks.contiguous - 1).abs() > 0.01).sum())
    return [f"In {len(split)} of the {len(both)} models the table holds in both memory formats, the two fit "
            f"different largest batches (contiguous the smaller in {contiguous_less}, channels_last in "
            f"{len(split) - contiguous_less}). The estimate gives both formats of a batch the same peak (within 1 % "
            f"in {len(peaks) - apart} of the {len(peaks)} batches estimated in both: the trace does not tell them "
            f"apart), so it can be right on one of the two at most: {int((~judged_rows.both_right).sum())} of the "
            f"{int((~rows.both_right).sum())} rows missed are theirs.", "", *_goal_lines(rows, split, estimated), ""]


GOAL_BOTH_RIGHT = 0.97
"""The share of rows right on both sides that issue #38 asks of the estimator."""
NEAR_LINE = 0.03
"""A missed side this close to the fit line (predicted peak x headroom within 3 % of the card) is near it."""


def _goal_lines(rows: pd.DataFrame, split: pd.DataFrame, estimated: pd.DataFrame) -> list[str]:
    """What the format-split models leave of the goal (`GOAL_BOTH_RIGHT`): the misses no format-blind estimate
    avoids, and how near the line the other misses lie."""
    oom_batch = estimated[estimated.side == "oom"].set_index(["model", "memory_format"]).batch_size
    fewer = split.idxmin(axis=1)  # the format that fits the smaller largest batch
    # Its OOM batch at or below the other format's fit batch: the two sides ask opposite answers of one peak that
    # rises with the batch, so one of them is missed whatever the estimate.
    forced = sum(1 for model, smaller in fewer.items()
                 if oom_batch.get((model, smaller), float("inf")) <= split.loc[model].max())
    allowed = int((1 - GOAL_BOTH_RIGHT) * len(rows) + 1e-9)
    others = rows[~rows.model.isin(split.index) & ~rows.both_right]
    fit_missed = ~others.fit_right.astype(bool)
    oom_missed = ~others.oom_right.where(others.has_oom, True).astype(bool)  # no OOM side: nothing missed there
    fit_near, oom_near = ((others.fit_ratio - 1).abs() <= NEAR_LINE, (others.oom_ratio - 1).abs() <= NEAR_LINE)
    near = (~fit_missed | fit_near) & (~oom_missed | oom_near)
    beside = f"{allowed - forced} beside those" if allowed >= forced else "fewer than those alone"
    return [f"In {forced} of those models the smaller format's OOM batch is at or below the other format's fit "
            f"batch: the two sides ask opposite answers of one peak that rises with the batch, so an estimate that "
            f"gives both formats one peak misses one of them whatever it predicts, and can reach at most "
            f"{1 - forced / len(rows):.1%}. The goal ({GOAL_BOTH_RIGHT:.0%} right on both sides) allows "
            f"{allowed} misses, {beside}. Of the {len(others)} misses of the other models, {int(near.sum())} lie "
            f"within {NEAR_LINE:.0%} of the line: {int((near & fit_missed).sum())} fit sides at most "
            f"{NEAR_LINE:.0%} over the card, {int((near & oom_missed).sum())} OOM sides at most {NEAR_LINE:.0%} "
            "under."]


def _replay_lines(rows_file: Path, sides: pd.DataFrame, rows: pd.DataFrame, headroom: float) -> list[str]:
    """What the allocator's replay (`bench.memory.allocator.reserved_to_run`) adds over the allocated peak in whole
    segments, and what judging with the latter instead would give."""
    estimated = sides[(sides.status == "estimated") & sides.predicted_allocated_bytes.notna()]
    if estimated.empty:
        return []
    added = estimated.predicted_reserved_bytes / estimated.predicted_allocated_bytes.map(whole_segments) - 1
    without = judged(rows_file, headroom, segments_only=True)
    return [f"Reserved is the allocator's replay (`bench.memory.allocator`): the step's allocations and frees, in "
            f"order, through the caching allocator's pools, segment sizes, best fit and splitting; the least memory "
            f"they run in. It adds {added.median():.1%} to the allocated peak in whole 2 MiB segments (median; p90 "
            f"{added.quantile(0.9):.1%}, largest {added.max():.1%}). Judged with the allocated peak in whole segments "
            f"instead (the estimate before the replay), {without.both_right.mean():.1%} of rows are right on both "
            f"sides ({rows.both_right.mean():.1%} with it): OOM sides "
            f"{without.oom_right[without.has_oom].astype(bool).sum()} of {without.has_oom.sum()} right "
            f"({rows.oom_right[rows.has_oom].astype(bool).sum()}), fit sides "
            f"{without.fit_right.astype(bool).sum()} of {len(without)} ({rows.fit_right.astype(bool).sum()})."]


def summary_markdown(rows_file: Path, headroom: float = DEFAULT_HEADROOM) -> str:
    """The agreement as docs/estimator.md shows it: overall, per family, the ratios' spread, other headrooms."""
    rows = judged(rows_file, headroom)
    sides = read_table(rows_file, COLUMNS)
    errors = sides[sides.status != "estimated"]
    lines = [
        f"Rows judged: {len(rows)} ({rows.has_oom.sum()} with an OOM side) of "
        f"{len(sides[sides.side == 'fit'])} attempted; {errors.model.nunique()} models did not estimate "
        f"({len(errors)} sides). Fit rule: predicted reserved peak x {1 + headroom:.2f} <= "
        f"{RTX3090_MEMORY_GIB:.0f} GiB ({CUDA_CONTEXT_NOTE}).",
        "",
        *_renamed_line(rows_file, sides),
        *_rebuilt_line(rows_file, headroom),
        f"- both sides right: {rows.both_right.mean():.1%} of rows",
        f"- fit side right: {rows.fit_right.astype(bool).mean():.1%}; OOM side right: "
        f"{rows.oom_right[rows.has_oom].astype(bool).mean():.1%} (of {rows.has_oom.sum()})",
        "",
        f"Predicted reserved peak x {1 + headroom:.2f} over {RTX3090_MEMORY_GIB:.0f} GiB (a fit is right at <= 1, "
        "an OOM above 1):",
        "",
        "| side | n | p5 | p25 | median | p75 | p95 |",
        "|---|---|---|---|---|---|---|",
    ]
    for side in ("fit", "oom"):
        ratios = rows[f"{side}_ratio"].dropna()
        q = ratios.quantile([0.05, 0.25, 0.5, 0.75, 0.95])
        lines.append(f"| {side} | {len(ratios)} | " + " | ".join(f"{value:.2f}" for value in q) + " |")
    lines += ["", "Per family (families with at least 5 rows; the rest pooled as `other`), with the margins: the "
              "predicted peak x the headroom over the card, median and the side's worst decile (a fit side's p90, "
              "an OOM side's p10; right at <= 1 and > 1):", "", *_by_group_header("family")]
    counts = rows.family.value_counts()
    grouped = rows.assign(family=rows.family.where(rows.family.map(counts) >= 5, "other"))
    for name, group in sorted(grouped.groupby("family"), key=lambda item: -len(item[1])):
        lines.append(_by_group_line(name, group))
    lines += ["", "Per memory format:", "", *_by_group_header("memory format")]
    for name, group in rows.groupby("memory_format"):
        lines.append(_by_group_line(name, group))
    lines += ["", *_format_split_lines(rows, sides)]
    lines += _replay_lines(rows_file, sides, rows, headroom)
    lines += ["", CUDNN_WORKSPACE_NOTE, "",
              "| cuDNN workspace held at the peak | OOM sides right | fit sides right | both sides right |",
              "|---|---|---|---|"]
    for mib in (0, 64, 128, 256, 512, 1024):
        held = judged(rows_file, headroom, mib * 2**20)
        lines.append(f"| {mib} MiB | {held.oom_right[held.has_oom].astype(bool).sum()} of {held.has_oom.sum()} | "
                     f"{held.fit_right.astype(bool).sum()} of {len(held)} | {held.both_right.mean():.1%} |")
    lines += ["", "The same rows judged with other headrooms (the rule's 10 % is the project's, not fitted here):", "",
              "| headroom | largest predicted peak that fits (GiB) | both sides right |", "|---|---|---|"]
    for other in (0.0, 0.05, 0.10, 0.15, 0.20):
        lines.append(f"| {other:.0%} | {RTX3090_MEMORY_GIB / (1 + other):.1f} | "
                     f"{judged(rows_file, other).both_right.mean():.1%} |")
    return "\n".join(lines) + "\n"
