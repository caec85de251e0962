"""Seed 002's claims ("Gradient Accumulation vs Large Batch: Memory & Cost Test"), each beside the check that tests it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from bench.claims.claim import ANY, AT_GPU_SIZE, ESTIMATED, GPU_SPEED, ClaimList
from bench.claims.evidence import (
    EQUIVALENCE,
    SOURCE_WORDS,
    Missing,
    Rows,
    load_sources,
    phases,
    saved_activations_bytes,
)
from bench.claims.readings import pair, slowdown_check, slower_by, time_change
from bench.claims.supporting import cpu_slowdown, recompute_ratio, same_flops
from bench.claims.verdict import Check, outcome_in_range, range_check, value_check
from bench.measure.flops import flops_per_sample
from bench.measure.hardware import gpu_spec
from bench.measure.utilization import samples_per_s_at, utilization_pct
from bench.train.imagenet_like import IMAGENET_TRAIN
from bench.units import GB, MB, gflop, tflop_per_s

MODEL = "resnet50"

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
                                      value * GB, 0.25, "GB", GB, label=f"{label} {phase}", favourable=None))
    return checks


@claims.add(
    id="002-b-slower",
    summary="B (8×16) is 6 % slower than A (128×1)",
    quote="Strategy B is 6% slower.",
    experiment="claims_strategies",
    sources=GPU_SPEED,
    method="Samples/s of the most-accumulated split against the large batch (median of the timed steps), on a GPU.",
    elsewhere="a claim about GPU speed: CPU timings and estimates give no verdict on it.",
    supporting=(lambda root: cpu_slowdown(root, "claims_strategies", {}, ends=True),
                lambda root: [same_flops("resnet50", 224, "the two splits")]),
)
def b_slower(rows: Rows) -> list[Check]:
    large, accumulated = _ends(rows)
    slower = slower_by(large, accumulated)
    measured = f"{pair(accumulated)} {time_change(slower)} than {pair(large)}"
    return [Check("B slower than A", measured, slower > 0), slowdown_check("by 6 % (3 to 9 %)", slower, 0.03, 0.09)]


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
    return [value_check("~150 MB of activations per image", slope, 150 * MB, 0.25, "MB", MB, 1, "per image",
                        favourable=None)]


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
    return [value_check("M_model 102 MB", row.params_bytes, 102 * MB, 0.05, "MB", MB, 1, "weights", favourable=None),
            value_check("M_optim 205 MB", row.optimizer_state_bytes, 205 * MB, 0.05, "MB", MB, 1, "AdamW",
                        favourable=None),
            value_check("M_gradients 102 MB", row.grads_bytes, 102 * MB, 0.05, "MB", MB, 1, "gradients",
                        favourable=None)]


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


def weight_versions(results_root: Path) -> list[str]:
    """What the weights' write counters read in a traced step of the most-accumulated split."""
    rows = load_sources(results_root, "claims_strategies")
    measured = rows.get("cuda") or rows.get("cpu")
    if measured is None:
        raise Missing("no measured claims_strategies rows")
    _, accumulated = _ends(Rows(measured.source, measured.folder, measured.frame))
    forwards = [version for step, name, _, _, version in phases(accumulated) if step == 0 and name == "forward"]
    if not forwards or forwards[0] is None:
        raise Missing(f"{accumulated.cell_id}: no weights_version in step_memory")
    return [f"the parameters' write counters ({SOURCE_WORDS[measured.source]}, {pair(accumulated)}): "
            f"{len(forwards)} forwards of one step ran at {len(set(forwards))} weight version(s); the weights "
            "change only at optimizer.step"]


