"""One fake trace per configuration, shared by every command that reads a step on fake tensors.

`bench estimate` and `bench probe` need a cell's memory (`Estimate`); `bench predict`, `bench plan` and a
measured row's model speeds need its ops (`StepOps`) as well. A CUDA target's trace records both in one pass
(`OpRecorder` watches the estimator's step). `traced` keys it with `trace_key` (the cell without the fields a
fake step ignores, K capped at 2: from the second micro-step on every micro-step repeats the second's memory and
ops, so one trace at K = 2 answers every K > 1; and the target) and keeps it in the disk cache (`bench.cache`)
and beside the command's fake models (`FakeModels.traces`): a configuration traced by any command is not traced
again by any other, and a command reads each from disk once.
"""

from __future__ import annotations

import contextlib
import json
import signal
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, Iterator

from bench.cache import ESTIMATOR_SOURCES, DiskCache, byte_count_problem
from bench.grid.cell import PROVENANCE_FIELDS, Cell
from bench.grid.model_ref import code_digest
from bench.measure.op_table import StepOps
from bench.memory.allocator import whole_segments
from bench.memory.fake_models import FakeModels

if TYPE_CHECKING:
    from bench.memory.estimate import Estimate, Target

IN_PROCESS_TRACES = 32
"""Traces a command keeps in memory besides the disk cache (a ViT-L/16 trace's ops take a few MB)."""


ESTIMATE_FIELDS = ("target", "traced", "params_bytes", "param_count", "inputs_bytes", "workspace_bytes", "attention",
                   "reserved_bytes")
"""`Estimate`'s fields, as a stored trace holds them (a test checks them against the class)."""


@dataclass(frozen=True)
class Trace:
    """A cell's step on fake tensors: its memory on the target and, for a CUDA target, its ops. What the planner
    reads (the peak, the parameter count, the ops) needs no torch; `estimate` builds the full `Estimate`."""

    peak_bytes: float
    """What a probe compares with a budget: predicted `max_memory_reserved` on CUDA, tracked tensors plus inputs
    on a CPU."""
    allocated_peak_bytes: float
    """CUDA: the allocated peak in whole 2 MiB segments, convex in the micro-batch (`bench plan` bounds the sizes
    between traced ones with it; `peak_bytes`, the allocator's replay, is not convex). CPU: `peak_bytes`."""
    param_count: int
    ops: StepOps | None
    """None for a CPU target (the throughput model predicts CUDA GPUs only)."""
    estimate_fields: dict[str, Any] = field(repr=False, compare=False)
    """`Estimate`'s fields as plain values (`ESTIMATE_FIELDS`; its `traced` as a dict)."""

    @classmethod
    def of(cls, estimate: Estimate, ops: StepOps | None) -> Trace:
        cuda = estimate.target == "cuda"
        peak = estimate.peak_reserved_bytes if cuda else estimate.peak_bytes + estimate.inputs_bytes
        allocated = whole_segments(estimate.peak_allocated_bytes) if cuda else peak
        values = {name: getattr(estimate, name) for name in ESTIMATE_FIELDS}
        return cls(float(peak), float(allocated), estimate.param_count, ops,
                   {**values, "traced": asdict(estimate.traced)})

    @cached_property
    def estimate(self) -> Estimate:
        from bench.measure.memory import TracedStep
        from bench.memory.estimate import Estimate

        return Estimate(**{**self.estimate_fields, "traced": TracedStep(**self.estimate_fields["traced"])})

    def to_json(self) -> dict:
        return {"peak_bytes": self.peak_bytes, "allocated_peak_bytes": self.allocated_peak_bytes,
                "param_count": self.param_count, "estimate": self.estimate_fields,
                "ops": None if self.ops is None else self.ops.to_json()}

    @classmethod
    def from_json(cls, data: dict) -> Trace:
        """Raises KeyError, TypeError or ValueError for data of another layout."""
        ops = data["ops"]
        return cls(float(data["peak_bytes"]), float(data["allocated_peak_bytes"]), int(data["param_count"]),
                   None if ops is None else StepOps.from_json(ops), dict(data["estimate"]))


