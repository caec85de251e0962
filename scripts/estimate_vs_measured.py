"""The estimator's prediction beside the measurement, cell by cell.

Joins a measured folder's runs.csv with the estimate folder's rows on cell_id (same grid,
same profile, so the same ids) and writes the ratio of predicted to measured peak memory
(target for CUDA: within 10 % of max_memory_allocated).

    python scripts/estimate_vs_measured.py results/gpu_check_resnet50/nvidia-h200 \\
        results/gpu_check_resnet50/estimate --out results/gpu_check/nvidia-h200/estimate_vs_measured.csv
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

KEEP = ["cell_id", "peak_memory_bytes", "peak_reserved_bytes", "memory_source"]


def compare(measured: pd.DataFrame, estimated: pd.DataFrame) -> pd.DataFrame:
    """One line per cell measured `ok` and `estimated`, with predicted / measured ratios.

    >>> m = pd.DataFrame({"cell_id": ["a"], "status": ["ok"], "peak_memory_bytes": [100],
    ...                   "peak_reserved_bytes": [120], "memory_source": ["cuda_allocator"]})
    >>> e = m.assign(status="estimated", peak_memory_bytes=105, peak_reserved_bytes=110)
    >>> compare(m, e).peak_ratio.tolist()
    [1.05]
    """
    joined = measured[measured.status == "ok"][KEEP].merge(
        estimated[estimated.status == "estimated"][KEEP], on="cell_id", suffixes=("_measured", "_estimated"))
    joined["peak_ratio"] = joined.peak_memory_bytes_estimated / joined.peak_memory_bytes_measured
    joined["reserved_ratio"] = joined.peak_reserved_bytes_estimated / joined.peak_reserved_bytes_measured
    joined["within_10pct"] = (joined.peak_ratio - 1).abs() <= 0.10
    return joined


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("measured", type=Path, help="results/<experiment>/<device-tag>")
    parser.add_argument("estimate", type=Path, help="results/<experiment>/estimate")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    table = compare(pd.read_csv(args.measured / "runs.csv"), pd.read_csv(args.estimate / "runs.csv"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False)
    shown = table[["cell_id", "peak_ratio", "reserved_ratio", "within_10pct"]].round(3)
    print(f"estimate vs measured ({args.measured}): {int(table.within_10pct.sum())}/{len(table)} within 10 %")
    print(shown.to_string(index=False))


if __name__ == "__main__":
    main()
