"""Every claim of the seed articles the harness checks: its words, its rows, its checks.

A claim names the experiment whose rows answer it and the sources it accepts, in order of
precedence (GPU rows first). Its `measure` reads one source's rows and returns checks
(`bench.claims.verdict`); the verdict is computed from them, never typed in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from bench.claims.evidence import Missing, Rows, Source, phase_bytes, phases, saved_activations_bytes
from bench.claims.verdict import Check, range_check, value_check

GB = 1e9  # the articles' gigabytes are decimal: "304M params x 4 bytes = 1.2GB"
MB = 1e6
MIB = 2**20

ARTICLES = {
    "000": "000_dc122f77705c9807.txt — Gradient Accumulation OOM: Hidden Memory Spike Explained",
    "001": "001_0d10a030942bbeb2.txt — Gradient Accumulation for Memory",
    "002": "002_3a55cb8a916d818f.txt — Gradient Accumulation vs Large Batch: Memory & Cost Test",
    "004": "004_61303b8cd52fbf66.txt — CUDA out of memory: three fixes and the silent leak",
}
ANY: tuple[Source, ...] = ("cuda", "cpu", "estimate")
MEASURED: tuple[Source, ...] = ("cuda", "cpu")
AT_GPU_SIZE: tuple[Source, ...] = ("cuda", "estimate")
# Activation ratios: at the articles' 224 px the estimate beats a CPU row at 32-64 px, where
# fixed costs (autocast's weight copies, the stem) weigh far more than in the article's setting.
RATIO: tuple[Source, ...] = ("cuda", "estimate", "cpu")


@dataclass(frozen=True)
class Claim:
    """One claim, quoted as the article words it, and how the rows test it."""

    id: str
    article: str
    """Key of `ARTICLES`."""
    summary: str
    """A few words for the table."""
    quote: str
    """The article's words, verbatim."""
    experiment: str
    """results/<experiment>: whose rows answer it."""
    sources: tuple[Source, ...]
    """Sources it accepts, first present wins."""
    measure: Callable[[Rows], list[Check]]
    method: str
    """How the rows are read, in words."""
    elsewhere: str = ""
    """Why the sources it leaves out cannot answer it."""


# --- helpers over one source's rows ---------------------------------------------------------

def _ends(rows: Rows, **where: object) -> tuple[pd.Series, pd.Series]:
    """(large-batch end: fewest accumulation steps, most-accumulated end) among matching rows."""
    frame = rows.all(**where).sort_values(["accum_steps", "cell_id"])
    if len(frame) < 2:
        raise Missing(f"needs two splits of the batch in {rows.folder}")
    return frame.iloc[0], frame.iloc[-1]


def _pair(row: pd.Series) -> str:
    return f"{int(row.micro_batch)}×{int(row.accum_steps)}"


def _per_sample_slope(frame: pd.DataFrame) -> float:
    """Least-squares slope of the saved activations against the micro-batch, bytes per sample."""
    if frame.micro_batch.nunique() < 2:
        raise Missing("needs at least two micro-batch sizes")
    saved = [saved_activations_bytes(row) for _, row in frame.iterrows()]
    return float(np.polyfit(frame.micro_batch.astype(float), saved, 1)[0])


def _phase_max(row: pd.Series, phase: str, step: int = 0) -> float:
    return max(nbytes for at, name, _, nbytes, _ in phases(row) if at == step and name == phase)


def _slower_by(fast: pd.Series, slow: pd.Series) -> float:
    """How much more time per sample `slow` takes than `fast` (0.33: 33 % slower)."""
    return float(fast.samples_per_s) / float(slow.samples_per_s) - 1


def _drop(before: float, after: float) -> float:
    return 1 - after / before


def _pct(value: float) -> str:
    return f"{100 * value:.1f} %"


def _time_change(slower: float) -> str:
    """0.33 -> "33.0 % slower"; -0.1 -> "10.0 % faster"."""
    return f"{_pct(abs(slower))} {'slower' if slower >= 0 else 'faster'}"


# --- seed 002 -------------------------------------------------------------------------------

