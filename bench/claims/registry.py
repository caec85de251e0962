"""Every claim of the seed articles the harness checks, in the order the table lists them.

The claims themselves live beside their checks, one module per article, named by its topic
(`accumulation_vs_large_batch` holds article 002's ...).
"""

from __future__ import annotations

from bench.claims import accumulation_for_memory, accumulation_vs_large_batch, hidden_memory_spike, oom_fixes_and_leak
from bench.claims.claim import Claim

ARTICLES = {
    "000": "“Gradient Accumulation OOM: Hidden Memory Spike Explained”",
    "001": "“Gradient Accumulation for Memory” (a chapter section: Gradient Accumulation › Gradient Accumulation "
           "for Memory)",
    "002": "“Gradient Accumulation vs Large Batch: Memory & Cost Test”",
    "004": "“CUDA out of memory: three fixes and the silent leak” (companion to a @teqnersinsights reel)",
}
"""The seed articles, cited by title; every claim quotes its article verbatim."""

ARTICLE_GPUS = {"000": "RTX-3090", "002": accumulation_vs_large_batch.ARTICLE_GPU}
"""The catalog GPU each article measured on (its words: "a single RTX 3090", "A100"): a claim about GPU speed that no
GPU row answers is predicted for it."""

CLAIMS: tuple[Claim, ...] = tuple(
    claim for module in (accumulation_vs_large_batch, hidden_memory_spike, oom_fixes_and_leak, accumulation_for_memory)
    for claim in module.claims.claims)

__all__ = ["ARTICLES", "ARTICLE_GPUS", "CLAIMS", "Claim"]
