"""Cost outputs next to the results: `<results folder>/cost/` gets cost.csv, cost.md and
usd_per_run.png; the console gets a short summary. Reads runs files and writes these
files only; every number comes from `bench.cost.price`, and the cores needed to feed the GPUs
from `bench.cost.feeding` (when loader rows give the CPU cost per sample).
"""

from __future__ import annotations

import csv
from datetime import date
from pathlib import Path

import pandas as pd

from bench.cost.catalog import Instance, stale_note
from bench.cost.feeding import (
    FORMULA,
    LoaderCost,
    loader_cost_for,
    no_loader_rows,
)
from bench.cost.price import COLUMNS, Assumptions, CostLine, CostTable, MeasuredRow, Workload, line_feeding, record
from bench.errors import ResultsFileError
from bench.results.markdown import markdown_table
from bench.results.read import file_schema, read_runs, records
from bench.units import gib, percent



def load_ok_rows(folder: Path) -> list[MeasuredRow]:
    """The status-ok rows of `folder/runs.csv`, and the predicted rows of a `bench predict` folder, as read: the
    model's speeds that carry a GPU row to other GPUs are the planner's look-up (`bench.planner.rows`), not this.

    Raises ResultsFileError when the folder has no runs file.
    """
    runs = Path(folder) / "runs.csv"
    if not runs.is_file():
        raise ResultsFileError(f"{folder}: no runs.csv here; pass a results folder such as "
                               f"results/<experiment>/<device-tag>")
    rows = read_runs(runs, file_schema(runs).columns)  # the runner's, or a prediction's (`bench predict`)
    return [MeasuredRow(row) for row in records(rows[rows.status.isin(("ok", "predicted"))])]


