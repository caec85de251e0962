"""Seed 002's claims ("Gradient Accumulation vs Large Batch: Memory & Cost Test"), each beside the check that tests it."""

from __future__ import annotations

import numpy as np
import pandas as pd

from bench.claims.claim import ANY, AT_GPU_SIZE, ESTIMATED, GB, MB, MEASURED, ClaimList
from bench.claims.evidence import Missing, Rows, phases, saved_activations_bytes
from bench.claims.readings import pair, slower_by, time_change
from bench.claims.verdict import Check, value_check

claims = ClaimList(article="002")


def _ends(rows: Rows, **where: object) -> tuple[pd.Series, pd.Series]:
    """(large-batch end: fewest accumulation steps, most-accumulated end) among matching rows."""
    frame = rows.all(**where).sort_values(["accum_steps", "cell_id"])
    if len(frame) < 2:
        raise Missing(f"needs two splits of the batch in {rows.folder}")
    return frame.iloc[0], frame.iloc[-1]


def _per_sample_slope(frame: pd.DataFrame) -> float:
    """Least-squares slope of the saved activations against the micro-batch, bytes per sample."""
    if frame.micro_batch.nunique() < 2:
        raise Missing("needs at least two micro-batch sizes")
    saved = [saved_activations_bytes(row) for _, row in frame.iterrows()]
    return float(np.polyfit(frame.micro_batch.astype(float), saved, 1)[0])


def _phase_max(row: pd.Series, phase: str, step: int = 0) -> float:
    return max(nbytes for at, name, _, nbytes, _ in phases(row) if at == step and name == phase)


@claims.add(
    id="002-phase-memory",
    summary="A 128×1 vs B 8×16: memory after forward / backward / step",
    quote=("Strategy A (batch 128, no accumulation): • After forward: 18.2 GB (activations dominate) • After backward: "
        "26.7 GB (gradients + activations) • After optimizer step: 22.1 GB (activations freed, optimizer states "
        "remain) [...] Strategy B (batch 8, accum 16): • After forward: 4.1 GB (8× smaller activation memory) • After "
        "backward: 6.8 GB (gradients accumulate but activations are small) • After optimizer step: 8.9 GB "
        "(optimizer state same size as Strategy A)"),
    experiment="claims_strategies",
    sources=AT_GPU_SIZE,
    method=("Allocated memory after each phase of one traced step (the largest over micro-steps); "
        "ResNet-50, 224 px, fp16 autocast, AdamW. " + ESTIMATED),
    elsewhere="CPU rows are at 32 px, where these absolute sizes do not apply.",
)
def strategy_phases(rows: Rows) -> list[Check]:
    large, accumulated = _ends(rows)
    claimed = {"A": (large, (18.2, 26.7, 22.1)), "B": (accumulated, (4.1, 6.8, 8.9))}
    checks = []
    for label, (row, values) in claimed.items():
        for phase, value in zip(("forward", "backward", "optimizer"), values):
            measured = _phase_max(row, phase)
            checks.append(value_check(f"{label} ({pair(row)}) after {phase}: {value} GB", measured,
                                      value * GB, 0.25, "GB", GB, label=f"{label} {phase}"))
    return checks


@claims.add(
    id="002-b-slower",
    summary="B (8×16) is 6 % slower than A (128×1)",
    quote="Strategy B is 6% slower.",
    experiment="claims_strategies",
    sources=MEASURED,
    method="Samples/s of the most-accumulated split against the large batch (median of the timed steps).",
    elsewhere="an estimate has no time.",
)
def b_slower(rows: Rows) -> list[Check]:
    large, accumulated = _ends(rows)
    slower = slower_by(large, accumulated)
    measured = f"{pair(accumulated)} {time_change(slower)} than {pair(large)}"
    return [Check("B slower than A", measured, slower > 0),
            Check("by 6 % (3 to 9 %)", measured, 0.03 <= slower <= 0.09)]


@claims.add(
    id="002-activations-per-image",
    summary="~150 MB of activations per image (ResNet-50, 224 px)",
    quote="$M_{\\text{activations}}(B)$: approximately 150 MB per image for ResNet-50 at 224×224",
    experiment="claims_strategies",
    sources=AT_GPU_SIZE,
    method="Slope of the activations saved by the first forward against the micro-batch. " + ESTIMATED,
    elsewhere="CPU rows are at 32 px.",
)
def activation_per_image(rows: Rows) -> list[Check]:
    slope = _per_sample_slope(rows.all())
    return [value_check("~150 MB of activations per image", slope, 150 * MB, 0.25, "MB", MB, 1, "per image")]