@claims.add(
    id="002-staleness",
    summary="micro-batches after the first compute gradients on stale weights",
    quote=("In Strategy B, you see 128 examples (8 × 16) before updating once — but the last 15 micro-batches are "
        "computing gradients based on stale weights."),
    experiment=EQUIVALENCE,
    sources=("equivalence",),
    method=("The equivalence study: one step of a LayerNorm model (ViT-B/16, no layer mixes samples) as K "
        "accumulated micro-batches against one batch of the same samples, from the same weights. Stale weights "
        "would make the accumulated gradient differ; it equals the large batch's to fp32 rounding at every K. "
        "(With BatchNorm the gradients differ, because each micro-batch normalises with its own statistics, "
        "not because of the weights.)"),
    supporting=(weight_versions,),
)
def staleness(rows: Rows) -> list[Check]:
    frame = rows.all(variant="correct")
    layernorm = frame[frame.bn_stats_rel_l2.isna() & (frame.accum_steps > 1)]
    if layernorm.empty:
        raise Missing(f"no LayerNorm model's correct variant at K > 1 in {rows.folder}")
    worst = layernorm.loc[layernorm.grad_rel_l2.idxmax()]
    measured = (f"{worst.model}: gradient relative L2 {worst.grad_rel_l2:.1e} at K = {int(worst.accum_steps)} "
                f"(largest over K = {', '.join(str(int(k)) for k in sorted(layernorm.accum_steps))}), "
                f"tolerance {worst.tolerance:g}")
    return [Check("accumulated gradients differ from the large batch's (stale weights)", measured,
                  worst.grad_rel_l2 > worst.tolerance)]


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
        row = rows.one(gpu=gpu, precision="fp32", checkpointing="off")
        checks.append(value_check(f"{gpu}: batch {claimed}", float(row.largest_micro_batch), claimed, 0.25, "",
                                  1, 0, f"{gpu}:", favourable=None))
    return checks


@claims.add(
    id="002-checkpointing-time",
    summary="checkpointing: 33 % slower training (ResNet-50)",
    quote="The tradeoff: 33% slower training (you’re doing forward pass twice per batch).",
    experiment="claims_checkpointing",
    sources=GPU_SPEED,
    method="Samples/s of ResNet-50 with timm's full checkpointing against none, on a GPU.",
    elsewhere="a claim about GPU speed: CPU timings give no verdict on it.",
    supporting=(lambda root: [recompute_ratio("resnet50", 224, "full")],
                lambda root: cpu_slowdown(root, "claims_checkpointing", {"model": "resnet50"},
                                          column="checkpointing", base="off", other="full")),
)
def resnet_checkpointing_time(rows: Rows) -> list[Check]:
    off, full = rows.one(model="resnet50", checkpointing="off"), rows.one(model="resnet50", checkpointing="full")
    slower = slower_by(off, full)
    return [slowdown_check("33 % slower (23 to 43 %)", slower, 0.23, 0.43)]


# --- the article's own figures, and the largest batches ------------------------------------------------

ARTICLE_HOURS = {"A": 17.8, "B": 18.9}
"""Strategy A's and B's hours for 90 epochs of ImageNet-1k on one A100 (40 GB), as the article gives them."""
ARTICLE_EPOCHS = 90
ARTICLE_GPU = "A100-40GB"


@claims.add(
    id="002-85-mfu",
    summary="batch 128 hits 85 % MFU on the A100",
    quote="while batch size 128 hits 85% MFU (model FLOPs utilization)",
    experiment="arithmetic",
    sources=("arithmetic",),
    method=("From the article's own figures: 90 epochs of ImageNet-1k (1,281,167 images) in 17.8 h on one A100 "
        "is its samples/s; times ResNet-50's training FLOPs per sample at 224 px (the FLOP counter, forward + "
        "backward, no recompute) over the A100's dense fp16 tensor peak (the GPU catalog; the article trains "
        "under fp16 autocast)."),
)
def eighty_five_mfu(rows: Rows) -> list[Check]:
    rate = IMAGENET_TRAIN.images * ARTICLE_EPOCHS / (ARTICLE_HOURS["A"] * 3600)
    flops = flops_per_sample(MODEL, 224, "off").model
    peak = gpu_spec(ARTICLE_GPU).peak_flops_per_s("fp16")
    mfu = utilization_pct(flops, rate, peak)
    measured = (f"{rate:,.0f} samples/s × {gflop(flops)} / {tflop_per_s(peak, 0)} = {mfu:.1f} % MFU "
                f"(85 % would be {samples_per_s_at(85, flops, peak):,.0f} samples/s, 90 epochs in "
                f"{IMAGENET_TRAIN.images * ARTICLE_EPOCHS / samples_per_s_at(85, flops, peak) / 3600:.1f} h)")
    return [Check("85 % MFU (75 to 95 %)", measured, outcome_in_range(mfu, 75, 95, favourable="higher"))]


