"""A data-parallel cell: launched with torchrun, its ranks' measurements aggregated into one row.

The cell runs as `python -m torch.distributed.run --standalone --nproc-per-node N -m
bench.run.ddp_rank TASK OUT_DIR` in its own process group, under the same time limit as a
single-process cell: on timeout the whole group is killed. A rank that dies makes torchrun
(`--max-restarts 0`) stop the others and exit non-zero; the row is then an error naming the
rank, never a hang. Multi-node runs use torchrun's own rendezvous (see README), not this launcher.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench.isolation import safe_child_environment
from bench.measure.cpu import threads_per_rank
from bench.measure.utilization import samples_per_s
from bench.results.rows import failure, throughput_columns
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
        outcomes = {int(path.stem.removeprefix("rank")): json.loads(path.read_text())
                    for path in folder.glob("rank*.json")}
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


def aggregate(task: CellTask, outcomes: dict[int, dict], returncode: int, torchrun_log: str = "") -> dict:
    """One row's outcome from every rank's: the failure that ended the cell, or the combined figures.

    Step times: per step, the slowest rank (the all-reduce makes the others wait for it).
    Memory: `peak_memory_bytes` is the largest rank's; both extremes are kept.
    """
    failure = _failure(task.cell.world_size, outcomes, returncode, torchrun_log)
    if failure is not None:
        return failure
    ranks = [outcomes[rank] for rank in range(task.cell.world_size)]
    slowest_ms = [max(times) for times in zip(*(json.loads(r["step_times_ms"]) for r in ranks))]
    peaks = [r["peak_memory_bytes"] for r in ranks]
    row = {**ranks[0], **throughput_columns(task.cell.effective_batch, slowest_ms, task.flops, task.peak)}
    static = row["params_bytes"] + row["grads_bytes"] + row["optimizer_state_bytes"]
    row.update(
        peak_memory_bytes=max(peaks), activations_peak_bytes=max(peaks) - static,
        peak_allocated_bytes=_max_or_none(r["peak_allocated_bytes"] for r in ranks),
        peak_reserved_bytes=_max_or_none(r["peak_reserved_bytes"] for r in ranks),
        peak_tracked_bytes=max(r["peak_tracked_bytes"] for r in ranks),
        peak_memory_max_rank_bytes=max(peaks), peak_memory_min_rank_bytes=min(peaks),
        global_samples_per_s=samples_per_s(task.cell.global_batch, float(np.median(slowest_ms))),
        allreduce_ms_per_step=max(r["allreduce_ms_per_step"] for r in ranks),
    )
    row.pop("rank")
    return row


def _failure(world_size: int, outcomes: dict[int, dict], returncode: int, torchrun_log: str) -> dict | None:
    """What ended the cell, or None when every rank is ok.

    A rank that died without a result (not stopped by torchrun) comes first: the others' errors
    are then their collectives losing it. Else the failure a rank reported, a specific one (oom,
    skipped) before an `error`, which may only be a collective losing the rank that failed.
    """
    exit_codes = rank_exit_codes(torchrun_log)
    failed = {rank: outcomes[rank] for rank in sorted(outcomes) if outcomes[rank]["status"] != "ok"}
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


def single_process_columns(outcome: dict) -> dict:
    """A 1-process cell's outcome with the columns that data-parallel rows also carry."""
    if outcome["status"] != "ok":
        return outcome
    peak = outcome["peak_memory_bytes"]
    return {**outcome, "peak_memory_max_rank_bytes": peak, "peak_memory_min_rank_bytes": peak,
            "global_samples_per_s": outcome["samples_per_s"]}


def _max_or_none(values) -> int | None:
    present = [value for value in values if value is not None]
    return max(present) if present else None


def _tail(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(lines)[-_LOG_TAIL_CHARS:]
