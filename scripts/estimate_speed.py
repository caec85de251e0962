"""How long an estimate takes: one ViT-L/16 cell at micro-batch 32 (target <= 10 s on 2 cores).

Prints the first cell (which builds the fake model) and the next ones (which reuse it),
for a few precision / checkpointing / optimizer combinations.

    python scripts/estimate_speed.py [--model vit_large_patch16_224] [--micro-batch 32] [--accum-steps 1]
"""

from __future__ import annotations

import argparse
import time

import torch

from bench.grid.cell import Cell
from bench.memory.estimate import estimate_cell
from bench.memory.fake_models import FakeModels
from bench.units import GIB

COMBINATIONS = (("bf16", "off", "adamw"), ("fp32", "off", "sgd"), ("bf16", "full", "adamw"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_large_patch16_224")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--micro-batch", type=int, default=32)
    parser.add_argument("--accum-steps", type=int, default=1)
    args = parser.parse_args()
    print(f"{args.model} {args.image_size}px, micro-batch {args.micro_batch} x {args.accum_steps}, "
          f"{torch.get_num_threads()} torch threads")
    models = FakeModels()
    for precision, checkpointing, optimizer in COMBINATIONS:
        cell = Cell(experiment="speed", profile="cuda", model=args.model, image_size=args.image_size,
                    micro_batch=args.micro_batch, accum_steps=args.accum_steps, precision=precision,
                    checkpointing=checkpointing, optimizer=optimizer, channels_last=False,
                    warmup_steps=1, measured_steps=1)
        began = time.perf_counter()
        models.get(cell)  # built on the first use of its (model, size, checkpointing), then reused
        build_s = time.perf_counter() - began
        estimate = estimate_cell(cell, "cuda", models)
        total_s = time.perf_counter() - began
        print(f"  {precision} ckpt {checkpointing:<4} {optimizer:<6} {total_s:6.2f} s per cell "
              f"(model {build_s:5.2f} s, steps {total_s - build_s:5.2f} s)  "
              f"predicted allocated {estimate.peak_allocated_bytes / GIB:.2f} GiB")


if __name__ == "__main__":
    main()
