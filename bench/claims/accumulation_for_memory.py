"""Seed 001's claims ("Gradient Accumulation for Memory"), each beside the check that tests it."""

from __future__ import annotations

import numpy as np

from bench.claims.claim import (
    ANY,
    AT_GPU_SIZE,
    ESTIMATED,
    MEASURED,
    RATIO,
    ClaimList,
)
from bench.claims.evidence import Missing, Rows, saved_activations_bytes
from bench.claims.readings import pair
from bench.claims.verdict import Check, value_check
from bench.units import GB, MB

claims = ClaimList(article="001")


@claims.add(
    id="001-bytes-per-parameter",
    summary="parameters 4P, gradients 4P, Adam state 8P bytes",
    quote=("For a model with $P$ parameters stored in float32, this costs $4P$ bytes. [...] Adam maintains first "
        "and second moment estimates, costing roughly $8P$ bytes in float32 [...] Costs $4P$ bytes in float32"),
    experiment="claims_vit_l16",
    sources=MEASURED,
    method="Bytes measured from the tensors over the parameter count P (ViT-L/16, fp32, AdamW).",
    elsewhere="estimate rows carry no parameter count.",
)
def bytes_per_parameter(rows: Rows) -> list[Check]:
    row = rows.one(optimizer="adamw", zero_grad="none", micro_batch=4)
    count = float(row.param_count)
    return [value_check("parameters 4P bytes", row.params_bytes, 4 * count, 0.01, "bytes/param", count, label="parameters",
                        favourable=None),
            value_check("gradients 4P bytes", row.grads_bytes, 4 * count, 0.01, "bytes/param", count, label="gradients",
                        favourable=None),
            value_check("Adam state ~8P bytes", row.optimizer_state_bytes, 8 * count, 0.01, "bytes/param", count,
                        label="AdamW", favourable=None)]


@claims.add(
    id="001-activations-linear",
    summary="activation memory is linear in the batch",
    quote=("If you double the batch size, you double the number of samples in flight, and thus double the total "
        "activation storage."),
    experiment="claims_strategies",
    sources=RATIO,
    method="Activations saved by the first forward, per sample, at every micro-batch of the ResNet-50 grid.",
)
def linear_in_batch(rows: Rows) -> list[Check]:
    frame = rows.all()
    per_sample = {pair(row): saved_activations_bytes(row) / row.micro_batch for _, row in frame.iterrows()}
    mean = float(np.mean(list(per_sample.values())))
    spread = max(abs(v - mean) for v in per_sample.values()) / mean
    shown = ", ".join(f"{pair}: {value / MB:.2f} MB" for pair, value in per_sample.items())
    return [Check("activations per sample the same at every micro-batch (within 10 %)", shown, spread <= 0.10)]


@claims.add(
    id="001-static-constant-in-k",
    summary="parameters, optimizer state and gradients do not depend on K",
    quote="Parameters, optimizer states, and gradient buffers remain constant regardless of $K$.",
    experiment="claims_strategies",
    sources=ANY,
    method="Parameter, optimizer-state and gradient bytes of every split of the effective batch.",
)
def constant_in_k(rows: Rows) -> list[Check]:
    frame = rows.all()
    checks = []
    for column, name in (("params_bytes", "parameters"), ("optimizer_state_bytes", "optimizer state"),
                         ("grads_bytes", "gradients")):
        values = sorted(set(frame[column].astype(int)))
        checks.append(Check(f"{name} the same at every K", f"{name} " + ", ".join(f"{v / MB:.1f} MB" for v in values),
                            len(values) == 1))
    return checks


@claims.add(
    id="001-fp16-copy",
    summary="mixed precision adds a float16 copy of the weights: 2P bytes",
    quote="In mixed precision training, a float16 copy costs $2P$ bytes.",
    experiment="claims_precision",
    sources=AT_GPU_SIZE,
    method=("Activations saved by the first forward against the micro-batch, fp16 autocast and fp32 (ViT-L/16, "
        "every micro-batch of the grid): the fit's intercept is what the forward keeps whatever the batch. "
        "autocast's fp16 copies of the weights of every matmul are kept for backward, so the fp16 intercept "
        "minus the fp32 one is that copy, against 2P bytes (P: parameters). " + ESTIMATED),
    elsewhere="CPU rows have one micro-batch: no intercept.",
)
def fp16_copy(rows: Rows) -> list[Check]:
    intercepts = {}
    for precision in ("fp16", "fp32"):
        frame = rows.all(precision=precision)
        if frame.micro_batch.nunique() < 2:
            raise Missing(f"needs two micro-batches of {precision} in {rows.folder}")
        saved = [saved_activations_bytes(row) for _, row in frame.iterrows()]
        intercepts[precision] = float(np.polyfit(frame.micro_batch.astype(float), saved, 1)[1])
    copy = intercepts["fp16"] - intercepts["fp32"]
    params = float(rows.all(precision="fp32").iloc[0].params_bytes)  # fp32: 4 bytes per parameter
    return [value_check("a float16 copy of the weights costs 2P bytes", copy, params / 2, 0.15, "GB", GB,
                        label=f"fp16 copy (2P = {params / 2 / GB:.2f} GB):", favourable=None)]