def write_outputs(table: CostTable, folder: Path, title: str, catalog_name: str,
                  loader_costs: list[LoaderCost] | None = None, loader_source: str = "these rows") -> list[Path]:
    """cost.csv, cost.md and (when anything is priced) usd_per_run.png in `folder`; returns their paths.
    `loader_costs`: the loader's CPU cost per sample (`bench.cost.feeding`), found in `loader_source`."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / "cost.csv", folder / "cost.md"] + ([folder / "usd_per_run.png"] if table.priced else [])
    with paths[0].open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(COLUMNS), lineterminator="\n")
        writer.writeheader()
        for line in table.lines:
            values = record(line, table.workload.samples_per_run, loader_costs, strategy=table.strategy(line.row))
            writer.writerow({k: "" if v is None else _csv(v) for k, v in values.items()})
    paths[1].write_text(markdown(table, title, catalog_name, loader_costs, loader_source))
    if table.priced:
        chart(table, paths[2], title)
    return paths


def header_lines(table: CostTable, catalog_name: str, loader_costs: list[LoaderCost] | None = None,
                 loader_source: str = "these rows") -> list[str]:
    """What every number below assumes, and how old the prices are."""
    sizes = sorted({line.row.image_size for line in table.lines} | {r.row.image_size for r in table.refused})
    cpu_projected = any(line.basis == "projected_from_cpu_profile" for line in table.priced)
    used = [line.instance for line in table.priced]
    return context_lines(table.workload, table.assumptions, sizes, catalog_name, table.oldest_price_observed,
                    cpu_projected, used) + feeding_lines(sorted({line.row.image_size for line in table.priced}),
                                                         loader_costs or [], loader_source)


def feeding_lines(sizes: list[int], costs: list[LoaderCost], where: str) -> list[str]:
    """How the cores to feed a GPU are computed, and from which loader measurement, per image size."""
    if not costs:
        return [no_loader_rows(where)]
    lines = [f"feeding: {FORMULA}"]
    for size in sizes:
        cost, note = loader_cost_for(costs, size)
        lines.append(f"feeding at {size} px: {cost.describe()}{note}" + (f"; from {where}" if where else ""))
    return lines


def context_lines(workload: Workload, assumptions: Assumptions, sizes: list[int], catalog_name: str,
             oldest_price: str | None, cpu_projected: bool, used: list[Instance] | tuple = (),
             size_source: str = "the measured image size") -> list[str]:
    """What every figure assumes; `size_source` says where the image size comes from."""
    lines = [
        f"workload: {workload.describe()} = {workload.samples_per_run:,.0f} samples per run, "
        f"at {size_source} ({', '.join(f'{s} px' for s in sizes) or 'no rows'})",
        f"assumptions: multi-GPU instances run data parallel at the scaling efficiency measured for the "
        f"configuration (a DDP row, world_size > 1) where there is one, else as predicted from the instance's "
        f"interconnect where the row has its gradient bytes, else {assumptions.scaling_efficiency:g}; "
        f"memory fit = peak + {percent(assumptions.headroom)} headroom against the GPU's nominal memory "
        f"(GiB = 2**30 bytes)",
        f"prices: {catalog_name}; oldest price used: {oldest_price or 'none (nothing priced)'}",
        *filter(None, [stale_note(used, date.today())]),
    ]
    if cpu_projected:
        lines.append("WARNING: rows measured on a CPU at the CPU profile's reduced size are projected to GPUs "
                     "(basis projected_from_cpu_profile): these are NOT GPU measurements")
    return lines


def cheapest_per_strategy(table: CostTable) -> list[CostLine]:
    """The cheapest priced (on-demand) line of each measured row, cheapest first."""
    best: dict[str, CostLine] = {}
    for line in table.priced:
        known = best.get(line.row.cell_id)
        if known is None or line.cost.usd_per_run < known.cost.usd_per_run:
            best[line.row.cell_id] = line
    return sorted(best.values(), key=lambda line: line.cost.usd_per_run)


def markdown(table: CostTable, title: str, catalog_name: str, loader_costs: list[LoaderCost] | None = None,
             loader_source: str = "these rows") -> str:
    out = [f"# Dollars per run: {title}", ""] + [f"- {text}" for text in header_lines(table, catalog_name,
                                                                                        loader_costs, loader_source)]
    cheapest = [{"strategy": table.strategy(ln.row), "instance": ln.instance.label, "basis": ln.basis,
                 "hours_per_run": f"{ln.cost.hours_per_run:,.2f}", "usd_per_run": f"{ln.cost.usd_per_run:,.2f}",
                 "spot_usd_per_run": _money(ln.cost.spot_usd_per_run)} for ln in cheapest_per_strategy(table)]
    out += ["", "## Cheapest instance per strategy (on-demand)", "", _table(cheapest, _CHEAPEST_COLUMNS)]
    priced = [{"strategy": table.strategy(ln.row), "instance": ln.instance.label, "basis": ln.basis,
               "samples_per_s_per_gpu": f"{ln.samples_per_s_per_gpu:,.1f}",
               "hours_per_run": f"{ln.cost.hours_per_run:,.2f}", "usd_per_hour": f"{ln.instance.usd_per_hour:g}",
               "usd_per_run": f"{ln.cost.usd_per_run:,.2f}", "spot_usd_per_run": _money(ln.cost.spot_usd_per_run),
               "required/gpu memory GiB": f"{gib(ln.memory.required_bytes, 2, unit=False)} / "
                                          f"{gib(ln.memory.capacity_bytes, None, unit=False)}",
               "price observed": ln.instance.observed, "feeding": _feeding_text(ln, loader_costs), "how": ln.note}
              for ln in sorted(table.priced, key=lambda ln: (table.strategy(ln.row), ln.cost.usd_per_run))]
    out += ["", "## Every priced line", "", _table(priced, _PRICED_COLUMNS)]
    unpriced = [{"strategy": table.strategy(ln.row), "instance": ln.instance.label, "status": ln.status, "why": ln.note}
                for ln in table.lines if ln.status != "priced"]
    if unpriced:
        out += ["", "## Not priced", "", _table(unpriced, ("strategy", "instance", "status", "why"))]
    if table.refused:
        out += ["", "## Rows not priced at all", ""] + [f"- {refusal.row.cell_id}: {refusal.reason}" for refusal in table.refused]
    return "\n".join(out) + "\n"


_CHEAPEST_COLUMNS = ("strategy", "instance", "basis", "hours_per_run", "usd_per_run", "spot_usd_per_run")
_PRICED_COLUMNS = ("strategy", "instance", "basis", "samples_per_s_per_gpu", "hours_per_run", "usd_per_hour",
                   "usd_per_run", "spot_usd_per_run", "required/gpu memory GiB", "price observed", "feeding", "how")


def _feeding_text(line: CostLine, costs: list[LoaderCost] | None) -> str:
    fed = line_feeding(line, costs or [])
    return fed[0].describe() if fed else "no loader rows"


def _csv(value: object) -> object:
    return ("true" if value else "false") if isinstance(value, bool) else value


def _table(lines: list[dict], columns: tuple[str, ...]) -> str:
    return markdown_table(pd.DataFrame(lines, columns=list(columns)))


def summary(table: CostTable, catalog_name: str, loader_costs: list[LoaderCost] | None = None,
            loader_source: str = "these rows") -> str:
    """Console text: the header lines and the cheapest instance per strategy."""
    out = [f"  {text}" for text in header_lines(table, catalog_name, loader_costs, loader_source)]
    if table.priced:
        out.append("  cheapest per strategy (on-demand; every line in cost.csv):")
    for ln in cheapest_per_strategy(table):
        cost = ln.cost
        fed = line_feeding(ln, loader_costs or [])
        out.append(f"    {table.strategy(ln.row):<32} {ln.instance.label:<44} {cost.hours_per_run:>9,.2f} h  "
                   f"${cost.usd_per_run:>10,.2f}  [{ln.basis}] {ln.note}"
                   + (f"; feeding: {fed[0].describe()}" if fed else ""))
    statuses = [ln.status for ln in table.lines if ln.status != "priced"]
    if statuses:
        counts = ", ".join(f"{statuses.count(s)} {s}" for s in dict.fromkeys(statuses))
        out.append(f"  not priced: {counts} (reasons in cost.md)")
    reasons = [refusal.reason for refusal in table.refused]
    out += [f"  not priced at all: {reasons.count(reason)} row(s): {reason}" for reason in dict.fromkeys(reasons)]
    return "\n".join(out)


def chart(table: CostTable, path: Path, title: str, max_strategies: int = 6) -> None:
    """Dollars per run (on-demand, log scale) by instance, one bar group per strategy; projections hatched."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    cheapest = [ln.row for ln in cheapest_per_strategy(table)]
    strategies = cheapest[:max_strategies]
    instances = list(dict.fromkeys(ln.instance for ln in sorted(table.priced, key=lambda ln: ln.instance.usd_per_hour)))
    by_key = {(ln.row.cell_id, ln.instance): ln for ln in table.priced}
    colours = [plt.get_cmap("tab20" if i < 20 else "tab20b")(i % 20) for i in range(len(instances))]
    width = 0.85 / max(len(instances), 1)
    figure, axes = plt.subplots(figsize=(max(10.0, 2.2 * len(strategies) + 5), 6.0))
    for i, instance in enumerate(instances):
        for g, row in enumerate(strategies):
            line = by_key.get((row.cell_id, instance))
            if line is not None:
                axes.bar(g + (i - len(instances) / 2 + 0.5) * width, line.cost.usd_per_run, width,
                         color=colours[i], hatch=None if line.basis == "measured" else "//",
                         edgecolor="black", linewidth=0.3)
    # Legend patches carry the colour only: hatching marks the basis, bar by bar.
    axes.legend(handles=[Patch(facecolor=colours[i], edgecolor="black", linewidth=0.3, label=instance.label)
                         for i, instance in enumerate(instances)],
                fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes.set_xticks(range(len(strategies)), [table.strategy(row) for row in strategies], rotation=20, ha="right", fontsize=8)
    axes.set_yscale("log")
    axes.set_ylabel("USD per run, on-demand (log scale)")
    note = f"{table.workload.describe()}; hatched bars are projections, solid are measured on that GPU"
    if any(ln.basis == "projected_from_cpu_profile" for ln in table.priced):
        note += "\nprojected from CPU-profile rows (reduced size, measured on a CPU): NOT GPU measurements"
    shown = f" ({len(strategies)} cheapest of {len(cheapest)} strategies)" if len(strategies) < len(cheapest) else ""
    axes.set_title(f"Dollars per run: {title}{shown}\n{note}", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _money(value: float | None) -> str:
    return "" if value is None else f"{value:,.2f}"
