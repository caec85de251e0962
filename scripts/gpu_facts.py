"""Facts about the CUDA device that the harness's numbers rest on, one CSV row each.

    python scripts/gpu_facts.py --out results/gpu_check/<device-tag>/gpu_facts.csv

- the cuBLAS workspace torch chose (CUBLAS_WORKSPACE_CONFIG or its default), against the
  estimator's allowance (`bench.memory.estimate.cublas_workspace_bytes`) for this compute capability;
- a large fp32 matmul with TF32 off and on (milliseconds): how much `fp32` cells lose by keeping it off;
- whether expandable segments are in effect when asked for (a fresh child, from the allocator's snapshot);
- what an allocation past a memory cap raises (type and first line), so `bench.measure.failure` can be
  checked against the real message.

Each probe runs in its own fresh process, so one's CUDA state cannot change another's.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pandas as pd

from bench.isolation import call_in_child
from bench.memory.estimate import cublas_workspace_bytes


def _workspace() -> dict:
    import torch

    capability = torch.cuda.get_device_capability(0)
    torch.ones(64, 64, device="cuda") @ torch.ones(64, 64, device="cuda")  # creates the handle and workspace
    chosen = torch._C._cuda_get_cublas_workspace_size() if hasattr(torch._C, "_cuda_get_cublas_workspace_size") else None
    return {"capability": f"{capability[0]}.{capability[1]}", "cublas_workspace_bytes": chosen,
            "estimator_workspace_bytes": cublas_workspace_bytes(capability),
            "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG", "")}


def _tf32_ms() -> dict:
    import torch

    a = torch.randn(8192, 8192, device="cuda")
    timings = {}
    for allowed in (False, True):
        torch.backends.cuda.matmul.allow_tf32 = allowed
        a @ a
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            a @ a
        end.record()
        torch.cuda.synchronize()
        timings[f"matmul_8192_tf32_{'on' if allowed else 'off'}_ms"] = start.elapsed_time(end) / 10
    return timings


def _expandable() -> dict:
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"  # before CUDA starts in this child
    import torch

    from bench.measure.memory import expandable_segments_in_effect

    torch.ones(1, device="cuda")
    return {"expandable_segments_in_effect": expandable_segments_in_effect(torch.device("cuda"))}


def _oom_near_cap() -> dict:
    import torch

    from bench.measure.failure import first_line, is_out_of_memory

    torch.cuda.set_per_process_memory_fraction(0.05)
    total = torch.cuda.get_device_properties(0).total_memory
    try:
        torch.empty(int(total * 0.06), dtype=torch.uint8, device="cuda")
    except Exception as exc:  # noqa: BLE001 - what it raises is the fact
        return {"oom_type": type(exc).__name__, "oom_message": first_line(exc)[:200],
                "oom_classified": is_out_of_memory(exc)}
    return {"oom_type": "", "oom_message": "no error past the cap", "oom_classified": False}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="CSV of the facts")
    args = parser.parse_args()
    facts: dict = {}
    for probe in (_workspace, _tf32_ms, _expandable, _oom_near_cap):
        facts.update(call_in_child(probe))
    rows = [{"fact": name, "value": value} for name, value in facts.items()]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(args.out, index=False)
    for row in rows:
        print(f"{row['fact']}: {row['value']}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