def _strategy_phases(rows: Rows) -> list[Check]:
    large, accumulated = _ends(rows)
    claimed = {"A": (large, (18.2, 26.7, 22.1)), "B": (accumulated, (4.1, 6.8, 8.9))}
    checks = []
    for label, (row, values) in claimed.items():
        for phase, value in zip(("forward", "backward", "optimizer"), values):
            measured = _phase_max(row, phase)
            checks.append(value_check(f"{label} ({_pair(row)}) after {phase}: {value} GB", measured,
                                      value * GB, 0.25, "GB", GB, label=f"{label} {phase}"))
    return checks


def _b_slower(rows: Rows) -> list[Check]:
    large, accumulated = _ends(rows)
    slower = _slower_by(large, accumulated)
    measured = f"{_pair(accumulated)} {_time_change(slower)} than {_pair(large)}"
    return [Check("B slower than A", measured, slower > 0),
            Check("by 6 % (3 to 9 %)", measured, 0.03 <= slower <= 0.09)]


def _activation_per_image(rows: Rows) -> list[Check]:
    slope = _per_sample_slope(rows.all())
    return [value_check("~150 MB of activations per image", slope, 150 * MB, 0.25, "MB", MB, 1, "per image")]


def _resnet50_static(rows: Rows) -> list[Check]:
    row = rows.one(optimizer="adamw")
    return [value_check("M_model 102 MB", row.params_bytes, 102 * MB, 0.05, "MB", MB, 1, "weights"),
            value_check("M_optim 205 MB", row.optimizer_state_bytes, 205 * MB, 0.05, "MB", MB, 1, "AdamW"),
            value_check("M_gradients 102 MB", row.grads_bytes, 102 * MB, 0.05, "MB", MB, 1, "gradients")]


def _formula_adds_up(rows: Rows) -> list[Check]:
    frame = rows.all()
    slope = _per_sample_slope(frame)
    checks = []
    for row in _ends(rows):
        static = row.params_bytes + row.optimizer_state_bytes + row.grads_bytes
        predicted = static + slope * row.micro_batch
        checks.append(Check(f"{_pair(row)}: M_model + M_optim + M_gradients + M_activations(B) = peak (within 10 %)",
                            f"{predicted / GB:.2f} GB predicted, {row.peak_memory_bytes / GB:.2f} GB peak",
                            abs(predicted - row.peak_memory_bytes) <= 0.10 * row.peak_memory_bytes))
    return checks


def _staleness(rows: Rows) -> list[Check]:
    _, accumulated = _ends(rows)
    forwards = [version for step, name, _, _, version in phases(accumulated) if step == 0 and name == "forward"]
    if not forwards or forwards[0] is None:
        raise Missing(f"{accumulated.cell_id}: no weights_version in step_memory")
    distinct = len(set(forwards))
    measured = (f"{len(forwards)} forwards of one step ran at {distinct} weight version(s); "
                "the weights change only at optimizer.step")
    return [Check("later micro-batches of a step see older weights than the first", measured, distinct > 1)]


def _autotune(rows: Rows) -> list[Check]:
    checks = []
    for gpu, claimed in (("RTX-3090", 48), ("A100-40GB", 96)):
        row = rows.one(gpu=gpu)
        checks.append(value_check(f"{gpu}: batch {claimed}", float(row.largest_micro_batch), claimed, 0.25, "",
                                  1, 0, f"{gpu}:"))
    return checks


def _resnet_checkpointing_time(rows: Rows) -> list[Check]:
    off, full = rows.one(model="resnet50", checkpointing="off"), rows.one(model="resnet50", checkpointing="full")
    slower = _slower_by(off, full)
    return [Check("33 % slower (23 to 43 %)", _time_change(slower), 0.23 <= slower <= 0.43)]


# --- seed 000 -------------------------------------------------------------------------------

def _vit_l_static(rows: Rows) -> list[Check]:
    row = rows.one(optimizer="adamw", zero_grad="none", micro_batch=4)
    return [value_check("parameters 1.2 GB", row.params_bytes, 1.2 * GB, 0.05, "GB", GB, label="parameters"),
            value_check("AdamW state 2.4 GB", row.optimizer_state_bytes, 2.4 * GB, 0.05, "GB", GB, label="AdamW"),
            value_check("gradients 1.2 GB", row.grads_bytes, 1.2 * GB, 0.05, "GB", GB, label="gradients")]