@claims.add(
    id="002-steps",
    summary="90 epochs: 281k optimizer steps; B: 4.5M micro-batch steps",
    quote=("Strategy A: 17.8 hours for 90 epochs (281k steps) • Strategy B: 18.9 hours for 90 epochs (281k optimizer "
        "updates, 4.5M micro-batch steps)"),
    experiment="arithmetic",
    sources=("arithmetic",),
    method=("90 epochs × 1,281,167 ImageNet-1k training images / 128 samples per optimizer step; strategy B's "
        "micro-batch steps are 16 per optimizer step. (281k × 128 samples is 28 epochs.)"),
)
def step_counts(rows: Rows) -> list[Check]:
    steps = IMAGENET_TRAIN.images * ARTICLE_EPOCHS / 128
    micro = steps * 16
    return [value_check("281k optimizer steps", steps, 281e3, 0.05, "k", 1e3, 1, "steps", favourable=None),
            value_check("4.5M micro-batch steps (strategy B)", micro, 4.5e6, 0.05, "M", 1e6, 2, "micro-batch steps",
                        favourable=None)]


ARTICLE_USD_PER_HOUR = 32.77
"""The article's price of one p4d.24xlarge (8x A100 40GB), the figure its costs are computed from."""
SWEEP_RUNS = 50


@claims.add(
    id="002-cost",
    summary="A $73, B $77 per run; the 6 % costs $4 a run, $200 over a 50-run sweep",
    quote=("• Strategy A: 17.8 hours ÷ 8 GPUs = 2.23 hours per GPU → $73 total • Strategy B: 18.9 hours ÷ 8 GPUs = "
        "2.36 hours per GPU → $77 total The 6% time difference translates to a $4 cost difference for this one "
        "training run. If you’re iterating on hyperparameters (say, 50 runs for a sweep), that’s $200 wasted."),
    experiment="arithmetic",
    sources=("arithmetic",),
    method=("The article's own hours and price: hours ÷ 8 GPUs × $32.77 per p4d.24xlarge hour, unrounded; the gap "
        "is B's cost less A's, and the sweep 50 such gaps. (The article's $4 is $77 − $73 after rounding each; "
        "50 × $4 is its $200.)"),
)
def cost(rows: Rows) -> list[Check]:
    usd = {name: hours / 8 * ARTICLE_USD_PER_HOUR for name, hours in ARTICLE_HOURS.items()}
    gap = usd["B"] - usd["A"]
    return [value_check("A: $73 a run", usd["A"], 73, 0.02, "$", label="A", favourable=None),
            value_check("B: $77 a run", usd["B"], 77, 0.02, "$", label="B", favourable=None),
            value_check("a $4 difference a run", gap, 4, 0.05, "$", label="gap", favourable=None),
            value_check("$200 over a 50-run sweep", SWEEP_RUNS * gap, 200, 0.05, "$", 1, 0, label="sweep",
                        favourable=None)]


def _largest(rows: Rows, gpu: str, precision: str, checkpointing: str) -> int:
    return int(rows.one(gpu=gpu, precision=precision, checkpointing=checkpointing).largest_micro_batch)


