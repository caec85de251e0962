"""One module per group of `bench` subcommands; each exposes `register(subcommands)`."""

from bench.commands import (
    catalog,
    claims,
    compare,
    cost,
    data,
    equivalence,
    grids,
    measure,
    memory,
    peak,
    report,
    speed,
)

GROUPS = (grids, measure, data, report, compare, cost, catalog, memory, speed, equivalence, claims, peak)
