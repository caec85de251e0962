"""Measurement: pure calculators (numbers in, numbers out) and thin collectors (clocks, allocators)."""