@claims.add(
    id="002-checkpointing-batch-256",
    summary="with checkpointing batch 256 fits an A100, without it 128",
    quote="With checkpointing, I can fit batch 256 on an A100 (vs batch 128 without).",
    experiment="claims_autotune",
    sources=("estimate",),
    method=("The memory estimator's largest ResNet-50 micro-batch on an A100 40 GB (224 px, fp16 autocast as the "
        "article's loop, AdamW, no headroom), without and with timm's full checkpointing (`bench probe`). The "
        "verdict rests on the limit without checkpointing: the claim is that 256 needs it."),
    elsewhere="answered by the estimator only (`bench probe`).",
)
def checkpointing_batch_256(rows: Rows) -> list[Check]:
    plain, checkpointed = _largest(rows, ARTICLE_GPU, "fp16", "off"), _largest(rows, ARTICLE_GPU, "fp16", "full")
    measured = f"largest micro-batch {plain} without checkpointing, {checkpointed} with"
    # The claim's substance is the limit without checkpointing (128, so 256 needs it): that 128 fits, and that
    # 256 fits with checkpointing, follow from any limit at or above 256 and decide nothing.
    return [Check("without checkpointing the limit is 128: batch 256 does not fit", measured, 128 <= plain < 256)]


@claims.add(
    id="002-checkpointing-2-4x",
    summary="checkpointing buys 2-4× larger batches",
    quote="If you OOM, enable gradient checkpointing. This usually buys you 2-4× larger batches for a 30% speed hit.",
    experiment="claims_autotune",
    sources=("estimate",),
    method=("The estimator's largest ResNet-50 micro-batch on an A100 40 GB (fp16 autocast, AdamW) with full "
        "checkpointing over without it. (The speed hit is claim 002-checkpointing-time's.)"),
    elsewhere="answered by the estimator only (`bench probe`).",
)
def checkpointing_larger_batches(rows: Rows) -> list[Check]:
    ratio = _largest(rows, ARTICLE_GPU, "fp16", "full") / _largest(rows, ARTICLE_GPU, "fp16", "off")
    return [range_check("2-4× larger batches", ratio, 2, 4, 0.0, "×", label="with checkpointing", favourable="higher")]


@claims.add(
    id="002-mixed-precision-halves",
    summary="mixed precision halves model and gradient memory",
    quote=("With mixed precision (fp16 forward/backward, fp32 master weights), the model and gradient memory drops by "
        "half, but optimizer states remain fp32."),
    experiment="claims_precision",
    sources=ANY,
    method=("Parameter and gradient bytes measured from the tensors, fp16 autocast (bf16 where fp16 was not run) "
        "against fp32, ViT-L/16. torch.autocast keeps the parameters and their gradients in fp32; the fp16 "
        "copies it makes for the forward are activations (claim 001-fp16-copy)."),
)
def mixed_precision_halves(rows: Rows) -> list[Check]:
    fp32 = rows.all(precision="fp32").iloc[0]
    amp_name, amp = rows.autocast(micro_batch=int(fp32.micro_batch))
    checks = []
    for column, name in (("params_bytes", "model"), ("grads_bytes", "gradients")):
        ratio = amp[column] / fp32[column]
        checks.append(value_check(f"{name} memory halves ({amp_name}/fp32 = 0.5)", ratio, 0.5, 0.10, "",
                                  label=f"{name} {amp_name}/fp32 =", favourable="lower"))
    return checks



@claims.add(
    id="002-vit-l-slower-at-8",
    summary="ViT-L: 30 % slower at batch 8 with accumulation than at 64",
    quote="I’ve seen ViT-Large slow down by 30% when going from batch 64 to batch 8 with accumulation.",
    experiment="claims_vit_sizes",
    sources=GPU_SPEED,
    method="Samples/s of ViT-L/16 at 8×8 against 64×1 (224 px, bf16 autocast, AdamW), on a GPU.",
    elsewhere="a claim about GPU speed: CPU timings give no verdict on it.",
    supporting=(lambda root: [same_flops("vit_large_patch16_224", 224, "micro-batch 8 and 64")],
                lambda root: cpu_slowdown(root, "claims_vit_sizes", {"model": "vit_large_patch16_224"}, ends=True)),
)
def vit_l_slower_at_8(rows: Rows) -> list[Check]:
    large = rows.one(model="vit_large_patch16_224", micro_batch=64)
    small = rows.one(model="vit_large_patch16_224", micro_batch=8)
    return [slowdown_check("30 % slower (20 to 40 %)", slower_by(large, small), 0.20, 0.40)]


