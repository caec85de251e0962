"""How long `bench` takes to answer: cold (an empty cache folder) and warm (the same folder again), each command
timed as a user runs it (a fresh process, wall time), cold and warm alternating round by round in one run,
with the machine's load before and after each round. `make bench-latency` runs it.

Targets (a quiet 2-core machine): every --help, --version and bad-input error under 1 s; `bench list` and
`bench catalog` under 2 s; probe ResNet-50 <= 8 s cold and <= 1 s warm; plan ViT-L/16 <= 15 s cold and
<= 2 s warm; estimate of the 90-cell ResNet-50 grid <= 60 s cold.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Command:
    name: str
    args: list[str]
    cold_target_s: float
    warm_target_s: float | None = None
    """None: timed cold only (a command with nothing to reuse, or too long to repeat)."""
    rounds: int = 3
    cold_s: list[float] = field(default_factory=list)
    warm_s: list[float] = field(default_factory=list)


def commands(results: Path) -> list[Command]:
    return [
        Command("bench --help", ["--help"], 1.0, rounds=5),
        Command("bench --version", ["--version"], 1.0, rounds=5),
        Command("bad input (plan --effective-batch -3)", ["plan", "resnet50", "--effective-batch", "-3"], 1.0, rounds=5),
        Command("bench list (resnet50 grid, cuda profile)", ["list", "experiments/resnet50.toml", "--profile", "cuda"],
                2.0, 2.0, rounds=3),
        Command("bench catalog --gpus", ["catalog", "--gpus"], 2.0, rounds=3),
        Command("probe resnet50 --gpu A100-40GB", ["probe", "resnet50", "--gpu", "A100-40GB"], 8.0, 1.0, rounds=3),
        Command("plan vit_large_patch16_224 E=4096", ["plan", "vit_large_patch16_224", "--effective-batch", "4096",
                                                      "--image-size", "224"], 15.0, 2.0, rounds=2),
        Command("estimate experiments/resnet50.toml (90 cells)", ["estimate", "experiments/resnet50.toml",
                                                                  "--results", str(results)], 60.0, None, rounds=1),
    ]


def timed(args: list[str], cache: Path) -> float:
    env = {**os.environ, "BENCH_CACHE_DIR": str(cache)}
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "bench", *args], cwd=REPO, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - began
    if done.returncode not in (0, 2):  # 2: the bad-input case answers with exit 2 by design
        sys.exit(f"bench {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="time only the commands whose name contains this text")
    args = parser.parse_args()
    loads: list[float] = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="bench-latency-") as scratch:
        todo = [c for c in commands(Path(scratch) / "results") if not args.only or args.only in c.name]
        for round_index in range(max(c.rounds for c in todo)):
            for command in todo:
                if round_index >= command.rounds:
                    continue
                cache = Path(scratch) / f"cache-{todo.index(command)}-{round_index}"
                command.cold_s.append(timed(command.args, cache))
                if command.warm_target_s is not None:
                    command.warm_s.append(timed(command.args, cache))
                loads.append(os.getloadavg()[0])
                print(f"  round {round_index + 1}: {command.name}: cold {command.cold_s[-1]:.2f} s"
                      + (f", warm {command.warm_s[-1]:.2f} s" if command.warm_s else "")
                      + f" (load {loads[-1]:.1f})", file=sys.stderr, flush=True)
    print(f"bench latency: wall time of `python -m bench ...` in a fresh process, median of the rounds, on "
          f"{os.cpu_count()} cores; 1-minute load average {min(loads):.1f} to {max(loads):.1f} during the run")
    print(f"{'command':<48} {'cold s':>7} {'target':>7} {'warm s':>7} {'target':>7}  rounds  met")
    failed = 0
    for c in todo:
        cold = statistics.median(c.cold_s)
        warm = statistics.median(c.warm_s) if c.warm_s else None
        met = cold <= c.cold_target_s and (warm is None or warm <= c.warm_target_s)
        failed += not met
        print(f"{c.name:<48} {cold:>7.2f} {c.cold_target_s:>7.1f} "
              f"{'' if warm is None else f'{warm:.2f}':>7} {'' if warm is None else f'{c.warm_target_s:.1f}':>7}"
              f"  {len(c.cold_s):>6}  {'yes' if met else 'NO'}")
    if failed:
        print(f"{failed} target(s) missed; a load above {os.cpu_count()} slows every figure (measure alone)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
