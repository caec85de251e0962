"""Seed 004's claims ("CUDA out of memory: three fixes and the silent leak"), each beside the check that tests it."""

from __future__ import annotations

import json

import pandas as pd

from bench.claims.claim import MEASURED, RATIO, ClaimList
from bench.claims.evidence import Rows, phases, saved_activations_bytes
from bench.claims.readings import pair
from bench.claims.verdict import Check
from bench.units import MIB, mib

claims = ClaimList(article="004")


def _rss_per_step(row: pd.Series) -> float:
    rss = json.loads(row.host_rss_bytes)
    return (rss[-1] - rss[0]) / max(len(rss) - 1, 1) if rss and rss[0] is not None else float("nan")


@claims.add(
    id="004-live-loss-leak",
    summary="keeping the live loss tensor leaks the graph; memory grows every step",
    quote="running_loss += loss          # ❌ retains the graph for every step — memory grows",
    experiment="claims_leak",
    sources=MEASURED,
    method=("The running loss kept as the live tensor across several traced optimizer steps: autograd nodes "
        "reachable from it, tensor memory after each step, the process's resident memory. backward() frees "
        "the saved tensors of each graph; what stays is the graph's nodes, in host memory."),
    elsewhere="an estimate traces one step.",
)
def leak(rows: Rows) -> list[Check]:
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
                  f"{per_step:.0f} bytes/step of tensors; host RSS {mib(rss_per_step['live_tensor'], 2, signed=True)}/step "
                  f"(detached: {mib(rss_per_step['detached'], 2, signed=True, unit=False)})",
                  per_step > MIB)]


@claims.add(
    id="004-bf16-halves",
    summary="bf16 autocast roughly halves activation memory",
    quote="wrap the forward pass in torch.autocast(\"cuda\", dtype=torch.bfloat16) to roughly halve activation memory.",
    experiment="claims_precision",
    sources=RATIO,
    method=("Activations saved by the first forward, bf16 autocast against fp32, at every micro-batch of the grid. "
        "The activations the claim talks about: autocast's low-precision weight copies (its weight-cast cache, "
        "a fixed 2 bytes per cast weight) are not activations. An estimate traces CUDA's autocast policy and "
        "counts the copies in a category of their own (MemTracker's activations at the end of the first forward); "
        "rows measured on a device count them in (their autocast cannot be told apart), so there the ratio "
        "is an upper bound at small micro-batches."),
)
def bf16_halves(rows: Rows) -> list[Check]:
    checks = []
    saved = _activations_saved if rows.source == "estimate" else saved_activations_bytes
    for _, fp32 in rows.all(precision="fp32").sort_values("micro_batch", ascending=False).iterrows():
        bf16 = rows.one(precision="bf16", micro_batch=int(fp32.micro_batch))
        ratio = saved(bf16) / saved(fp32)
        checks.append(Check("bf16 roughly halves activation memory (ratio 0.4 to 0.6)",
                            f"{pair(fp32)}: bf16/fp32 = {ratio:.2f}", 0.4 <= ratio <= 0.6, at=pair(fp32)))
    return checks


def _activations_saved(row: pd.Series) -> float:
    """The estimator's activation category at the end of the first forward: weight-cast copies not in it."""
    return float(row.activations_saved_bytes)


@claims.add(
    id="004-expandable-segments",
    summary="expandable_segments reduces fragmentation (reserved − allocated)",
    quote=("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True reduces fragmentation, which is exactly the case where "
        "you have enough total free memory but not one contiguous block big enough for the next allocation."),
    experiment="claims_allocator",
    sources=("cuda",),
    method="Peak reserved minus peak allocated over the timed steps, with and without expandable segments.",
    elsewhere="a setting of CUDA's caching allocator: not testable on CPU.",
)
def expandable(rows: Rows) -> list[Check]:
    checks = []
    default = rows.all(allocator="default")
    for _, row in default.iterrows():
        other = rows.one(model=row.model, micro_batch=row.micro_batch, allocator="expandable_segments")
        gaps = [r.peak_reserved_bytes - r.peak_allocated_bytes for r in (row, other)]
        checks.append(Check(f"{row.model} {pair(row)}: less reserved - allocated with expandable segments",
                            f"{mib(gaps[0], unit=False)} -> {mib(gaps[1])}", gaps[1] < gaps[0]))
    return checks
