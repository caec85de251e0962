"""One module per group of `bench` subcommands; each exposes `register(subcommands)`."""

from bench.commands import claims, equivalence, grids, memory, money, peak, report

GROUPS = (grids, report, money, memory, equivalence, claims, peak)
