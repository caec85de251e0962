"""Inside one cell's process: build, warm up, trace, time, and report what was measured.

The runner forks each cell from a server that has already imported this module (and so
torch and timm), then talks to it only through a pipe: what comes back is what the process
measured, as it measured it (`bench.results.rows.ProcessMeasurement`), or the failure's columns;
the row's columns are computed from it by `bench.results.rows`.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import threading
import time
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Protocol

import timm  # noqa: F401  (preloaded by the fork server so cells start fast)
import torch

from bench.grid.cell import Cell
from bench.isolation import drop_working_directory, preload_in_children
from bench.measure.device import DeviceInfo
from bench.measure.failure import first_line, is_out_of_memory
from bench.measure.flops import FlopsPerSample
from bench.measure.memory import (
    allocator_peaks,
    expandable_segments_in_effect,
    optimizer_state_bytes,
    param_bytes,
    reset_allocator_peak,
    trace_step,
)
from bench.measure.host import QuietPolicy, foreign_load_cores, read_load
from bench.measure.peak import PeakFlops, reference_flops_per_s
from bench.measure.timing import TimingPolicy, time_until_stable, warm_up
from bench.results.rows import AllreduceMeasurement, ProcessMeasurement, failure, failure_from
from bench.run.cell_input import LoaderUnavailable, open_input
from bench.train.data import ImageData
from bench.train.optim import OptimizerUnavailable
from bench.train.setup import cell_training
from bench.train.step import NoSync, train_step
from bench.units import GIB

preload_in_children(__name__)  # cells then start with torch and timm imported


@dataclass(frozen=True)
class CellTask:
    """Everything a cell's process needs, decided by the parent."""

    cell: Cell
    device: DeviceInfo
    peak: PeakFlops
    flops: FlopsPerSample | None
    memory_limit_gib: float | None = None
    """Cap on the memory the cell may add: the device's on CUDA, address space on CPU."""
    runner_pid: int | None = None
    """The runner's process: the cell ends itself if the runner dies (killed grid, no orphans)."""
    data: ImageData | None = None
    """The data set of a loader input, discovered once by the runner (`bench.train.data.open_data`)."""
    timing: TimingPolicy | None = None
    """How long to warm up and time; None: exactly the cell's warm-up and measured steps."""
    quiet: QuietPolicy = QuietPolicy()
    """What the runner does when other work shares the machine (`bench.run.cell_process.run_cell`)."""

    @property
    def timing_policy(self) -> TimingPolicy:
        return self.timing or TimingPolicy(min_steps=self.cell.measured_steps, target_ci95_rel=None,
                                           min_warmup_steps=self.cell.warmup_steps, max_extra_warmup_steps=0)


class Distribution(Protocol):
    """What data parallelism changes in a cell's measurement (`bench.run.ddp_rank`)."""

    no_sync: NoSync | None
    """Passed to the step: DDP's `model.no_sync`, or None to all-reduce every micro-step."""

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model the step trains (DDP around the built one)."""

    def start_measuring(self) -> None:
        """Called just before the timed steps: forget what warm-up and tracing did."""

    def allreduces(self) -> AllreduceMeasurement:
        """This process's all-reduces over the timed steps."""


def child_main(task: CellTask, connection: Connection) -> None:
    """Process entry point: send back the cell's outcome, whatever happens."""
    # Ctrl-C reaches the whole process group; the runner decides and kills this process itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    drop_working_directory()  # the path came from the runner's process: a late import must not find ./x.py
    if task.runner_pid:
        exit_with(task.runner_pid)
    outcome = measured_outcome(task)
    try:
        connection.send(outcome)
        connection.close()
    except (BrokenPipeError, ConnectionResetError):  # the runner stopped listening (interrupted): nothing to say
        os._exit(0)