def _vit_l_activations(rows: Rows) -> list[Check]:
    row = rows.one(optimizer="adamw", zero_grad="none", micro_batch=1)
    return [range_check("activations 6-8 GB at batch 1", saved_activations_bytes(row), 6 * GB, 8 * GB, 0.10,
                        "GB", GB, label="batch 1:")]


def _creep(rows: Rows) -> list[Check]:
    row = rows.one(loss_tracking="detached")
    trace = phases(row)
    growth = 0.0
    for step in sorted({at for at, *_ in trace}):
        backwards = [nbytes for at, name, _, nbytes, _ in trace if at == step and name == "backward"]
        growth = max(growth, max(backwards) / backwards[0] - 1)
    measured = f"after-backward memory rises at most {_pct(growth)} within a step ({_pair(row)}, {len({t[0] for t in trace})} steps)"
    return [Check("memory grows across the micro-batches of one accumulation cycle (> 1 %)", measured, growth > 0.01)]


def _bug_only(rows: Rows) -> list[Check]:
    def peak(micro: int, zero_grad: str) -> float:
        return float(rows.one(optimizer="adamw", zero_grad=zero_grad, micro_batch=micro).peak_memory_bytes)

    correct, buggy = (peak(1, "none"), peak(4, "none")), (peak(1, "zeros"), peak(4, "zeros"))
    return [Check("without the bug, 1×4 uses no more than 4×1",
                  f"1×4 {correct[0] / GB:.3f} GB, 4×1 {correct[1] / GB:.3f} GB", correct[0] <= correct[1]),
            Check("with zero_grad(set_to_none=False), 1×4 uses more than 4×1",
                  f"1×4 {buggy[0] / GB:.3f} GB, 4×1 {buggy[1] / GB:.3f} GB", buggy[0] > buggy[1])]


def _detach_fix(rows: Rows) -> list[Check]:
    attached, detached = rows.one(aux_loss="attached"), rows.one(aux_loss="detached")
    drop = _drop(attached.peak_memory_bytes, detached.peak_memory_bytes)
    backwards = [phase_bytes(attached, "backward", micro) for micro in range(int(attached.accum_steps))]
    kept = backwards[-1] - backwards[0]
    return [Check("detaching drops peak memory ~36 % (22 GB -> 14 GB; 26 to 46 %)",
                  f"{_pct(drop)} ({attached.peak_memory_bytes / GB:.3f} -> {detached.peak_memory_bytes / GB:.3f} GB)",
                  0.26 <= drop <= 0.46),
            Check("attached, outputs stay in memory across the accumulation steps (> 1 MiB kept)",
                  f"{kept / MIB:.3f} MiB more after the last backward than after the first", kept > MIB)]


def _vit_row(rows: Rows, checkpointing: str) -> pd.Series:
    """The ViT row of the checkpointing grid (ViT-L/16 on the GPU, ViT-B/16 on the CPU)."""
    frame = rows.all(checkpointing=checkpointing)
    frame = frame[frame.model.str.startswith("vit")]
    if frame.empty:
        raise Missing(f"no ViT row with checkpointing {checkpointing} in {rows.folder}")
    return frame.iloc[0]


def _checkpoint_reduction(rows: Rows, mode: str) -> float:
    return _drop(saved_activations_bytes(_vit_row(rows, "off")), saved_activations_bytes(_vit_row(rows, mode)))


def _vit_checkpointing_memory(rows: Rows) -> list[Check]:
    reduction = _checkpoint_reduction(rows, "full")
    return [Check("activation memory cut 60-70 % (55 to 75 %)", f"{_pct(reduction)} less saved activations",
                  0.55 <= reduction <= 0.75)]


def _selective_checkpointing(rows: Rows) -> list[Check]:
    reduction = _checkpoint_reduction(rows, "last-3")
    slower = _slower_by(_vit_row(rows, "off"), _vit_row(rows, "last-3"))
    return [Check("checkpointing the last 3 blocks: 50 % reduction (40 to 60 %)",
                  f"{_pct(reduction)} less saved activations", 0.40 <= reduction <= 0.60),
            Check("with < 20 % slowdown", _time_change(slower), slower < 0.20)]


