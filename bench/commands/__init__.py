"""One module per group of `bench` subcommands; each exposes `register(subcommands)`."""

from bench.commands import claims, data, equivalence, grids, memory, money, peak, report

GROUPS = (grids, data, report, money, memory, equivalence, claims, peak)
