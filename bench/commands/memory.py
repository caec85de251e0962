"""`bench estimate` and `bench probe`: peak memory predicted without a device, and the largest micro-batch."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import get_args

from bench.cell import Checkpointing, OptimizerName, Precision
from bench.commands.common import add_device_option, positive, positive_int
from bench.spec import SpecError, load_grid, timm_model_problem


def register(commands: argparse._SubParsersAction) -> None:
    estimate = commands.add_parser("estimate", help="predicted peak memory of every cell, without running it")
    estimate.set_defaults(handler=estimate_grids)
    estimate.add_argument("files", nargs="+", type=Path, metavar="FILE", help="grid file (TOML)")
    estimate.add_argument("--profile", choices=("cuda", "cpu"), default="cuda",
                          help="cuda: the grid as written, predicted for a GPU (default); cpu: its CPU profile")
    estimate.add_argument("--results", type=Path, default=Path("results"),
                          help="results root; rows go to <root>/<experiment>/estimate/ (default: results)")

    probe = commands.add_parser("probe", help="the largest micro-batch that fits: estimated, then found by real runs")
    probe.set_defaults(handler=probe_model)
    probe.add_argument("model", metavar="MODEL", help="timm model name, random init")
    probe.add_argument("--image-size", type=positive_int, default=224, help="square image side in pixels (default 224)")
    probe.add_argument("--precision", choices=get_args(Precision), default="fp32", help="(default fp32)")
    probe.add_argument("--checkpointing", choices=get_args(Checkpointing), default="off", help="(default off)")
    probe.add_argument("--optimizer", choices=get_args(OptimizerName), default="adamw", help="(default adamw)")
    probe.add_argument("--channels-last", action="store_true", help="model and inputs in channels-last format")
    probe.add_argument("--accum-steps", type=positive_int, default=1, help="micro-batches per optimizer step (default 1)")
    answer = probe.add_mutually_exclusive_group()
    answer.add_argument("--memory-gib", type=positive, help="answer from the estimator alone for a GPU with this much memory")
    answer.add_argument("--gpu", help="answer from the estimator alone for this catalog GPU (e.g. A100-40GB)")
    answer.add_argument("--memory-limit-gib", type=positive,
                        help="cap each trial's memory (GPU memory on CUDA; address-space growth on CPU, required there)")
    add_device_option(probe, help="device for real trials")
    probe.add_argument("--timeout-s", type=positive, default=600.0, help="per-trial time limit (default 600)")


def estimate_grids(args: argparse.Namespace) -> int:
    from bench.estimate_grid import describe_estimate, estimate_grid  # late: fake tensors only here
    from bench.report.estimate_chart import write_estimate_chart

    grids = [load_grid(path, args.profile) for path in args.files]  # every file validated first
    for grid in grids:
        print(f"{grid.name}: {len(grid.cells)} cells, profile {grid.profile}, estimated without a device")
        path = estimate_grid(grid, args.results,
                             on_row=lambda row, index, total: print(f"  [{index + 1}/{total}] {describe_estimate(row)}"))
        print(f"  wrote {path} and {write_estimate_chart(path.parent)}")
    return 0


def probe_model(args: argparse.Namespace) -> int:
    from bench.probe import (
        ProbeConfig, ProbeError, describe_probe, probe_budget, probe_from_estimate, probe_on_device,
    )

    problem = timm_model_problem(args.model)
    if problem:
        raise SpecError(f"MODEL: {problem}")
    config = ProbeConfig(model=args.model, image_size=args.image_size, precision=args.precision,
                         checkpointing=args.checkpointing, optimizer=args.optimizer,
                         channels_last=args.channels_last, accum_steps=args.accum_steps)
    budget = probe_budget(gpu=args.gpu, memory_gib=args.memory_gib, memory_limit_gib=args.memory_limit_gib,
                          device=args.device)
    try:
        result = (probe_from_estimate(config, budget) if budget.device is None
                  else probe_on_device(config, budget, args.memory_limit_gib, args.timeout_s))
    except ProbeError as exc:
        print(f"bench probe: {exc}", file=sys.stderr)
        return 1
    print(describe_probe(config, budget, result))
    return 0 if (result.found or result.predicted).largest > 0 else 1