def _amp_saving(rows: Rows) -> list[Check]:
    fp32 = rows.one(precision="fp32")
    try:
        amp_name, amp = "fp16", rows.one(precision="fp16")  # the article's autocast + GradScaler
    except Missing:
        amp_name, amp = "bf16", rows.one(precision="bf16")
    saving = _drop(fp32.peak_memory_bytes, amp.peak_memory_bytes)
    measured = f"{amp_name}: {_pct(saving)} less peak memory"
    return [Check("net saving 30-40 % (25 to 45 %)", measured, 0.25 <= saving <= 0.45),
            Check("not the 50 % (below 45 %)", measured, saving < 0.45)]


def _eight_bit(rows: Rows) -> list[Check]:
    row = rows.one(optimizer="adamw8bit")
    return [value_check("8-bit AdamW state ~600 MB", row.optimizer_state_bytes, 600 * MB, 0.10, "MB", MB, 0,
                        f"8-bit state (params {row.params_bytes / MB:.0f} MB)")]


def _sgd_state(rows: Rows) -> list[Check]:
    sgd, adamw = rows.one(optimizer="sgd"), rows.one(optimizer="adamw", zero_grad="none", micro_batch=4)
    return [value_check("SGD keeps one buffer (state = parameter bytes)", sgd.optimizer_state_bytes,
                        float(sgd.params_bytes), 0.01, "GB", GB, 3, f"SGD state (params {sgd.params_bytes / GB:.3f} GB)"),
            value_check("saves 1.2 GB against AdamW", adamw.optimizer_state_bytes - sgd.optimizer_state_bytes,
                        1.2 * GB, 0.05, "GB", GB, label="AdamW - SGD")]


def _set_to_none(rows: Rows) -> list[Check]:
    none = rows.one(optimizer="adamw", zero_grad="none", micro_batch=4)
    zeros = rows.one(optimizer="adamw", zero_grad="zeros", micro_batch=4)
    last = int(none.accum_steps) - 1
    freed = phase_bytes(zeros, "zero_grad", last) - phase_bytes(none, "zero_grad", last)
    peak_change = zeros.peak_memory_bytes - none.peak_memory_bytes
    return [Check("set_to_none=True deallocates the gradients (>= 95 % of their bytes freed)",
                  f"{freed / GB:.2f} GB less after zero_grad; gradients {none.grads_bytes / GB:.2f} GB; "
                  f"peak {peak_change / GB:+.3f} GB with zeros", freed >= 0.95 * none.grads_bytes),
            range_check("saves 1-2 GB for a large model", freed, 1 * GB, 2 * GB, 0.0, "GB", GB, label="saved")]


def _compile_memory(rows: Rows) -> list[Check]:
    checks = []
    for model in sorted(set(rows.all().model)):
        off, on = rows.one(model=model, compile="off"), rows.one(model=model, compile="on")
        change = on.peak_memory_bytes / off.peak_memory_bytes - 1
        checks.append(Check(f"{model}: compiled peak lower (fusion reduces intermediates)",
                            f"{_pct(change)} peak with compile", change < -0.01))
    return checks


def _compile_speed(rows: Rows) -> list[Check]:
    checks = []
    for model in sorted(set(rows.all().model)):
        off, on = rows.one(model=model, compile="off"), rows.one(model=model, compile="on")
        change = on.samples_per_s / off.samples_per_s - 1
        checks.append(Check(f"{model}: compiled step faster", f"{_pct(change)} samples/s with compile", change > 0.01))
    return checks


# --- seed 004 -------------------------------------------------------------------------------

def _leak(rows: Rows) -> list[Check]:
    live = rows.one(loss_tracking="live_tensor")
    nodes = json.loads(live.kept_graph_nodes)
    other_nodes = [max(json.loads(rows.one(loss_tracking=name).kept_graph_nodes)) for name in ("detached", "item")]
    steps = len(nodes)
    after = [nbytes for _, name, _, nbytes, _ in phases(live) if name == "zero_grad"]
    per_step = (after[-1] - after[0]) / max(steps - 1, 1)
    rss_per_step = {name: _rss_per_step(rows.one(loss_tracking=name)) for name in ("live_tensor", "detached")}
    grows = all(b > a for a, b in zip(nodes, nodes[1:]))
    return [Check("the live tensor retains the graph of every step",
                  f"graph nodes kept: {nodes} (detached, item: {other_nodes})",
                  grows and steps > 1 and max(other_nodes) == 0),
            Check("memory grows (tensor memory, > 1 MiB per step)",
                  f"{per_step:.0f} bytes/step of tensors; host RSS {rss_per_step['live_tensor'] / MIB:+.2f} "
                  f"MiB/step (detached: {rss_per_step['detached'] / MIB:+.2f})",
                  per_step > MIB)]


