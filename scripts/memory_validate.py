"""`make bench-memory`: the estimator against timm's RTX 3090 AMP fit/OOM rows (bench.memory.validate).

Resumable: rows already in the output are kept, the rest estimated and appended; `--limit-s` bounds
one sitting. Then each model's parameter count is taken as today's timm builds it (a deprecated name that now
builds another model is not judged), and the agreement summary is written next to the rows.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from bench.memory.validate import (
    PARAM_COUNTS,
    SUMMARY_FILE,
    VALIDATION_ROWS,
    count_parameters,
    summary_markdown,
    validate,
)

OUT = VALIDATION_ROWS.relative_to(VALIDATION_ROWS.parents[2])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--limit-s", type=float, default=None, help="stop estimating after this many seconds")
    args = parser.parse_args()
    torch.set_num_threads(1)  # fake tensors compute nothing: one thread leaves the cores to others
    for row in validate(args.out, args.limit_s):
        print(f"{row['status']:<9} {row['model']} {row['memory_format']} {row['side']} b={row['batch_size']} "
              f"{row['estimate_s']} s", flush=True)
    counted = count_parameters(args.out)  # a name today's timm builds as another model is not judged
    print(f"parameters counted for {len(counted)} more models ({args.out.with_name(PARAM_COUNTS)})", flush=True)
    summary = summary_markdown(args.out)
    args.out.with_name(SUMMARY_FILE).write_text(summary)
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