def measured_outcome(task: CellTask, distribution: Distribution | None = None) -> ProcessMeasurement | dict:
    """The cell's outcome in this process: what it measured, or the failure as a row's columns."""
    try:
        # The allocator's setting first: the memory cap (and DDP's set_device) initialise CUDA, after which
        # PYTORCH_CUDA_ALLOC_CONF is no longer read.
        configure_allocator(task.cell.allocator, torch.device(task.device.type))
        _apply_memory_limit(task)
        return measure_cell(task, distribution)
    except (OptimizerUnavailable, AllocatorUnavailable, LoaderUnavailable) as exc:
        return failure("skipped", type(exc).__name__, str(exc))
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a row
        return failure_from(exc)


def measure_cell(task: CellTask, distribution: Distribution | None = None) -> ProcessMeasurement:
    """Run one cell (one rank of it, under `distribution`) and return what it measured."""
    with contextlib.ExitStack() as cleanup:  # a loader's workers stop however the cell ends
        return _measure_cell(task, distribution, cleanup)


def _measure_cell(task: CellTask, distribution: Distribution | None,
                  cleanup: contextlib.ExitStack) -> ProcessMeasurement:
    cell, device = task.cell, torch.device(task.device.type)
    if distribution is None:  # a DDP rank's threads are its share of the cores (bench.run.ddp_rank)
        configure_threads(task.device)
    training = cell_training(cell, device, wrap=distribution.wrap if distribution else None)
    model, optimizer, scaler = training.model, training.optimizer, training.scaler
    # Synthetic: the same micro-batch K times (a loader holds one micro-batch at a time, and so do
    # we); a loader: each micro-batch fetched as the step reaches it.
    source = cleanup.enter_context(open_input(cell, device, task.data))
    no_sync = distribution.no_sync if distribution else None
    running_loss: torch.Tensor | float = 0.0  # what a loop keeps to log; seed 004's leak when live

    def run_step(on_phase=None):
        nonlocal running_loss
        running_loss = running_loss + train_step(model, optimizer, source.step(cell.accum_steps), cell.precision,
                                                 scaler, on_phase, no_sync=no_sync, **cell.step_options)
        return running_loss

    policy = task.timing_policy if distribution is None else rank_policy(task.timing_policy)
    _first_step(run_step, cell)
    warmup_steps_run = 1 + warm_up(run_step, device, policy)
    traced = trace_step(run_step, model, optimizer, device, steps=cell.trace_steps)
    reset_allocator_peak(device)
    if distribution:
        distribution.start_measuring()
    source.start_measuring()
    # The machine's own speed, before and after: on a CPU only (one process; DDP ranks share the cores).
    probe_speed = device.type == "cpu" and distribution is None
    reference_before = reference_flops_per_s() if probe_speed else None
    load_before = read_load()
    timed = time_until_stable(run_step, device, policy)
    # Under DDP the other ranks are part of the cell, not foreign load: not measured there.
    foreign = None if distribution else foreign_load_cores(load_before, read_load())
    reference_after = reference_flops_per_s() if probe_speed else None
    peak_allocated, peak_reserved = allocator_peaks(device)
    input_measured = source.measured()  # after the peaks: a loader is then timed alone
    return ProcessMeasurement(
        step_times_ms=timed.samples_ms, traced=traced,
        memory_source="cuda_allocator" if device.type == "cuda" else "tracked_tensors",
        peak_allocated_bytes=peak_allocated, peak_reserved_bytes=peak_reserved, params_bytes=param_bytes(model),
        optimizer_state_bytes=optimizer_state_bytes(optimizer), param_count=sum(p.numel() for p in model.parameters()),
        host_threads=host_threads(task),
        cpu_threads=torch.get_num_threads() if distribution or input_measured else None,
        expandable_segments=expandable_segments_in_effect(device), warmup_steps_run=warmup_steps_run,
        ci95_target_rel=policy.target_ci95_rel, ci95_target_met=timed.target_met, foreign_load_cores=foreign,
        reference_flops_per_s_before=reference_before, reference_flops_per_s_after=reference_after,
        input=input_measured, allreduce=distribution.allreduces() if distribution else None)