def _rss_per_step(row: pd.Series) -> float:
    rss = json.loads(row.host_rss_bytes)
    return (rss[-1] - rss[0]) / max(len(rss) - 1, 1) if rss and rss[0] is not None else float("nan")


def _bf16_halves(rows: Rows) -> list[Check]:
    fp32, bf16 = rows.one(precision="fp32"), rows.one(precision="bf16")
    ratio = saved_activations_bytes(bf16) / saved_activations_bytes(fp32)
    return [Check("bf16 roughly halves activation memory (ratio 0.4 to 0.6)", f"bf16/fp32 = {ratio:.2f}",
                  0.4 <= ratio <= 0.6)]


def _expandable(rows: Rows) -> list[Check]:
    checks = []
    default = rows.all(allocator="default")
    for _, row in default.iterrows():
        other = rows.one(model=row.model, micro_batch=row.micro_batch, allocator="expandable_segments")
        gaps = [r.peak_reserved_bytes - r.peak_allocated_bytes for r in (row, other)]
        checks.append(Check(f"{row.model} {_pair(row)}: less reserved - allocated with expandable segments",
                            f"{gaps[0] / MIB:.0f} -> {gaps[1] / MIB:.0f} MiB", gaps[1] < gaps[0]))
    return checks


# --- seed 001 -------------------------------------------------------------------------------

def _bytes_per_parameter(rows: Rows) -> list[Check]:
    row = rows.one(optimizer="adamw", zero_grad="none", micro_batch=4)
    count = float(row.param_count)
    return [value_check("parameters 4P bytes", row.params_bytes, 4 * count, 0.01, "bytes/param", count, label="parameters"),
            value_check("gradients 4P bytes", row.grads_bytes, 4 * count, 0.01, "bytes/param", count, label="gradients"),
            value_check("Adam state ~8P bytes", row.optimizer_state_bytes, 8 * count, 0.01, "bytes/param", count,
                        label="AdamW")]


def _linear_in_batch(rows: Rows) -> list[Check]:
    frame = rows.all()
    per_sample = {_pair(row): saved_activations_bytes(row) / row.micro_batch for _, row in frame.iterrows()}
    mean = float(np.mean(list(per_sample.values())))
    spread = max(abs(v - mean) for v in per_sample.values()) / mean
    shown = ", ".join(f"{pair}: {value / MB:.2f} MB" for pair, value in per_sample.items())
    return [Check("activations per sample the same at every micro-batch (within 10 %)", shown, spread <= 0.10)]


def _constant_in_k(rows: Rows) -> list[Check]:
    frame = rows.all()
    checks = []
    for column, name in (("params_bytes", "parameters"), ("optimizer_state_bytes", "optimizer state"),
                         ("grads_bytes", "gradients")):
        values = sorted(set(frame[column].astype(int)))
        checks.append(Check(f"{name} the same at every K", f"{name} " + ", ".join(f"{v / MB:.1f} MB" for v in values),
                            len(values) == 1))
    return checks


# --- the registry ---------------------------------------------------------------------------

_ESTIMATED = ("At 224 px the activation numbers come from GPU rows or, without them, from the "
              "memory estimator (`bench estimate`, labelled estimated).")