@claims.add(
    id="002-static",
    summary="ResNet-50: 102 MB weights, 205 MB AdamW state, 102 MB gradients",
    quote=("$M_{\\text{model}}$ (fp32 weights): 25.6M params × 4 bytes = 102 MB • $M_{\\text{optim}}$ (AdamW "
        "states): 25.6M × 8 bytes = 205 MB (momentum + variance) • $M_{\\text{gradients}}$: 25.6M × 4 bytes = 102 MB"),
    experiment="claims_strategies",
    sources=ANY,
    method="Parameter, gradient and optimizer-state bytes measured from the tensors (they do not depend on image size).",
)
def resnet50_static(rows: Rows) -> list[Check]:
    row = rows.one(optimizer="adamw")
    return [value_check("M_model 102 MB", row.params_bytes, 102 * MB, 0.05, "MB", MB, 1, "weights"),
            value_check("M_optim 205 MB", row.optimizer_state_bytes, 205 * MB, 0.05, "MB", MB, 1, "AdamW"),
            value_check("M_gradients 102 MB", row.grads_bytes, 102 * MB, 0.05, "MB", MB, 1, "gradients")]


@claims.add(
    id="002-formula",
    summary="M_total = M_model + M_optim + M_activations(B) + M_gradients adds up",
    quote=("The memory formula for gradient accumulation is: $$M_{\\text{total}} = M_{\\text{model}} + "
        "M_{\\text{optim}} + M_{\\text{activations}}(B) + M_{\\text{gradients}}$$ where $B$ is the micro-batch "
        "size (not the effective batch size)."),
    experiment="claims_strategies",
    sources=AT_GPU_SIZE,
    method=("Measured static bytes plus the per-sample activation slope × B, against the measured peak, at both ends. "
        + ESTIMATED),
    elsewhere="CPU rows are at 32 px.",
)
def formula_adds_up(rows: Rows) -> list[Check]:
    frame = rows.all()
    slope = _per_sample_slope(frame)
    checks = []
    for row in _ends(rows):
        static = row.params_bytes + row.optimizer_state_bytes + row.grads_bytes
        predicted = static + slope * row.micro_batch
        checks.append(Check(f"{pair(row)}: M_model + M_optim + M_gradients + M_activations(B) = peak (within 10 %)",
                            f"{predicted / GB:.2f} GB predicted, {row.peak_memory_bytes / GB:.2f} GB peak",
                            abs(predicted - row.peak_memory_bytes) <= 0.10 * row.peak_memory_bytes))
    return checks


@claims.add(
    id="002-staleness",
    summary="micro-batches after the first compute gradients on stale weights",
    quote=("In Strategy B, you see 128 examples (8 × 16) before updating once — but the last 15 micro-batches are "
        "computing gradients based on stale weights."),
    experiment="claims_strategies",
    sources=MEASURED,
    method=("The parameters' in-place write counters, read after every forward of a traced step: a change would "
        "mean a micro-batch ran at different weights. All micro-batches of a step run at the weights of the "
        "last update, exactly as strategy A's single batch does."),
    elsewhere="an estimate runs on fake tensors; the counters are read from measured rows.",
)
def staleness(rows: Rows) -> list[Check]:
    _, accumulated = _ends(rows)
    forwards = [version for step, name, _, _, version in phases(accumulated) if step == 0 and name == "forward"]
    if not forwards or forwards[0] is None:
        raise Missing(f"{accumulated.cell_id}: no weights_version in step_memory")
    distinct = len(set(forwards))
    measured = (f"{len(forwards)} forwards of one step ran at {distinct} weight version(s); "
                "the weights change only at optimizer.step")
    return [Check("later micro-batches of a step see older weights than the first", measured, distinct > 1)]


@claims.add(
    id="002-autotune",
    summary="auto-tuned batch: 48 on a 24 GB 3090, 96 on an A100 40 GB",
    quote="On a 3090, this auto-detects batch 48 for ResNet-50. On an A100, it finds batch 96.",
    experiment="claims_autotune",
    sources=("estimate",),
    method=("The memory estimator's largest micro-batch (`bench probe resnet50 --gpu ...`, fp32, AdamW, no "
        "headroom: the article's search keeps none). Note: the article's `find_max_batch_size` halves from 256, "
        "so it can only return powers of two; 48 and 96 are not among them."),
    elsewhere="answered by the estimator only (`bench probe`).",
)
def autotune(rows: Rows) -> list[Check]:
    checks = []
    for gpu, claimed in (("RTX-3090", 48), ("A100-40GB", 96)):
        row = rows.one(gpu=gpu)
        checks.append(value_check(f"{gpu}: batch {claimed}", float(row.largest_micro_batch), claimed, 0.25, "",
                                  1, 0, f"{gpu}:"))
    return checks


@claims.add(
    id="002-checkpointing-time",
    summary="checkpointing: 33 % slower training (ResNet-50)",
    quote="The tradeoff: 33% slower training (you’re doing forward pass twice per batch).",
    experiment="claims_checkpointing",
    sources=MEASURED,
    method="Samples/s of ResNet-50 with timm's full checkpointing against none.",
    elsewhere="an estimate has no time.",
)
def resnet_checkpointing_time(rows: Rows) -> list[Check]:
    off, full = rows.one(model="resnet50", checkpointing="off"), rows.one(model="resnet50", checkpointing="full")
    slower = slower_by(off, full)
    return [Check("33 % slower (23 to 43 %)", time_change(slower), 0.23 <= slower <= 0.43)]
