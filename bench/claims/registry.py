"""Every claim of the seed articles the harness checks, in the order the table lists them.

The claims themselves live beside their checks, one module per article (`article_002` ...).
"""

from __future__ import annotations

from bench.claims import article_000, article_001, article_002, article_004
from bench.claims.claim import GB, MB, MIB, Claim

ARTICLES = {
    "000": "000_dc122f77705c9807.txt — Gradient Accumulation OOM: Hidden Memory Spike Explained",
    "001": "001_0d10a030942bbeb2.txt — Gradient Accumulation for Memory",
    "002": "002_3a55cb8a916d818f.txt — Gradient Accumulation vs Large Batch: Memory & Cost Test",
    "004": "004_61303b8cd52fbf66.txt — CUDA out of memory: three fixes and the silent leak",
}

CLAIMS: tuple[Claim, ...] = tuple(
    claim for module in (article_002, article_000, article_004, article_001) for claim in module.claims.claims)

__all__ = ["ARTICLES", "CLAIMS", "GB", "MB", "MIB", "Claim"]
