"""A data-parallel cell: launched with torchrun, its ranks' measurements aggregated into one row.

The cell runs as `python -m torch.distributed.run --standalone --nproc-per-node N -m
bench.run.ddp_rank TASK OUT_DIR` in its own process group, under the same time limit as a
single-process cell: on timeout the whole group is killed. A rank that dies makes torchrun
(`--max-restarts 0`) stop the others and exit non-zero; the row is then an error naming the
rank, never a hang. Multi-node runs use torchrun's own rendezvous (see README), not this launcher.
"""

from __future__ import annotations

import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.isolation import safe_child_environment
from bench.measure.cpu import threads_per_rank
from bench.results.rows import ProcessMeasurement, failure, rank_columns
from bench.run.cell_measurement import CellTask

_LOG_TAIL_CHARS = 400


def torchrun_command(world_size: int, task_path: Path, out_dir: Path) -> list[str]:
    """The launch of one cell's ranks on this machine."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}",
            "--max-restarts=0", "-m", "bench.run.ddp_rank", str(task_path), str(out_dir)]


def run_distributed(task: CellTask, timeout_s: float) -> dict:
    """One cell on `task.cell.world_size` processes: its aggregated outcome, or why there is none."""
    world_size = task.cell.world_size
    if task.device.type == "cuda":
        import torch  # late: only this check needs it here (counting devices creates no CUDA context)

        if torch.cuda.device_count() < world_size:
            return failure("skipped", "NotEnoughGpus",
                           f"needs {world_size} GPUs, this machine has {torch.cuda.device_count()}")
    with tempfile.TemporaryDirectory(prefix="bench-ddp-") as folder:
        folder = Path(folder)
        (folder / "task.pkl").write_bytes(pickle.dumps(task))
        log = folder / "torchrun.log"
        returncode = _launch(torchrun_command(world_size, folder / "task.pkl", folder), log, timeout_s,
                             _rank_environment(task))
        if returncode is None:
            return failure("timeout", "Timeout", f"no result within {timeout_s:g} s; every rank was killed")
        outcomes = {int(path.stem.removeprefix("rank")): pickle.loads(path.read_bytes())
                    for path in folder.glob("rank*.pkl")}
        return aggregate(task, outcomes, returncode, log.read_text(errors="replace"))


def _rank_environment(task: CellTask) -> dict[str, str]:
    env = safe_child_environment()  # torchrun and its ranks are `python -m`: no ./torch.py, and the same bench
    if task.device.type == "cpu":
        # torchrun would otherwise set 1 thread per rank (and warn); ranks share the cores.
        env["OMP_NUM_THREADS"] = str(threads_per_rank(task.cell.world_size, task.device.threads))
    return env


def _launch(command: list[str], log: Path, timeout_s: float, env: dict[str, str]) -> int | None:
    """torchrun's exit code, or None when it ran past `timeout_s` (then the group is killed)."""
    with log.open("wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)  # its own group: one kill ends every rank
        try:
            return process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def aggregate(task: CellTask, outcomes: dict[int, ProcessMeasurement | dict], returncode: int,
              torchrun_log: str = "") -> dict:
    """One row's outcome from every rank's (what it measured, or its failure's columns): the failure that ended the
    cell, or the ranks' measurements combined (`bench.results.rows.rank_columns`)."""
    failure = _failure(task.cell.world_size, outcomes, returncode, torchrun_log)
    if failure is not None:
        return failure
    cell = task.cell
    return rank_columns([outcomes[rank] for rank in range(cell.world_size)], cell, task.flops, task.peak)


def _failure(world_size: int, outcomes: dict[int, ProcessMeasurement | dict], returncode: int,
             torchrun_log: str) -> dict | None:
    """What ended the cell, or None when every rank is ok.

    A rank that died without a result (not stopped by torchrun) comes first: the others' errors
    are then their collectives losing it. Else the failure a rank reported, a specific one (oom,
    skipped) before an `error`, which may only be a collective losing the rank that failed.
    """
    exit_codes = rank_exit_codes(torchrun_log)
    failed = {rank: outcome for rank, outcome in sorted(outcomes.items()) if not isinstance(outcome, ProcessMeasurement)}
    # SIGTERM is torchrun stopping the survivors once one rank has failed.
    died = [rank for rank in range(world_size) if rank not in outcomes and exit_codes.get(rank) != -signal.SIGTERM]
    if not (failed or died or returncode):
        return None
    if failed and not died:
        rank = min(failed, key=lambda r: (failed[r]["status"] == "error", r))
        outcome = failed[rank]
        return failure(outcome["status"], outcome.get("error_type"), f"rank {rank}: {outcome.get('error_message', '')}")
    known = [rank for rank in died if rank in exit_codes]
    if known:
        what = "; ".join(f"rank {rank} exited with code {exit_codes[rank]} without a result" for rank in known)
    else:
        what = (f"rank(s) {', '.join(map(str, died)) or 'none'} ended without a result; torchrun exited "
                f"with code {returncode}: {_tail(torchrun_log)}")
    after = [f"rank {rank} then failed: {o.get('error_type')}: {o.get('error_message', '')[:160]}"
             for rank, o in failed.items()]
    return failure("error", "RankDied", "; ".join([what, *after]))


def rank_exit_codes(torchrun_log: str) -> dict[int, int]:
    """Each failed rank's exit code, from torchrun's failure summary (negative: killed by a signal).

    >>> rank_exit_codes("  rank      : 1 (local_rank: 1)\\n  exitcode  : 7 (pid: 22209)")
    {1: 7}
    """
    found = re.findall(r"rank\s*:\s*(\d+) \(local_rank[^\n]*\n\s*exitcode\s*:\s*(-?\d+)", torchrun_log)
    return {int(rank): int(code) for rank, code in found}


def _tail(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(lines)[-_LOG_TAIL_CHARS:]
