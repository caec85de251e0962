"""Memory collectors: bytes held by tensors, allocator peaks, and a per-phase trace of optimizer steps."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker

from bench.train.step import PhaseHook

# MemTracker's reference types, by their enum value, under the names our rows use.
TRACKED_CATEGORIES = {
    "Parameter": "params",
    "Buffer": "buffers",
    "Gradient": "grads",
    "Activation": "activations",
    "Temp": "temporaries",
    "Optstate": "optimizer_state",
    "Other": "other",
    "AutocastCache": "autocast_cache",  # the estimator's label for autocast's weight casts (bench.memory.cuda_autocast)
}


def unique_tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (shared storages count once).

    >>> t = torch.zeros(4)
    >>> unique_tensor_bytes([t, t.view(2, 2), torch.zeros(2, dtype=torch.uint8)])
    18
    """
    seen: dict[int, int] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        # Keyed by the storage itself (its C++ StorageImpl), not its data pointer: fake
        # tensors (the estimator's) have no data, and all report pointer 0.
        seen[storage._cdata] = storage.nbytes()
    return sum(seen.values())


def param_bytes(model: torch.nn.Module) -> int:
    return unique_tensor_bytes(model.parameters())


def grad_bytes(model: torch.nn.Module) -> int:
    return unique_tensor_bytes(p.grad for p in model.parameters() if p.grad is not None)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Measured from the state tensors themselves, so 8-bit state shows its real size."""
    return unique_tensor_bytes(_tensors_in(list(optimizer.state.values())))


def _tensors_in(value: object) -> Iterable[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors_in(item)


def reset_allocator_peak(device: torch.device) -> None:
    """Start the allocator's peaks afresh. The cache is emptied first: otherwise the reserved peak would
    start at everything warm-up and tracing ever reserved, not what the next steps need."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def expandable_segments_in_effect(device: torch.device) -> bool | None:
    """Whether CUDA's caching allocator runs with expandable segments, as its own snapshot says (None on CPU):
    the setting is read once, when CUDA starts, so asking for it is not the same as having it."""
    if device.type != "cuda":
        return None
    snapshot = torch.cuda.memory._snapshot()
    settings = snapshot.get("allocator_settings", {})
    if "expandable_segments" in settings:
        return bool(settings["expandable_segments"])
    segments = snapshot.get("segments", [])
    return any(segment.get("is_expandable", False) for segment in segments) if segments else None


def allocator_peaks(device: torch.device) -> tuple[int | None, int | None]:
    """(peak allocated, peak reserved) bytes since the last reset; CPU has no allocator stats."""
    if device.type != "cuda":
        return None, None
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)


def kept_graph_nodes(value: object) -> int:
    """Autograd nodes reachable from `value`: what a kept tensor holds alive (0 for a float).

    >>> x = torch.ones(2, requires_grad=True)
    >>> kept_graph_nodes((x * 2).sum()), kept_graph_nodes(1.0)
    (3, 0)
    """
    seen, stack = set(), [getattr(value, "grad_fn", None)]
    while stack:
        node = stack.pop()
        if node is not None and node not in seen:
            seen.add(node)
            stack.extend(next_node for next_node, _ in node.next_functions)
    return len(seen)


def weights_version(model: torch.nn.Module) -> int:
    """Sum of the parameters' in-place write counters: it changes exactly when a weight is updated.

    >>> layer = torch.nn.Linear(2, 2)
    >>> before = weights_version(layer)
    >>> with torch.no_grad():
    ...     _ = layer.weight.add_(1)
    >>> weights_version(layer) - before
    1
    """
    return sum(p._version for p in model.parameters())


def gradient_norm(model: torch.nn.Module) -> float | None:
    """L2 norm over every parameter's gradient (None when there are none). A host sync: untimed use only.

    >>> layer = torch.nn.Linear(2, 1, bias=False)
    >>> layer.weight.grad = torch.tensor([[3.0, 4.0]])
    >>> gradient_norm(layer)
    5.0
    """
    grads = [p.grad.detach().float() for p in model.parameters() if p.grad is not None]
    if not grads:
        return None
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))