def rank_policy(policy: TimingPolicy) -> TimingPolicy:
    """A DDP rank's timing: the same steps on every rank, so their all-reduces pair up. A fixed warm-up (a rank
    that warmed up one step longer than another waits for a collective the other never starts) and a fixed count.

    >>> adaptive = TimingPolicy(min_steps=5, min_warmup_steps=2)
    >>> fixed = rank_policy(adaptive)
    >>> fixed.target_ci95_rel, fixed.max_extra_warmup_steps, fixed.min_steps, fixed.min_warmup_steps
    (None, 0, 5, 2)
    """
    return replace(policy, target_ci95_rel=None, max_extra_warmup_steps=0)


def host_threads(task: CellTask) -> int:
    """The cores a cell keeps busy on its host: its intra-op threads on a CPU (shared out among the ranks
    under DDP), one thread per rank feeding a GPU."""
    return task.cell.world_size if task.device.type == "cuda" else task.device.threads


def configure_threads(device_info: DeviceInfo) -> None:
    """The cell's intra-op threads as the runner chose them, and one inter-op thread (eager training
    does not use the inter-op pool; its threads would only compete for the same cores)."""
    if device_info.type != "cpu":
        return
    torch.set_num_threads(device_info.threads)
    with contextlib.suppress(RuntimeError):  # already fixed in this process (set once, before first use)
        torch.set_num_interop_threads(1)


class AllocatorUnavailable(Exception):
    """The allocator setting needs CUDA's caching allocator; the cell is skipped, not failed."""


class CompileFailed(Exception):
    """torch.compile could not build the model's graphs."""


def configure_allocator(allocator: str, device: torch.device) -> None:
    """Set PYTORCH_CUDA_ALLOC_CONF before this process first touches CUDA (it is read then)."""
    if allocator == "default":
        return
    if device.type != "cuda":
        raise AllocatorUnavailable(f"allocator {allocator}: a setting of CUDA's caching allocator; "
                                   f"not testable on {device.type}")
    if os.environ.get("PYTORCH_CUDA_ALLOC_CONF") == _EXPANDABLE:  # set already (a DDP rank, before set_device)
        return
    if torch.cuda.is_initialized():  # forked from a server that must not have touched CUDA
        raise RuntimeError(f"allocator {allocator}: CUDA was initialised before the setting could apply")
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = _EXPANDABLE


_EXPANDABLE = "expandable_segments:True"


def _first_step(run_step, cell: Cell) -> None:
    """The first warm-up step; under torch.compile it is where the graphs are built."""
    if cell.compile == "off":
        run_step()
        return
    try:
        run_step()
    except Exception as exc:  # noqa: BLE001 - the row says compile failed, not a random error
        if is_out_of_memory(exc):
            raise
        raise CompileFailed(f"torch.compile failed on the first step: {type(exc).__name__}: "
                            f"{first_line(exc)}") from exc


def exit_with(runner_pid: int, poll_s: float = 1.0) -> None:
    """End this process soon after the runner is gone, even if the runner was SIGKILLed."""
    def watch() -> None:
        while True:
            time.sleep(poll_s)
            try:
                os.kill(runner_pid, 0)
            except ProcessLookupError:
                os._exit(3)
    threading.Thread(target=watch, name="exit-with-runner", daemon=True).start()


def _apply_memory_limit(task: CellTask) -> None:
    if task.memory_limit_gib is None:
        return
    limit = int(task.memory_limit_gib * GIB)
    if task.device.type == "cuda":
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total))
        return
    # On CPU, cap growth of the address space: a larger allocation then fails inside
    # torch's allocator, as it would on a full device.
    pages = int(open("/proc/self/statm").read().split()[0])
    ceiling = pages * resource.getpagesize() + limit
    resource.setrlimit(resource.RLIMIT_AS, (ceiling, ceiling))
