"""`bench equivalence`: one step as K accumulated micro-batches against one large batch."""

from __future__ import annotations

import argparse
import sys
from typing import get_args

from bench.cell import OptimizerName
from bench.commands.common import EXIT_BAD_INPUT, add_device_option
from bench.device import detect_device
from bench.equivalence import VARIANTS, DType


def register(commands: argparse._SubParsersAction) -> None:
    equivalence = commands.add_parser("equivalence", help="one step: K accumulated micro-batches against one large batch")
    equivalence.set_defaults(handler=compare_step)
    equivalence.add_argument("model", metavar="MODEL", help="timm model name, random init")
    equivalence.add_argument("--effective-batch", type=int, required=True, help="samples in the step (N)")
    equivalence.add_argument("--accum", dest="accum_steps", type=int, required=True,
                             help="micro-batches accumulated (K); must divide N")
    equivalence.add_argument("--variant", choices=tuple(VARIANTS), default="correct",
                             help="; ".join(f"{name}: {setup.summary}" for name, setup in VARIANTS.items()))
    equivalence.add_argument("--image-size", type=int, default=32, help="square image side in pixels (default: 32)")
    equivalence.add_argument("--dtype", choices=get_args(DType), default="fp32", help="weights and inputs (default: fp32)")
    equivalence.add_argument("--optimizer", choices=get_args(OptimizerName), default="sgd",
                             help="the step that turns gradients into weights (default: sgd)")
    equivalence.add_argument("--seed", type=int, default=0, help="seeds the weights and the batch (default: 0)")
    add_device_option(equivalence, default="cpu", help="cpu (default), cuda, or auto: CUDA if present")


def compare_step(args: argparse.Namespace) -> int:
    from bench.display import comparison_table, console
    from bench.equivalence import EquivalenceError, Settings, compare, prepare

    device = detect_device(args.device)
    try:
        settings = Settings(model=args.model, effective_batch=args.effective_batch, image_size=args.image_size,
                            dtype=args.dtype, device=device.type, seed=args.seed, optimizer=args.optimizer)
        comparison = compare(prepare(settings, args.variant), args.accum_steps)
    except EquivalenceError as exc:
        flag = {"model": "MODEL", "accum_steps": "--accum"}.get(exc.setting, "--" + exc.setting.replace("_", "-"))
        print(f"bench equivalence: {flag}: {exc.message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    console.print(comparison_table(comparison))
    verdict = "equivalent" if comparison.equivalent else "NOT equivalent"
    console.print(f"[bold]{verdict}[/] (rule: relative L2 of the gradients and of the BatchNorm statistics "
                  f"<= {comparison.tolerance:g} in {settings.dtype}): {comparison.reason}")
    return 0
