"""One module per group of `bench` subcommands; each exposes `register(subcommands)`."""

from bench.commands import (
    catalog,
    claims,
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

GROUPS = (grids, measure, data, report, cost, catalog, memory, speed, equivalence, claims, peak)
