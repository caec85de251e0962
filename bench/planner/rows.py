"""The rows a plan ranks: those read from results folders, each GPU row with the model's speeds that carry it to
other GPUs (`with_model_speeds`), plus the throughput model's options where the request asks for them
(`plan_rows`). Reading a runs file never traces a model; this stage does, through the shared trace cache."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Literal

from bench.cost.catalog import Instance
from bench.cost.price import MeasuredRow, ProjectionErrors
from bench.errors import refused_step
from bench.grid.cell import Cell
from bench.memory.fake_models import FakeModels
from bench.memory.fit import DEFAULT_HEADROOM
from bench.planner.search import (
    DEFAULT_PRECISIONS,
    MEMORY_METHOD,
    PlanCandidates,
    PlanPrediction,
    Progress,
    check_before_tracing,
    plan_predictions,
)
from bench.speed.params import load_model_file
from bench.speed.predict import model_speeds
from bench.units import plural


def with_model_speeds(rows: list[MeasuredRow]) -> list[MeasuredRow]:
    """`rows`, each one measured on a catalog GPU with its `model_speeds` (`bench.speed.predict.model_speeds`: the
    two traces of its configuration in the shared trace cache, whatever its split), so that its lines on other GPUs
    scale it by the model's ratio between the two GPUs."""
    projectable = [row for row in rows if row.projectable_by_model]
    if not projectable:
        return rows  # no GPU row: no trace, no torch
    models, speeds = FakeModels(), {}
    for row in projectable:
        if row.configuration not in speeds:
            speeds[row.configuration] = model_speeds(row.cell(), models)
    return [replace(row, model_speeds=speeds[row.configuration]) if row.projectable_by_model else row for row in rows]


def projection_errors() -> ProjectionErrors:
    """What carrying a GPU row to another GPU has missed by in public rows, as the throughput model's validation
    measured it (`speed_params.json`): the errors `bench.cost.price` states beside each projection."""
    model = load_model_file()
    return ProjectionErrors(model_scaled=model.model_scaled, mfu_carried=model.projection)


@dataclass(frozen=True)
class PlanRows:
    """What a plan ranks: the rows given, and the throughput model's options when it was asked."""

    rows: list[MeasuredRow]
    image_size: int | None
    """The image size the plan answers at (None: the rows' own, when they have one)."""
    predicted: int | None = None
    """Options the throughput model added (None: it was not asked)."""
    refused: dict[str, int] = field(default_factory=dict)
    """Why some were not predicted, with counts."""
    seconds: float = 0.0


def plan_rows(rows: list[MeasuredRow], *, model: str, effective_batch: int, instances: tuple[Instance, ...],
              image_size: int | None = None, predict: Literal["auto", "always", "never"] = "auto",
              precisions: tuple[str, ...] = (), checkpointing: tuple[str, ...] = (), optimizer: str = "adamw",
              headroom: float = DEFAULT_HEADROOM, model_options: dict[str, Any] | None = None,
              on_text: Callable[[str], None] | None = None,
              check_cell: Callable[[Cell], None] | None = None) -> PlanRows:
    """`rows`, plus the throughput model's options on the instances' GPUs when `predict` asks for them (`auto`:
    only when `rows` hold no GPU row of `model`, so measurements win): the one rule `bench plan` and `bench.plan` share.
    Predicting without a size or a GPU row, the plan answers at 224 px. `check_cell` checks the model on the
    candidates' cell before any trace (default: that it is an image classifier for its input; `bench plan`
    adds the model's bounds, naming its options). `on_text` gets the predictor's progress, then what it did."""
    measured_gpu = any(row.model == model and not row.on_cpu for row in rows)
    predicting = predict == "always" or (predict == "auto" and not measured_gpu)
    if image_size is None and predicting and not measured_gpu:
        image_size = 224
    if not predicting:
        return PlanRows(list(rows), image_size)
    began = time.monotonic()
    sizes = sorted({row.image_size for row in rows if row.model == model})
    size = image_size or (sizes[0] if len(sizes) == 1 else 224)
    candidates = PlanCandidates(model=model, image_size=size, effective_batch=effective_batch,
                                gpus=tuple(sorted({instance.gpu for instance in instances})),
                                precisions=precisions or DEFAULT_PRECISIONS, checkpointing=checkpointing or ("off",),
                                optimizer=optimizer, headroom=headroom, model_options=dict(model_options or {}),
                                gpu_counts={gpu: tuple(sorted({i.gpu_count for i in instances if i.gpu == gpu}))
                                            for gpu in {instance.gpu for instance in instances}})
    if check_cell is None:
        from bench.train.model_build import check_cell_classifier as check_cell  # builds the model: only when predicting
    check_before_tracing(candidates, check_cell, candidates.cell(1, "fp32", "off"))
    progress = Progress()
    with refused_step(model, f"{size} px"):
        predicted = [predicted_row(option) for option in plan_predictions(candidates, on_text, progress)]
    found = PlanRows(list(rows) + predicted, image_size, len(predicted), dict(progress.refused),
                     time.monotonic() - began)
    if on_text:
        gpus = len({instance.gpu for instance in instances})
        refused = "; ".join(f"{count} {why}" for why, count in found.refused.items())
        on_text(f"predicted {plural(found.predicted, 'option')} on {plural(gpus, 'GPU')} in {found.seconds:.1f} s"
                + (f" (not predicted: {refused})" if refused else ""))
        on_text(MEMORY_METHOD)
    return found


def predicted_row(option: PlanPrediction) -> MeasuredRow:
    """A plan option of the throughput model (`bench.planner.search.plan_predictions`) as a predicted row: the columns
    a `bench predict` row has for what the plan prices."""
    cell, gpu, prediction = option.cell, option.prediction.gpu, option.prediction
    low, high = prediction.interval or (None, None)
    # the cell's own id, and the GPU: a plan prices one cell on several GPUs, each a line of its own
    return MeasuredRow({"cell_id": f"{cell.cell_id}-{gpu}", **cell.to_dict(), "status": "predicted", "gpu": gpu,
                        "device_type": "cuda", "device_name": f"predicted for {gpu}",
                        "samples_per_s": prediction.samples_per_s, "samples_per_s_low": low, "samples_per_s_high": high,
                        "mfu_pct": prediction.mfu_pct, "model_flops_per_sample": prediction.model_flops_per_sample,
                        "peak_memory_bytes": option.peak_reserved_bytes,
                        "peak_reserved_bytes": option.peak_reserved_bytes, "memory_source": "estimate_cuda_allocator",
                        "speed_basis": option.basis, "grads_bytes": option.grads_bytes or None})