# --- what the equivalence study answers ------------------------------------------------------------------

@claims.add(
    id="002-loss-division",
    summary="without the loss / K, gradients are 16× too large",
    quote=("Notice the division by accumulation_steps in the loss. Without it, your gradient magnitudes would be 16× "
        "larger than intended, completely wrecking convergence."),
    experiment=EQUIVALENCE,
    sources=("equivalence",),
    method=("The equivalence study at K = 16: the accumulated gradient's norm without the division (`no_divide`) "
        "over the same split's with it (`correct`), per model."),
)
def loss_division(rows: Rows) -> list[Check]:
    checks = []
    for _, undivided in rows.all(variant="no_divide", accum_steps=16).iterrows():
        divided = rows.one(variant="correct", accum_steps=16, model=undivided.model)
        # Both against the same large batch: their ratio is no_divide's norm over correct's.
        ratio = float(undivided.grad_norm_ratio) / float(divided.grad_norm_ratio)
        checks.append(value_check(f"{undivided.model}: gradients 16× too large at K = 16", ratio, 16, 0.01, "×",
                                  label=f"{undivided.model}:", at=undivided.model, favourable=None))
    return checks


@claims.add(
    id="002-batchnorm-per-micro-batch",
    summary="BatchNorm running statistics update per micro-batch",
    quote=("Batch norm running mean/variance updates happen per micro-batch, not per accumulated batch. So with "
        "accumulation, your batch norm sees more diverse statistics."),
    experiment=EQUIVALENCE,
    sources=("equivalence",),
    method=("The equivalence study, ResNet-50 (BatchNorm), the correct loop: running-statistics updates of the "
        "most-updated BatchNorm layer in one step, K micro-batches against one large batch."),
)
def batchnorm_per_micro_batch(rows: Rows) -> list[Check]:
    frame = rows.all(variant="correct")
    frame = frame[frame.bn_updates_accumulated.notna() & (frame.accum_steps > 1)]
    if frame.empty:
        raise Missing(f"no BatchNorm model at K > 1 in {rows.folder}")
    return [Check(f"{row.model}, K = {int(row.accum_steps)}: K updates, not 1",
                  f"{int(row.bn_updates_accumulated)} updates (large batch: {int(row.bn_updates_large_batch)})",
                  int(row.bn_updates_accumulated) == int(row.accum_steps) and int(row.bn_updates_large_batch) == 1,
                  at=f"K = {int(row.accum_steps)}")
            for _, row in frame.iterrows()]


@claims.add(
    id="002-checkpointing-batchnorm",
    summary="checkpointing does not play well with BatchNorm",
    quote=("But be careful: checkpointing doesn’t play well with batch norm (since batch stats are computed in the "
        "first forward pass, not the recomputed one)."),
    experiment=EQUIVALENCE,
    sources=("equivalence",),
    method=("The equivalence study's `checkpoint` variant on ResNet-50: the recompute in backward runs every "
        "checkpointed BatchNorm again, in training mode, so its running statistics are updated twice per "
        "micro-batch. (The recompute computes batch statistics as the first forward did; the gradients stay "
        "those of the plain accumulated step.)"),
)
def checkpointing_batchnorm(rows: Rows) -> list[Check]:
    frame = rows.all(variant="checkpoint")
    frame = frame[frame.bn_updates_accumulated.notna()]
    if frame.empty:
        raise Missing(f"no BatchNorm model under the checkpoint variant in {rows.folder}")
    row = frame.loc[frame.accum_steps.idxmax()]
    return [Check("checkpointing changes BatchNorm's running statistics (more updates than micro-batches)",
                  f"{row.model}, K = {int(row.accum_steps)}: {int(row.bn_updates_accumulated)} updates",
                  int(row.bn_updates_accumulated) > int(row.accum_steps))]
