"""Where a grid's cells run: one after another on this machine, or as SLURM jobs through submitit.

Either way every cell comes back as one outcome (`bench.run.cell_process.run_cell`, run here or on a
compute node) and the runner writes the row: the same rows, the same resume.

    bench run experiments/ddp.toml --executor slurm --slurm-partition gpu --slurm-time-min 30
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator, Literal, Protocol, Sequence

from bench.errors import MissingExtra
from bench.grid.cell import Cell
from bench.measure.device import DeviceChoice, DeviceInfo, detect_device
from bench.results.rows import failure
from bench.run.cell_measurement import CellTask
from bench.run.cell_process import run_cell

ExecutorName = Literal["local", "slurm"]
OnStart = Callable[[Cell, int, int], None]
_JOB_START_MARGIN_MIN = 10
"""Minutes a job gets beyond the cell's own time limit: queueing aside, start-up takes a while."""


@dataclass(frozen=True, kw_only=True)
class SlurmOptions:
    """What a user sets to run a grid's cells as SLURM jobs (one job per cell)."""

    folder: Path = Path("results/slurm_jobs")
    """submitit's folder for the jobs' pickles and logs; on a filesystem the nodes share."""
    partition: str | None = None
    """`--partition`; None: the cluster's default."""
    gpus_per_node: int | None = None
    """GPUs per job; None: the cell's world size on CUDA (one GPU per rank), none on CPU."""
    cpus_per_task: int | None = None
    """CPU cores per job; None: the cluster's default."""
    time_min: int | None = None
    """Job time limit in minutes; None: the cell's time limit plus a start-up margin."""
    cluster: Literal["slurm", "local"] = "slurm"
    """`local`: submitit's stand-in that runs each job as a local process (tests, a dry run)."""
    poll_s: float = 5.0
    """Seconds between checks for finished jobs."""


class Executor(Protocol):
    def run(self, tasks: Sequence[CellTask], timeout_s: float, on_start: OnStart | None = None
            ) -> Iterator[tuple[CellTask, dict]]:
        """Each task with its outcome, as cells finish."""


class LocalExecutor:
    """Cells one after another on this machine: one measurement never shares it with another."""

    def run(self, tasks: Sequence[CellTask], timeout_s: float, on_start: OnStart | None = None
            ) -> Iterator[tuple[CellTask, dict]]:
        for index, task in enumerate(tasks):
            if on_start:
                on_start(task.cell, index, len(tasks))
            yield task, run_cell(task, timeout_s)


class SlurmExecutor:
    """Every cell submitted at once as its own job; outcomes come back as jobs end.

    A job that fails outside the cell (node failure, time limit, cancelled) is an error row.
    Closing the iterator early (Ctrl-C) cancels the jobs not yet finished.
    """

    def __init__(self, options: SlurmOptions) -> None:
        self.options = options

    def run(self, tasks: Sequence[CellTask], timeout_s: float, on_start: OnStart | None = None
            ) -> Iterator[tuple[CellTask, dict]]:
        submitit = _submitit()  # late: only the SLURM path needs it

        executor = submitit.AutoExecutor(folder=self.options.folder, cluster=self.options.cluster)
        pending = []
        try:
            for index, task in enumerate(tasks):
                if on_start:
                    on_start(task.cell, index, len(tasks))
                executor.update_parameters(**self.job_parameters(task, timeout_s))
                # No runner pid: the job runs on another machine, where that pid means nothing.
                pending.append((task, executor.submit(run_cell, replace(task, runner_pid=None), timeout_s)))
            while pending:
                for item in [item for item in pending if item[1].done()]:
                    pending.remove(item)
                    yield item[0], job_outcome(item[1])
                if pending:
                    time.sleep(self.options.poll_s)
        finally:
            for _, job in pending:
                job.cancel(check=False)

    def job_parameters(self, task: CellTask, timeout_s: float) -> dict:
        """submitit's parameters for one cell's job: one node, one task (torchrun starts the ranks)."""
        options = self.options
        gpus = options.gpus_per_node
        if gpus is None:
            gpus = task.cell.world_size if task.device.type == "cuda" else 0
        parameters = {"name": f"bench-{task.cell.cell_id}", "nodes": 1, "tasks_per_node": 1,
                      "gpus_per_node": gpus,
                      "timeout_min": options.time_min or math.ceil(timeout_s / 60) + _JOB_START_MARGIN_MIN}
        if options.cpus_per_task:
            parameters["cpus_per_task"] = options.cpus_per_task
        if options.partition:
            parameters["slurm_partition"] = options.partition
        return parameters


def job_outcome(job: object) -> dict:
    """The cell's outcome from a finished job, or the job's own failure as an error outcome."""
    try:
        return job.result()
    except Exception as exc:  # noqa: BLE001 - a failed job is a row, like a failed cell
        return failure("error", type(exc).__name__, f"job {job.job_id}: {_last_line(exc)}")


def make_executor(name: ExecutorName, slurm: SlurmOptions) -> Executor:
    return SlurmExecutor(slurm) if name == "slurm" else LocalExecutor()


def target_device(choice: DeviceChoice, name: ExecutorName, slurm: SlurmOptions) -> DeviceInfo:
    """The device the cells will run on: this machine's, or a compute node's (asked in a short job)."""
    if name == "local":
        return detect_device(choice)
    submitit = _submitit()

    executor = submitit.AutoExecutor(folder=slurm.folder, cluster=slurm.cluster)
    gpus = 0 if choice == "cpu" else slurm.gpus_per_node or (1 if slurm.cluster == "slurm" else 0)
    parameters = {"name": "bench-detect-device", "nodes": 1, "tasks_per_node": 1, "gpus_per_node": gpus,
                  "timeout_min": _JOB_START_MARGIN_MIN}
    if slurm.partition:
        parameters["slurm_partition"] = slurm.partition
    executor.update_parameters(**parameters)
    return executor.submit(detect_device, choice).result()


def _last_line(exc: BaseException) -> str:
    # submitit's message starts with its own preamble; the cause is the traceback's last line.
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return (lines[-1] if lines else repr(exc))[:500]


def _submitit():
    """submitit, an optional extra (`bench[slurm]`); missing, one line naming the extra."""
    try:
        import submitit
    except ImportError:
        raise MissingExtra.of("submitit", "slurm", "--executor slurm") from None
    return submitit