CLAIMS: tuple[Claim, ...] = (
    Claim("002-phase-memory", "002", "A 128×1 vs B 8×16: memory after forward / backward / step",
          "Strategy A (batch 128, no accumulation): • After forward: 18.2 GB (activations dominate) • After backward: "
          "26.7 GB (gradients + activations) • After optimizer step: 22.1 GB (activations freed, optimizer states "
          "remain) [...] Strategy B (batch 8, accum 16): • After forward: 4.1 GB (8× smaller activation memory) • After "
          "backward: 6.8 GB (gradients accumulate but activations are small) • After optimizer step: 8.9 GB "
          "(optimizer state same size as Strategy A)",
          "claims_strategies", AT_GPU_SIZE, _strategy_phases,
          "Allocated memory after each phase of one traced step (the largest over micro-steps); "
          "ResNet-50, 224 px, fp16 autocast, AdamW. " + _ESTIMATED,
          "CPU rows are at 32 px, where these absolute sizes do not apply."),
    Claim("002-b-slower", "002", "B (8×16) is 6 % slower than A (128×1)", "Strategy B is 6% slower.",
          "claims_strategies", MEASURED, _b_slower,
          "Samples/s of the most-accumulated split against the large batch (median of the timed steps).",
          "an estimate has no time."),
    Claim("002-activations-per-image", "002", "~150 MB of activations per image (ResNet-50, 224 px)",
          "$M_{\\text{activations}}(B)$: approximately 150 MB per image for ResNet-50 at 224×224",
          "claims_strategies", AT_GPU_SIZE, _activation_per_image,
          "Slope of the activations saved by the first forward against the micro-batch. " + _ESTIMATED,
          "CPU rows are at 32 px."),
    Claim("002-static", "002", "ResNet-50: 102 MB weights, 205 MB AdamW state, 102 MB gradients",
          "$M_{\\text{model}}$ (fp32 weights): 25.6M params × 4 bytes = 102 MB • $M_{\\text{optim}}$ (AdamW "
          "states): 25.6M × 8 bytes = 205 MB (momentum + variance) • $M_{\\text{gradients}}$: 25.6M × 4 bytes = 102 MB",
          "claims_strategies", ANY, _resnet50_static,
          "Parameter, gradient and optimizer-state bytes measured from the tensors (they do not depend on image size)."),
    Claim("002-formula", "002", "M_total = M_model + M_optim + M_activations(B) + M_gradients adds up",
          "The memory formula for gradient accumulation is: $$M_{\\text{total}} = M_{\\text{model}} + "
          "M_{\\text{optim}} + M_{\\text{activations}}(B) + M_{\\text{gradients}}$$ where $B$ is the micro-batch "
          "size (not the effective batch size).",
          "claims_strategies", AT_GPU_SIZE, _formula_adds_up,
          "Measured static bytes plus the per-sample activation slope × B, against the measured peak, at both ends. "
          + _ESTIMATED, "CPU rows are at 32 px."),
    Claim("002-staleness", "002", "micro-batches after the first compute gradients on stale weights",
          "In Strategy B, you see 128 examples (8 × 16) before updating once — but the last 15 micro-batches are "
          "computing gradients based on stale weights.",
          "claims_strategies", MEASURED, _staleness,
          "The parameters' in-place write counters, read after every forward of a traced step: a change would "
          "mean a micro-batch ran at different weights. All micro-batches of a step run at the weights of the "
          "last update, exactly as strategy A's single batch does.",
          "an estimate runs on fake tensors; the counters are read from measured rows."),
    Claim("002-autotune", "002", "auto-tuned batch: 48 on a 24 GB 3090, 96 on an A100 40 GB",
          "On a 3090, this auto-detects batch 48 for ResNet-50. On an A100, it finds batch 96.",
          "claims_autotune", ("estimate",), _autotune,
          "The memory estimator's largest micro-batch (`bench probe resnet50 --gpu ...`, fp32, AdamW, no "
          "headroom: the article's search keeps none). Note: the article's `find_max_batch_size` halves from 256, "
          "so it can only return powers of two; 48 and 96 are not among them.",
          "answered by the estimator only (`bench probe`)."),
    Claim("002-checkpointing-time", "002", "checkpointing: 33 % slower training (ResNet-50)",
          "The tradeoff: 33% slower training (you’re doing forward pass twice per batch).",
          "claims_checkpointing", MEASURED, _resnet_checkpointing_time,
          "Samples/s of ResNet-50 with timm's full checkpointing against none.", "an estimate has no time."),
    Claim("000-vit-l-static", "000", "ViT-L/16: 1.2 GB params, 2.4 GB AdamW state, 1.2 GB grads",
          "Model parameters: 304M params × 4 bytes (FP32) = 1.2GB • Optimizer state (AdamW): 2× params for "
          "momentum + variance = 2.4GB • Gradients: 304M × 4 bytes = 1.2GB",
          "claims_vit_l16", ("cuda", "cpu", "estimate"), _vit_l_static,
          "Bytes measured from the tensors; independent of image size, so the CPU rows (32 px) answer it exactly."),
    Claim("000-vit-l-activations", "000", "ViT-L/16: 6-8 GB of activations at batch 1",
          "Activations (stored for backward): ~6-8GB for batch_size=1",
          "claims_vit_l16", AT_GPU_SIZE, _vit_l_activations,
          "Activations saved by the first forward of the 1×4 cell (micro-batch 1), 224 px, fp32. " + _ESTIMATED,
          "CPU rows are at 32 px."),
    Claim("000-creep", "000", "memory creeps across the micro-steps of one accumulation cycle",
          "The memory grows across micro-batches within a single accumulation cycle, even though backward() "
          "should free activations.",
          "claims_leak", MEASURED, _creep,
          "Allocated memory after every backward of several traced optimizer steps (the correct loop, running "
          "loss detached): growth from the first micro-step to the later ones.",
          "an estimate traces one step."),
    Claim("000-bug-only", "000", "1×4 uses more memory than 4×1 only with a bug (missing set_to_none)",
          "Run batch_size=4, accumulation=1 vs batch_size=1, accumulation=4. If the latter uses MORE memory, "
          "you’ve got a gradient accumulation bug (likely missing zero_grad(set_to_none=True)).",
          "claims_vit_l16", ("cuda", "estimate", "cpu"), _bug_only,
          "Peak memory of 4×1 and 1×4, ViT-L/16 AdamW, with zero_grad(set_to_none=True) and with zeros. " + _ESTIMATED),
    Claim("000-detach-fix", "000", "detaching the regulariser's outputs: 22 GB -> 14 GB",
          "The problem: outputs is kept in memory across all accumulation steps because autograd needs it for the "
          "backward pass of l2_loss. [...] This one-line change dropped my ViT training memory from 22GB (crash) to "
          "14GB (stable).",
          "claims_detach", ("cuda", "cpu", "estimate"), _detach_fix,
          "The article's loop: total_loss = ce_loss + 0.01 * (outputs ** 2).mean(), with outputs attached or "
          "detached: peak memory, and memory after each backward of a traced step. Detaching also removes the "
          "regulariser's gradient: the 'fix' changes what is trained."),
    Claim("000-checkpointing-memory", "000", "checkpointing cuts 60-70 % of a transformer's activation memory",
          "Memory savings: ~60-70% activation memory reduction for transformers.",
          "claims_checkpointing", RATIO, _vit_checkpointing_memory,
          "Activations saved by the first forward, ViT, full checkpointing (timm) against none."),
    Claim("000-selective-checkpointing", "000", "checkpointing the top 3 layers: 50 % less, < 20 % slower",
          "Profile and checkpoint the top 3 memory-hungry layers — usually gets you 50% reduction with <20% slowdown.",
          "claims_checkpointing", MEASURED, _selective_checkpointing,
          "Checkpointing the last 3 blocks (`last-3`) of the ViT: saved activations and samples/s against none.",
          "an estimate has no time."),
    Claim("000-amp-saving", "000", "AMP saves 30-40 % of memory, not 50 %",
          "Net memory saving: ~30-40%, not the 50% you’d expect.",
          "claims_precision", ("cuda", "estimate", "cpu"), _amp_saving,
          "Peak memory with autocast (fp16 where measured, else bf16) against fp32, ViT, AdamW on the GPU grid. "
          + _ESTIMATED + " An estimate runs CPU autocast's op lists, not CUDA's."),
    Claim("000-8bit-adamw", "000", "8-bit AdamW: optimizer state 2.4 GB -> ~0.6 GB",
          "This quantizes optimizer states to INT8, cutting that 2.4GB to ~600MB.",
          "claims_vit_l16", MEASURED, _eight_bit,
          "bitsandbytes AdamW8bit's state bytes, measured from its tensors (ViT-L/16).",
          "the estimator cannot run bitsandbytes on fake tensors."),
    Claim("000-sgd-state", "000", "SGD with momentum keeps one state buffer, saving 1.2 GB",
          "Another option: SGD with momentum (only one extra state buffer) [...] it saves 1.2GB right there.",
          "claims_vit_l16", ANY, _sgd_state,
          "Optimizer-state bytes of SGD (momentum 0.9) and AdamW, ViT-L/16."),
    Claim("000-set-to-none", "000", "zero_grad(set_to_none=True) frees the gradients: 1-2 GB",
          "Use optimizer.zero_grad(set_to_none=True) to actually deallocate them. This can save 1-2GB for large "
          "models, especially between accumulation cycles.",
          "claims_vit_l16", ANY, _set_to_none,
          "Memory after zero_grad with set_to_none=True against zeros (ViT-L/16, AdamW, 4×1); the peak change is shown too."),
    Claim("000-compile-memory", "000", "open question: torch.compile and memory under accumulation",
          "whether PyTorch 2.x’s torch.compile() helps or hurts here. The kernel fusion should reduce intermediate "
          "allocations, but I’ve seen mixed results — sometimes it helps, sometimes the compiled graph holds onto "
          "tensors longer.",
          "claims_compile", ("cuda",), _compile_memory,
          "Peak allocated memory over the timed steps, compile on against off (32×4, AdamW).",
          "on a CPU the peak comes from MemTracker's trace, which does not see the allocations of inductor's "
          "compiled kernels, so CPU rows cannot answer it."),
    Claim("000-compile-speed", "000", "open question: torch.compile and speed under accumulation",
          "whether PyTorch 2.x’s torch.compile() helps or hurts here.",
          "claims_compile", MEASURED, _compile_speed,
          "Samples/s over the timed steps (compilation is in the warm-up), compile on against off. The "
          "untimed MemTracker trace runs between warm-up and timing; its global module hooks are a change "
          "torch.compile guards on, so a CPU row's compiled speed deserves a second, quiet measurement.",
          "an estimate has no time."),
    Claim("004-live-loss-leak", "004", "keeping the live loss tensor leaks the graph; memory grows every step",
          "running_loss += loss          # ❌ retains the graph for every step — memory grows",
          "claims_leak", MEASURED, _leak,
          "The running loss kept as the live tensor across several traced optimizer steps: autograd nodes "
          "reachable from it, tensor memory after each step, the process's resident memory. backward() frees "
          "the saved tensors of each graph; what stays is the graph's nodes, in host memory.",
          "an estimate traces one step."),
    Claim("004-bf16-halves", "004", "bf16 autocast roughly halves activation memory",
          "wrap the forward pass in torch.autocast(\"cuda\", dtype=torch.bfloat16) to roughly halve activation memory.",
          "claims_precision", RATIO, _bf16_halves,
          "Activations saved by the first forward (autocast's low-precision weight copies included), bf16 "
          "autocast against fp32. An estimate runs CPU autocast's op lists, not CUDA's."),
    Claim("004-expandable-segments", "004", "expandable_segments reduces fragmentation (reserved − allocated)",
          "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True reduces fragmentation, which is exactly the case where "
          "you have enough total free memory but not one contiguous block big enough for the next allocation.",
          "claims_allocator", ("cuda",), _expandable,
          "Peak reserved minus peak allocated over the timed steps, with and without expandable segments.",
          "a setting of CUDA's caching allocator: not testable on CPU."),
    Claim("001-bytes-per-parameter", "001", "parameters 4P, gradients 4P, Adam state 8P bytes",
          "For a model with $P$ parameters stored in float32, this costs $4P$ bytes. [...] Adam maintains first "
          "and second moment estimates, costing roughly $8P$ bytes in float32 [...] Costs $4P$ bytes in float32",
          "claims_vit_l16", MEASURED, _bytes_per_parameter,
          "Bytes measured from the tensors over the parameter count P (ViT-L/16, fp32, AdamW).",
          "estimate rows carry no parameter count."),
    Claim("001-activations-linear", "001", "activation memory is linear in the batch",
          "If you double the batch size, you double the number of samples in flight, and thus double the total "
          "activation storage.",
          "claims_strategies", RATIO, _linear_in_batch,
          "Activations saved by the first forward, per sample, at every micro-batch of the ResNet-50 grid."),
    Claim("001-static-constant-in-k", "001", "parameters, optimizer state and gradients do not depend on K",
          "Parameters, optimizer states, and gradient buffers remain constant regardless of $K$.",
          "claims_strategies", ANY, _constant_in_k,
          "Parameter, optimizer-state and gradient bytes of every split of the effective batch."),
)