NOT_TRACED = ("experiment", "warmup_steps", "measured_steps", "trace_steps", "seed", *PROVENANCE_FIELDS)
"""Cell fields a fake trace does not depend on: it runs one warm-up and one traced step whatever the cell's
counts, on tensors without values (no seed), and a grid's name or a config's provenance changes nothing in it."""


def trace_key(cell: Cell, target: Target) -> dict[str, Any]:
    """What a trace depends on: the cell but `NOT_TRACED`, K capped at 2, the target, and for a model from a
    module or a file, that file's digest (`code_digest`: an edited model is traced again).

    >>> cell = Cell(experiment="e", profile="cuda", model="m", image_size=32, micro_batch=4, accum_steps=8,
    ...             precision="bf16", checkpointing="off", optimizer="sgd", channels_last=False,
    ...             warmup_steps=1, measured_steps=1)
    >>> trace_key(cell, "cuda") == trace_key(replace(cell, experiment="grid", accum_steps=2, warmup_steps=5,
    ...                                              measured_steps=20, seed=3), "cuda")
    True
    >>> trace_key(cell, "cuda") == trace_key(replace(cell, micro_batch=8), "cuda")
    False
    """
    capped = replace(cell, accum_steps=min(cell.accum_steps, 2))
    key = {"cell": {k: v for k, v in capped.to_dict().items() if k not in NOT_TRACED}, "target": target}
    code = code_digest(cell.model)
    return key if code is None else {**key, "model_code": code}


def traced(cell: Cell, target: Target = "cuda", models: FakeModels | None = None) -> tuple[Trace, bool]:
    """`cell`'s trace (at K = min(K, 2)) on `target`, and whether it was traced now (False: `models` or the disk
    cache had it)."""
    key = trace_key(cell, target)
    name = json.dumps(key, sort_keys=True)
    kept = models.traces if models is not None else {}
    if name in kept:
        kept.move_to_end(name)
        return kept[name], False
    trace, fresh = _stored(key), False
    if trace is None:
        trace, fresh = _trace(replace(cell, accum_steps=min(cell.accum_steps, 2)), target, models), True
        _DISK.put(key, trace.to_json())
    if models is not None:
        kept[name] = trace
        if len(kept) > IN_PROCESS_TRACES:
            kept.popitem(last=False)
    return trace, fresh


def is_stored(cell: Cell, target: Target = "cuda") -> bool:
    """Whether the disk cache holds `cell`'s trace (not read: a plan decides with it whether to trace in parallel)."""
    return _DISK.has(trace_key(cell, target))


BOTH_ENDS_MIN_CELLS = 8
"""Cells from which `tracing_from_both_ends` starts a second process: below it, the process's start (about 3 s of
imports, on the other core) would save little."""


FAR_END_PRELOAD = "bench.memory.estimate"
"""What the fork server imports for the child that traces a grid's far end (torch, timm, the estimator)."""


def traces_beside() -> bool:
    """Whether traces may run in a second process beside this one: two cores to run on, and the disk cache on (the
    one way a child's traces reach this process). Torch-free."""
    from bench.cache import enabled
    from bench.measure.host import usable_cpus

    return usable_cpus() >= 2 and enabled()


def traces_from_both_ends(cells: int) -> bool:
    """Whether a grid of `cells` cells is traced from both ends (`tracing_from_both_ends`): from
    `BOTH_ENDS_MIN_CELLS` cells, where traces may run beside. Torch-free: a command asks before its imports."""
    return cells >= BOTH_ENDS_MIN_CELLS and traces_beside()


def start_far_end_early(cells: int) -> None:
    """For a grid of `cells` cells that will be traced from both ends, start the fork server now (a command calls
    this before importing torch), so that its imports run beside the command's own instead of after them; for any
    other grid, nothing."""
    if traces_from_both_ends(cells):
        from bench.isolation import start_fork_server_early

        start_fork_server_early(FAR_END_PRELOAD)


