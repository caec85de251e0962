"""One module per group of `bench` subcommands; each exposes `register(subcommands)`."""

from bench.commands import (
    catalog,
    claims,
    data,
    equivalence,
    grids,
    memory,
    money,
    peak,
    report,
    speed,
)

GROUPS = (grids, data, report, money, catalog, memory, speed, equivalence, claims, peak)
