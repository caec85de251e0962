"""One module per group of `bench` subcommands; each exposes `register(subcommands)`."""

from bench.commands import (
    catalog,
    claims,
    data,
    equivalence,
    grids,
    measure,
    memory,
    money,
    peak,
    report,
    speed,
)

GROUPS = (grids, measure, data, report, money, catalog, memory, speed, equivalence, claims, peak)
