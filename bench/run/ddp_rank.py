"""One rank of a data-parallel cell: started by torchrun, measures like any cell, writes its file.

    python -m torch.distributed.run --standalone --nproc-per-node N -m bench.run.ddp_rank TASK OUT_DIR

TASK is the pickled `CellTask`; the rank writes its outcome (what `measure_cell` measured, the
all-reduces among it, or the failure's columns) to `OUT_DIR/rank<R>.pkl` and exits non-zero unless
it measured, so torchrun stops the other ranks instead of leaving them waiting in a collective.
"""

# No `from __future__ import annotations`: DDP checks the comm hook's annotations as objects.

import os
import pickle
import sys
import time
from contextlib import AbstractContextManager
from datetime import timedelta
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from bench.grid.cell import DdpSync
from bench.measure.cpu import threads_per_rank
from bench.results.rows import AllreduceMeasurement, ProcessMeasurement
from bench.run.cell_measurement import (
    CellTask,
    configure_allocator,
    exit_with,
    measured_outcome,
)

COLLECTIVE_TIMEOUT_S = 120
"""A collective that waits longer fails the rank (gloo/NCCL timeout) instead of hanging the grid."""
BUCKET_CAP_MB = 1024
"""Large enough that a model here is one gradient bucket: one all-reduce per synchronising backward."""
FAIL_RANK_ENV = "BENCH_DDP_FAIL_RANK"
"""Fault injection for tests: the rank with this number exits abruptly before the timed steps."""
FAIL_EXIT_CODE = 7


class AllreduceMeter:
    """A DDP comm hook around the default all-reduce that counts and times what it does."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.reset()

    def reset(self) -> None:
        self.bucket_calls = 0
        self.synced_backwards = 0
        self._spans: list[tuple[object, object]] = []

    def hook(self, state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """DDP calls this once per gradient bucket of a backward that synchronises."""
        start = self._mark()
        self.bucket_calls += 1
        # DDP's last bucket of a backward: counts backwards that all-reduced, however bucketed.
        self.synced_backwards += bucket.is_last()

        def done(future: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            self._spans.append((start, self._mark()))
            return future.value()

        return allreduce_hook(None, bucket).then(done)

    def milliseconds(self) -> float:
        """Launch-to-completion time summed over the all-reduces since the last reset."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return sum(start.elapsed_time(end) for start, end in self._spans)
        return sum(end - start for start, end in self._spans) * 1e3

    def _mark(self) -> object:
        # On CUDA the work is asynchronous: events on the stream, read after a sync at the end.
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()


class DdpDistribution:
    """`bench.run.cell_measurement.Distribution` for one rank: DDP around the model, the all-reduce metered."""

    def __init__(self, rank: int, local_rank: int, device: torch.device, sync: DdpSync) -> None:
        self.rank, self.local_rank, self.device, self.sync = rank, local_rank, device, sync
        self.meter = AllreduceMeter(device)
        self.no_sync: Callable[[], AbstractContextManager] | None = None

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        device_ids = [self.local_rank] if self.device.type == "cuda" else None
        ddp = DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=BUCKET_CAP_MB)
        ddp.register_comm_hook(None, self.meter.hook)
        self.no_sync = ddp.no_sync if self.sync == "no_sync" else None
        return ddp

    def start_measuring(self) -> None:
        if os.environ.get(FAIL_RANK_ENV) == str(self.rank):
            os._exit(FAIL_EXIT_CODE)  # a rank dying mid-run, as a crash or the OOM killer would
        self.meter.reset()

    def allreduces(self) -> AllreduceMeasurement:
        return AllreduceMeasurement(self.meter.bucket_calls, self.meter.synced_backwards, self.meter.milliseconds())


def run_rank(task: CellTask, rank: int, local_rank: int, world_size: int) -> ProcessMeasurement | dict:
    """This rank's outcome: joins the process group, measures the cell under DDP, leaves."""
    if task.device.type == "cuda":
        configure_allocator(task.cell.allocator, torch.device("cuda"))  # before set_device, which starts CUDA
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        torch.set_num_threads(threads_per_rank(world_size, task.device.threads))
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    try:
        distribution = DdpDistribution(rank, local_rank, device, task.cell.ddp_sync)
        return measured_outcome(task, distribution)
    finally:
        dist.destroy_process_group()


def main(argv: list[str]) -> int:
    task_path, out_dir = (Path(arg) for arg in argv)
    task: CellTask = pickle.loads(task_path.read_bytes())
    if task.runner_pid:
        exit_with(task.runner_pid)
    rank = int(os.environ["RANK"])
    outcome = run_rank(task, rank, int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"]))
    (out_dir / f"rank{rank}.pkl").write_bytes(pickle.dumps(outcome))
    return 0 if isinstance(outcome, ProcessMeasurement) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