def host_rss_bytes() -> int | None:
    """This process's resident memory (Linux); None elsewhere."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return None


@dataclass
class TracedStep:
    """What the untimed, traced optimizer steps showed."""

    phases: list[dict] = field(default_factory=list)
    """[{"step", "phase", "micro_step", "allocated_bytes", "weights_version"}] after each forward,
    backward and the update; `weights_version` (see `weights_version`, counted from the trace's start)
    tells which weights a forward used."""
    kept_graph_nodes: list[int] = field(default_factory=list)
    """Per traced step: autograd nodes reachable from what `run_step` returned (the kept loss)."""
    host_rss_bytes: list[int | None] = field(default_factory=list, compare=False)
    """Per traced step: the process's resident memory after it (not compared: it varies run to run)."""
    grads_bytes: int = 0
    optimizer_state_bytes: int = 0
    activations_saved_bytes: int = 0
    """Activation tensors alive at the end of the first traced step's last forward: what one micro-batch's
    forward saved for backward (MemTracker's activation category)."""
    grad_norm: float | None = None
    """L2 norm of every gradient after the last backward of the first traced step (after DDP's all-reduce):
    the step's update direction, comparable between splits of the same model, data and weights. None
    without values (fake tensors)."""
    tracked_peak_bytes: dict[str, int] = field(default_factory=dict)
    """MemTracker's breakdown at the step's peak, by category, plus "total"."""


class _DevicePeakTracker(MemTracker):
    """MemTracker that keeps the device-wide peak only.

    `trace_step` reads no per-module peaks, and MemTracker updates them by walking every
    module after every op: about 70 % of a traced ViT-L/16 step. The device-wide part below
    is MemTracker's own (`_update_peak_stats`, torch 2.14).
    """

    def _update_peak_stats(self, peak_state: object) -> None:
        for device, snapshot in self._curr_mem_snap.items():
            if self._peak_mem.get(device, 0) < snapshot[_TOTAL_KEY]:
                self._peak_mem[device] = snapshot[_TOTAL_KEY]
                self._peak_mem_snap[device] = dict(snapshot)


def trace_step(run_step: Callable[[PhaseHook], object], model: torch.nn.Module,
               optimizer: torch.optim.Optimizer, device: torch.device, steps: int = 1, *,
               values: bool = True) -> TracedStep:
    """Run `steps` optimizer steps under MemTracker, recording memory after every phase.

    Per-phase bytes come from the CUDA allocator on a GPU and from tracked tensors on CPU.
    `run_step` returns what the loop keeps across steps (its running loss): a graph it holds
    shows in `kept_graph_nodes`, memory that creeps in rising bytes step over step.
    `values`: read values too (the process's resident memory after each step, the gradient norm);
    off under fake tensors, which have none.
    """
    traced = TracedStep()
    step, base_version = 0, weights_version(model)
    tracker = _DevicePeakTracker()
    tracker.track_external(model, optimizer)

    def on_phase(phase: str, micro_step: int) -> None:
        if phase == "forward" and step == 0:  # the last forward's count stands
            traced.activations_saved_bytes = _by_category(tracker.get_tracker_snapshot("current"), device)["activations"]
        if phase == "backward":
            traced.grads_bytes = grad_bytes(model)
        if phase == "optimizer" and step == 0 and values:  # the gradients as the update will use them
            traced.grad_norm = gradient_norm(model)
        if phase == "optimizer":
            traced.optimizer_state_bytes = optimizer_state_bytes(optimizer)
        traced.phases.append({"step": step, "phase": phase, "micro_step": micro_step,
                              "allocated_bytes": _current_bytes(tracker, device),
                              "weights_version": weights_version(model) - base_version})
        if phase == "backward":
            # MemTracker refuses a module run twice in one iteration, which is what
            # accumulation does; resetting module stats keeps the device-wide peak.
            tracker.reset_mod_stats()

    with tracker:
        for step in range(steps):
            kept = run_step(on_phase)
            traced.kept_graph_nodes.append(kept_graph_nodes(kept))
            traced.host_rss_bytes.append(host_rss_bytes() if values else None)
    traced.tracked_peak_bytes = _by_category(tracker.get_tracker_snapshot("peak"), device)
    return traced


def _current_bytes(tracker: MemTracker, device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    return _by_category(tracker.get_tracker_snapshot("current"), device)["total"]


def _by_category(snapshot: dict, device: torch.device) -> dict[str, int]:
    totals = {name: 0 for name in TRACKED_CATEGORIES.values()} | {"total": 0}
    for snap_device, categories in snapshot.items():
        if torch.device(snap_device).type != device.type:
            continue
        for key, nbytes in categories.items():
            name = "total" if key == "Total" else TRACKED_CATEGORIES[key.value]
            totals[name] += nbytes
    return totals