@contextlib.contextmanager
def tracing_from_both_ends(cells: list[Cell], target: Target) -> Iterator[None]:
    """While the body traces `cells` in order, a child of the fork server traces them from the last back into the
    disk cache, skipping what is stored already: the body reads the second half from the cache, on two cores in
    about half the time. The traces are the same either way (deterministic; both read and write the one cache).
    Nothing is started with fewer than `BOTH_ENDS_MIN_CELLS` cells, one core or the cache off. The child is stopped
    when the body ends, however it ends (what it was tracing then, the body has traced or no longer needs)."""
    from bench.cache import cache_dir
    from bench.isolation import fork_server, preload_in_children

    if not traces_from_both_ends(len(cells)):
        yield
        return
    preload_in_children(FAR_END_PRELOAD)
    child = fork_server().Process(target=_trace_from_the_end, args=(cells, target, str(cache_dir())), daemon=True)
    child.start()
    try:
        yield
    finally:
        if child.is_alive():
            child.terminate()
        child.join()


def _trace_from_the_end(cells: list[Cell], target: Target, cache_root: str) -> None:
    """In a child process: trace `cells` from the last back into the parent's disk cache, skipping stored ones. A
    cell that fails is left to the parent, which reports it."""
    from bench.cache import use_cache_folder

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the process group: the parent stops this child
    use_cache_folder(cache_root)
    models = FakeModels()
    for cell in reversed(cells):
        if is_stored(cell, target):
            continue
        with contextlib.suppress(Exception):
            traced(cell, target, models)


def _trace(cell: Cell, target: Target, models: FakeModels | None) -> Trace:
    from bench.measure.ops import OpRecorder, step_ops
    from bench.memory.estimate import estimate_cell

    if target != "cuda":
        return Trace.of(estimate_cell(cell, target, models), None)
    recorder = OpRecorder()
    estimate = estimate_cell(cell, target, models, observer=recorder)
    return Trace.of(estimate, step_ops(recorder, cell.micro_batch))


def trace_step_ops(cell: Cell, models: FakeModels | None = None) -> StepOps:
    """Only the ops of `cell`'s step (no memory trace, not cached): two micro-steps and the update (one
    micro-step when the cell's K is 1: its `for_step` then answers K = 1 only). For the many public rows the
    throughput model is fitted to and validated on, which no command plans.

    Example:
        >>> cell = Cell(experiment="e", profile="cuda", model="test_resnet", image_size=32, micro_batch=2,
        ...             accum_steps=4, precision="bf16", checkpointing="off", optimizer="sgd",
        ...             channels_last=False, warmup_steps=1, measured_steps=1)
        >>> ops = trace_step_ops(cell)
        >>> int(ops.for_step(4).count.sum()) > int(ops.for_step(1).count.sum())
        True
    """
    from bench.measure.ops import OpRecorder, step_ops
    from bench.memory.estimate import fake_step

    recorder = OpRecorder()
    with fake_step(cell, "cuda", models, min(cell.accum_steps, 2), recorder.on_phase) as step, recorder:
        step.run()
    return step_ops(recorder, cell.micro_batch)


def _stored(key: dict[str, Any]) -> Trace | None:
    value = _DISK.get(key)
    if value is None:
        return None
    try:
        return Trace.from_json(value)
    except (TypeError, KeyError, ValueError):  # passed the check, but not this layout's fields
        return None


def _trace_problem(value: Any) -> str | None:
    """What makes a cached value no trace, or None (its ops are checked again as they are read)."""
    if not isinstance(value, dict) or not isinstance(value.get("estimate"), dict) or "ops" not in value:
        return "not a trace"
    count = value.get("param_count")
    if not (isinstance(count, int) and not isinstance(count, bool) and count > 0):
        return f"a trace with a parameter count of {count!r}"[:120]
    estimate = value["estimate"]
    if set(estimate) != set(ESTIMATE_FIELDS) or not isinstance(estimate["traced"], dict):
        return "a trace without an estimate's fields"
    return byte_count_problem(value.get("peak_bytes")) or byte_count_problem(value.get("allocated_peak_bytes"))


_DISK = DiskCache("traces", sources=(*ESTIMATOR_SOURCES, "measure/ops.py", "measure/op_table.py"),
                  check=_trace_problem)
