"""The runner's overhead: one cell through the runner against a minimal hand-written loop.

Both run in fresh processes from the same fork server, alternating, with the same model,
data shape, optimizer and number of steps. Prints samples/s of each and their ratio
(target: the runner within 3% of the hand-written loop).

    python scripts/bench_overhead.py [--rounds 3] [--model resnet50] ...
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import pandas as pd

from bench.grid.cell import Cell
from bench.isolation import call_in_child, fork_server
from bench.measure.device import detect_device
from bench.measure.flops import flops_per_sample
from bench.results.peaks import ensure_peak
from bench.results.provenance import provenance, utc_now
from bench.run.cell_measurement import CellTask
from bench.run.cell_process import run_isolated


def hand_written_loop(model_name, image_size, micro_batch, accum_steps, warmup, steps, device_type) -> float:
    """The plainest correct loop, nothing shared with bench's step, timing or models: its samples/s."""
    import timm
    import torch
    import torch.nn.functional as F

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    device = torch.device(device_type)
    model = timm.create_model(model_name, num_classes=1000).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    images = torch.randn(micro_batch, 3, image_size, image_size, device=device)
    labels = torch.randint(0, 1000, (micro_batch,), device=device)

    def step():
        for _ in range(accum_steps):
            (F.cross_entropy(model(images), labels) / accum_steps).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    # Timed as the runner times (bench.measure.timing.time_steps), so the two differ only in the step:
    # on CUDA events around each step and one sync after the last (no host sync inside the timed
    # steps), on CPU the wall clock around each step.
    if device.type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
        for start, end in events:
            start.record()
            step()
            end.record()
        torch.cuda.synchronize()
        times = [start.elapsed_time(end) / 1e3 for start, end in events]
    else:
        times = []
        for _ in range(steps):
            began = time.perf_counter()
            step()
            times.append(time.perf_counter() - began)
    return micro_batch * accum_steps / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--image-size", type=int, help="default: 224 on CUDA, 32 on CPU")
    parser.add_argument("--micro-batch", type=int, help="default: 64 on CUDA, 16 on CPU")
    parser.add_argument("--accum-steps", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--out", type=Path, help="CSV for the figures (default: results/overhead/<device-tag>/overhead.csv)")
    args = parser.parse_args()

    device = detect_device(args.device)
    gpu = device.type == "cuda"
    cell = Cell(experiment="overhead", profile="cuda" if gpu else "cpu", model=args.model,
                image_size=args.image_size or (224 if gpu else 32),
                micro_batch=args.micro_batch or (64 if gpu else 16), accum_steps=args.accum_steps,
                precision="fp32", checkpointing="off", optimizer="adamw", channels_last=False,
                warmup_steps=2, measured_steps=args.steps)
    task = CellTask(cell, device, ensure_peak(device, "fp32", args.out.parents[2] if args.out else Path("results")),
                    flops_per_sample(cell.model, cell.image_size, "off"))
    context = fork_server()
    stamp = {**provenance(), "started_utc": utc_now()}
    runner_rates, hand_rates = [], []
    for round_index in range(args.rounds):
        row = run_isolated(task, 1800, context)
        if row["status"] != "ok":
            raise SystemExit(f"runner cell failed: {row}")
        runner_rates.append(row["samples_per_s"])
        hand_rates.append(call_in_child(hand_written_loop, cell.model, cell.image_size, cell.micro_batch,
                                        cell.accum_steps, cell.warmup_steps, cell.measured_steps, device.type))
        print(f"round {round_index + 1}: runner {runner_rates[-1]:.2f} samples/s, "
              f"hand-written {hand_rates[-1]:.2f} samples/s")
    runner, hand = statistics.median(runner_rates), statistics.median(hand_rates)
    # Each round's ratio shows the noise floor: on a shared 2-core VM it is several percent.
    ratios = [r / h for r, h in zip(runner_rates, hand_rates)]
    print(f"{cell.cell_id} on {device.name} ({device.type}, fp32, median of {args.rounds} rounds)")
    print(f"runner {runner:.2f} samples/s, hand-written {hand:.2f} samples/s, "
          f"ratio {runner / hand:.4f} (target >= 0.97); per-round ratios {min(ratios):.3f} .. {max(ratios):.3f}")
    out = args.out or Path("results/overhead") / device.tag / "overhead.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([{"cell_id": cell.cell_id, "device_name": device.name, "device_type": device.type,
                   "rounds": args.rounds, "runner_samples_per_s": runner,
                   "hand_written_samples_per_s": hand, "ratio": runner / hand,
                   "round_ratio_min": min(ratios), "round_ratio_max": max(ratios), **stamp}]).to_csv(out, index=False)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
