"""Accumulation against one large batch: the comparison, the study over variants and K, its tables."""
