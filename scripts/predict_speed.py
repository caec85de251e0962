"""How long a speed prediction takes: one ViT-L/16 cell on every catalog GPU (target <= 10 s on 2 cores).

The trace (memory estimate and ops, one fake step) is shared by every GPU; each GPU's prediction
is then arithmetic over the op table. Prints the time of each part and the predictions.

    python scripts/predict_speed.py [--model vit_large_patch16_224] [--micro-batch 32] [--precision bf16]
"""

from __future__ import annotations

import argparse
import time

import torch

from bench.grid.cell import Cell
from bench.measure.hardware import gpu_keys, gpu_spec
from bench.memory.traces import traced
from bench.speed.model import NoDatasheetPeak
from bench.speed.params import load_model_file
from bench.speed.predict import predict_on


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_large_patch16_224")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--micro-batch", type=int, default=32)
    parser.add_argument("--accum-steps", type=int, default=1)
    parser.add_argument("--precision", default="bf16")
    args = parser.parse_args()
    model = load_model_file()
    cell = Cell(experiment="speed", profile="cuda", model=args.model, image_size=args.image_size,
                micro_batch=args.micro_batch, accum_steps=args.accum_steps, precision=args.precision,
                checkpointing="off", optimizer="adamw", channels_last=False, warmup_steps=1, measured_steps=1)
    print(f"{cell.cell_id} on {len(gpu_keys())} catalog GPUs, {torch.get_num_threads()} torch threads, "
          f"{model.basis()}")
    began = time.perf_counter()
    trace, fresh = traced(cell)
    estimate, ops = trace.estimate, trace.ops
    traced_s = time.perf_counter() - began
    lines = []
    for gpu in gpu_keys():
        try:
            p = predict_on(cell, ops, gpu_spec(gpu), model)
            lines.append(f"  {gpu:<15} {p.samples_per_s:9.1f} samples/s  step {p.step.step_time_s * 1e3:8.1f} ms  "
                         f"MFU {p.mfu_pct:5.1f} %  {p.step.bound}-bound")
        except NoDatasheetPeak as exc:
            lines.append(f"  {gpu:<15} refused: {exc}")
    total_s = time.perf_counter() - began
    print("\n".join(lines))
    print(f"trace (memory + ops, one fake step{'' if fresh else ', read from the cache'}): {traced_s:.2f} s; {len(gpu_keys())} GPU predictions: "
          f"{total_s - traced_s:.2f} s; total {total_s:.2f} s (target <= 10 s on 2 cores); predicted allocated "
          f"{estimate.peak_allocated_bytes / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
