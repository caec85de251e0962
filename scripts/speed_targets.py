"""`make bench-speed`: the throughput model's targets table (issue #36 item 6), printed and written to
docs/speed/targets.md, from the committed held-out predictions (docs/speed/validation.csv, written by `bench predict
--validate`). No fit and no timing: seconds."""

from __future__ import annotations

import csv
from pathlib import Path

from bench.speed.validate import targets_table

SOURCE, OUT = Path("docs/speed/validation.csv"), Path("docs/speed/targets.md")


def main() -> None:
    with SOURCE.open(newline="") as handle:
        table = targets_table(list(csv.DictReader(handle)))
    lines = ["# Throughput model: targets", "",
             f"Written by `make bench-speed` (`scripts/speed_targets.py`) from `{SOURCE}`: training rows only, "
             "|predicted / measured - 1| of predictions from fits without the row's GPU (leave-one-GPU-out) and "
             "without its source (leave-one-source-out); coverage = share of both predictions inside an 80 % band "
             "set by the other GPUs' held-out residuals. Targets: median <= 10 %, p90 <= 25 %, coverage 75-85 %. "
             "The training rows are the RTX 3090 (timm), A100-40/80GB and V100-16/32GB (DLE): no Hopper or "
             "Blackwell row (`docs/speed/sources.md`).", "",
             "| slice | value | rows | LOGO median % | LOGO p90 % | LOSO median % | LOSO p90 % | coverage % | met |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        met = all(r[f"{s}_median_pct"] <= 10 and r[f"{s}_p90_pct"] <= 25 for s in ("logo", "loso")) \
            and 75 <= r["coverage_pct"] <= 85
        lines.append(f"| {r['slice']} | {r['value']} | {r['rows']} | {r['logo_median_pct']} | {r['logo_p90_pct']} | "
                     f"{r['loso_median_pct']} | {r['loso_p90_pct']} | {r['coverage_pct']} | {'yes' if met else 'no'} |")
    text = "\n".join(lines) + "\n"
    OUT.write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
