"""The row schema and the runs file: one CSV row per cell, written the moment the cell ends.

Rows are appended with a single write and fsync, so killing a grid loses nothing finished;
a row that replaces an earlier one for the same cell (`--force`, `--retry-failed`) rewrites
the file through a temporary file and an atomic rename.

A file written by an earlier version, whose columns are a subset of today's, is read with
the new columns filled in (axes added later at their default, since that is what ran; other
columns empty: not measured then) and rewritten with today's header on the next write.
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path

from bench.cell import extra_axis_defaults

# The header comes from this list, never from a row. Units are in the names.
COLUMNS: dict[str, str] = {
    "cell_id": "stable id: readable configuration plus a hash of every cell field",
    "experiment": "grid name (experiment.name)",
    "profile": "cuda (the grid as written) or cpu (its CPU profile)",
    "model": "timm model name, random init",
    "image_size": "square input side, pixels",
    "micro_batch": "samples per forward/backward",
    "accum_steps": "micro-batches per optimizer step (K)",
    "effective_batch": "micro_batch x accum_steps: samples per optimizer step on each process",
    "precision": "fp32 (TF32 off) | bf16 (autocast) | fp16 (autocast + GradScaler)",
    "checkpointing": "off | full (timm set_grad_checkpointing) | last-<N> (the last N blocks)",
    "optimizer": "adamw | adamw8bit (bitsandbytes) | sgd (momentum 0.9)",
    "channels_last": "model and inputs in channels-last format",
    "warmup_steps": "optimizer steps before measuring",
    "measured_steps": "timed optimizer steps",
    "seed": "seed for weights and synthetic data",
    "world_size": "processes training together (DDP through torchrun, gloo on CPU, NCCL on CUDA); 1: no DDP",
    "ddp_sync": "no_sync (all-reduce on the last micro-step only) | every_step (on every micro-step)",
    "global_batch": "effective_batch x world_size: samples per optimizer step across all processes",
    "loss_tracking": "running loss kept as: detached (tensor) | item (float, host sync) | live_tensor (keeps graphs)",
    "zero_grad": "after the step: none (set_to_none=True) | zeros (gradients kept allocated)",
    "aux_loss": "seed 000's 0.01 x mean(logits**2) term: off | attached | detached",
    "allocator": "CUDA allocator: default | expandable_segments (PYTORCH_CUDA_ALLOC_CONF)",
    "compile": "off | on (torch.compile of the model)",
    "trace_steps": "optimizer steps in the untimed memory trace",
    "device_type": "cuda | cpu",
    "device_name": "torch.cuda.get_device_name() or the CPU model",
    "device_tag": "results folder name for the device",
    "cpu_threads": "torch intra-op threads (per process: the cores shared among the ranks on CPU)",
    "torch_version": "", "timm_version": "", "bitsandbytes_version": "empty if not installed",
    "cuda_version": "torch.version.cuda, empty on a CPU-only build", "python_version": "",
    "git_commit": "commit of the harness that measured the row", "git_dirty": "uncommitted changes present",
    "started_utc": "cell start, ISO 8601 UTC", "duration_s": "wall time of the cell's process",
    "status": "ok | oom | error | timeout | skipped; estimated in estimate files (bench estimate)",
    "error_type": "exception type (oom, error) or reason class", "error_message": "first line of the message",
    "memory_source": "cuda_allocator (max_memory_allocated) | tracked_tensors (MemTracker, CPU); "
                     "estimate_cuda_allocator | estimate_tracked_tensors in estimate files",
    "peak_memory_bytes": "peak_allocated_bytes on CUDA, peak_tracked_bytes on CPU; the largest rank's under DDP",
    "peak_memory_max_rank_bytes": "peak_memory_bytes of the rank that peaked highest (the cell's own for 1 process)",
    "peak_memory_min_rank_bytes": "peak_memory_bytes of the rank that peaked lowest",
    "peak_allocated_bytes": "CUDA max_memory_allocated over the measured steps",
    "peak_reserved_bytes": "CUDA max_memory_reserved over the measured steps",
    "peak_tracked_bytes": "MemTracker peak over one traced step (tracked tensors only)",
    "param_count": "parameter elements (P)",
    "params_bytes": "parameter storage, measured from the tensors",
    "grads_bytes": "gradient storage after backward, measured from the tensors",
    "optimizer_state_bytes": "optimizer state storage, measured from the tensors",
    "activations_peak_bytes": "peak_memory_bytes - params - grads - optimizer state",
    "tracked_params_bytes": "MemTracker category at the traced peak",
    "tracked_buffers_bytes": "", "tracked_grads_bytes": "", "tracked_optimizer_state_bytes": "",
    "tracked_activations_bytes": "", "tracked_temporaries_bytes": "",
    "phase_memory": "JSON [[phase, micro_step, bytes]]: after each forward/backward/optimizer/zero_grad",
    "step_memory": "JSON [[step, phase, micro_step, bytes, weights_version]]: phase_memory for each of the "
                   "trace_steps traced steps; weights_version (the parameters' in-place writes since the "
                   "trace began) changes only when the weights do",
    "kept_graph_nodes": "JSON list per traced step: autograd nodes reachable from the kept running loss",
    "host_rss_bytes": "JSON list per traced step: the process's resident memory after the step",
    "step_times_ms": "JSON list: every measured optimizer step, milliseconds (the slowest rank's under DDP)",
    "step_time_median_ms": "", "step_time_p10_ms": "", "step_time_p90_ms": "",
    "samples_per_s": "effective_batch / median step time: one process's (under DDP, the slowest rank sets each step)",
    "global_samples_per_s": "global_batch / median step time: all processes together",
    "scaling_efficiency": "global_samples_per_s / (world_size x samples_per_s of the 1-process ok row of the same "
                          "configuration in this runs file, filled when the grid ends); empty for 1 process or "
                          "when that row is missing",
    "allreduce_calls_per_step": "gradient-bucket all-reduces per optimizer step (DDP comm hook), per rank",
    "synced_backwards_per_step": "backward passes that all-reduced per optimizer step: 1 with no_sync, K without",
    "allreduce_ms_per_step": "all-reduce launch-to-completion time per optimizer step, summed over buckets; "
                             "the slowest rank's (CUDA events on GPU, wall time on CPU)",
    "model_flops_per_sample": "forward + backward FLOPs without recompute (flop_counter)",
    "hardware_flops_per_sample": "forward + backward FLOPs with checkpoint recompute",
    "peak_flops_per_s": "device dense peak for the precision",
    "peak_flops_source": "datasheet (GPU catalog) or measured (CPU matmul)",
    "mfu_pct": "model FLOPs x samples/s / peak", "hfu_pct": "hardware FLOPs x samples/s / peak",
}


class ResultsFileError(Exception):
    """A runs file this version cannot append to."""


class RunsFile:
    """`results/<experiment>/<device-tag>/runs.csv`; `columns` is the schema (default: the runner's)."""

    def __init__(self, path: Path, columns: dict[str, str] = COLUMNS) -> None:
        self.path = Path(path)
        self.columns = list(columns)

    def rows(self) -> list[dict[str, str]]:
        if not self.path.exists():
            return []
        self._drop_torn_last_line()
        with self.path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            header = reader.fieldnames or []
            unknown = [name for name in header if name not in self.columns]
            if unknown:
                raise ResultsFileError(
                    f"{self.path}: column {unknown[0]!r} is not in this version's schema; "
                    "move the file aside to start afresh"
                )
            filler = {name: _cell_text(extra_axis_defaults().get(name)) for name in self.columns
                      if name not in header}
            return [{**filler, **row} for row in reader]

    def cell_ids(self) -> set[str]:
        return {row["cell_id"] for row in self.rows()}

    def write(self, row: dict) -> None:
        """Append `row`, or replace the earlier row of the same cell."""
        unknown = set(row) - set(self.columns)
        if unknown:
            raise ValueError(f"row has undeclared columns: {sorted(unknown)}")
        existing = self.rows()
        if any(old["cell_id"] == row["cell_id"] for old in existing):
            kept = [old for old in existing if old["cell_id"] != row["cell_id"]]
            self._rewrite(kept + [row])
        elif not self.path.exists() or self._header() != self.columns:
            self._rewrite(existing + [row])
        else:
            self._append(_csv_text([row], self.columns))

    def _header(self) -> list[str]:
        with self.path.open(newline="") as handle:
            return next(csv.reader(handle), [])

    def _append(self, text: str) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def _rewrite(self, rows: list[dict]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".csv.tmp")
        with temporary.open("w", newline="") as handle:
            handle.write(_csv_text(rows, self.columns, header=True))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)

    def _drop_torn_last_line(self) -> None:
        # A kill in the middle of an append can leave a line without its newline.
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            with self.path.open("r+b") as handle:
                handle.truncate(data.rfind(b"\n") + 1)


def _csv_text(rows: list[dict], columns: list[str], header: bool = False) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    if header:
        writer.writeheader()
    for row in rows:
        writer.writerow({key: _cell_text(row.get(key)) for key in columns})
    return buffer.getvalue()


def _cell_text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
