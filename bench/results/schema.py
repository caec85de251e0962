"""The row schemas: every column of every kind of row a runs file holds, with its type and meaning.

`COLUMNS` are the runner's (a measured row); an estimate's, a prediction's and the auto-tuner
answers' extend or stand beside them, and `SCHEMAS` names each kind with the statuses its rows may
have. The CSV header comes from these lists, never from a row; units are in the names. The
configuration columns derive from `bench.grid.cell.Cell`, so a new axis is a new column without an
edit here. Rows are assembled in one place, `bench.results.rows`.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Literal

from bench.grid.cell import PROVENANCE_FIELDS, extra_axis_defaults, field_docs, field_types
from bench.grid.spec import cell_bounds
from bench.results.provenance import PROVENANCE_COLUMNS

ColumnType = Literal["str", "int", "float", "bool", "json"]
Status = Literal["ok", "oom", "error", "timeout", "skipped", "estimated", "predicted"]
STATUSES: tuple[Status, ...] = typing.get_args(Status)


INT64_MAX = 2**63 - 1
"""Largest whole number a typed column holds (pandas' Int64)."""


@dataclass(frozen=True)
class Column:
    type: ColumnType
    """How the text is read: whole number, number, true/false, JSON or text (`bench.results.read`)."""
    doc: str = ""
    minimum: int = 0
    """Smallest whole number allowed (a configuration column: the grid's own bound, `bench.grid.spec.cell_bounds`;
    any other whole number counts something, so is at least 0). Numbers of a `float` column are finite."""
    maximum: int = INT64_MAX
    """Largest whole number allowed."""
    overflow: bool = False
    """A `float` column that may hold inf or nan as a measurement: fp16 without a loss scale overflows."""


def _cell_columns() -> dict[str, Column]:
    """The configuration columns: every `Cell` field, each derived batch right after what it derives from."""
    derived = {"accum_steps": ("effective_batch", "micro_batch x accum_steps: samples per optimizer step on "
                                                  "each process"),
               "ddp_sync": ("global_batch", "effective_batch x world_size: samples per optimizer step across "
                                            "all processes")}
    kinds = {int: "int", bool: "bool", str: "str"}
    bounds = cell_bounds()  # a row holds what a grid may ask for, no more
    columns = {"cell_id": Column("str", "stable id: readable configuration plus a hash of every cell field")}
    for name, doc in field_docs().items():
        columns[name] = Column(kinds.get(field_types()[name], "str"), doc, *bounds.get(name, ()))
        if name in derived:
            columns[derived[name][0]] = Column("int", derived[name][1], *bounds[derived[name][0]])
    return columns


COLUMNS: dict[str, Column] = {
    **_cell_columns(),
    "device_type": Column("str", "cuda | cpu"),
    "device_name": Column("str", "torch.cuda.get_device_name() or the CPU model"),
    "device_tag": Column("str", "results folder name for the device"),
    "cpu_threads": Column("int", "torch intra-op threads (per process: the cores shared among the ranks on CPU); "
                                 "on a CPU the runner's thread budget (affinity, cgroup quota) unless the grid's "
                                 "run.threads or --threads sets it"),
    "cpu_isa": Column("str", "the CPU's speed-relevant ISA features, space-separated (bench.measure.cpu.SPEED_FLAGS); "
                             "empty on a GPU row"),
    "cpu_cores": Column("int", "physical cores of the CPU (empty on a GPU row)"),
    "torch_version": Column("str"), "timm_version": Column("str"),
    "bitsandbytes_version": Column("str", "empty if not installed"),
    "cuda_version": Column("str", "torch.version.cuda, empty on a CPU-only build"), "python_version": Column("str"),
    "git_commit": Column("str", "commit of the harness that measured the row"),
    "git_dirty": Column("bool", "uncommitted changes present"),
    "started_utc": Column("str", "cell start, ISO 8601 UTC"),
    "run_id": Column("str", "the `bench run` (one grid's) that measured the row: its start, UTC, and the runner's "
                            "process id (20261205T132011Z-4821); every rerun of a cell gets a new one. Empty in rows "
                            "measured before 2026-12-05 and in computed rows"),
    "duration_s": Column("float", "wall time of the cell's process"),
    "status": Column("str", "ok | oom | error | timeout | skipped; estimated in estimate files (bench estimate), "
                            "predicted in prediction files (bench predict)"),
    "error_type": Column("str", "exception type (oom, error) or reason class"),
    "error_message": Column("str", "first line of the message"),
    "memory_source": Column("str", "cuda_allocator (max_memory_allocated) | tracked_tensors (MemTracker, CPU); "
                                   "estimate_cuda_allocator | estimate_tracked_tensors in estimate files"),
    "peak_memory_bytes": Column("int", "peak_allocated_bytes on CUDA, peak_tracked_bytes on CPU; the largest "
                                       "rank's under DDP"),
    "peak_memory_max_rank_bytes": Column("int", "peak_memory_bytes of the rank that peaked highest (the cell's "
                                                "own for 1 process)"),
    "peak_memory_min_rank_bytes": Column("int", "peak_memory_bytes of the rank that peaked lowest"),
    "peak_allocated_bytes": Column("int", "CUDA max_memory_allocated over the measured steps"),
    "peak_reserved_bytes": Column("int", "CUDA max_memory_reserved over the measured steps"),
    "expandable_segments": Column("bool", "CUDA: whether the caching allocator ran with expandable segments, from "
                                          "its snapshot (torch.cuda.memory._snapshot); empty on CPU"),
    "peak_tracked_bytes": Column("int", "MemTracker peak over one traced step (tracked tensors only)"),
    "param_count": Column("int", "parameter elements (P)"),
    "params_bytes": Column("int", "parameter storage, measured from the tensors"),
    "grads_bytes": Column("int", "gradient storage after backward, measured from the tensors"),
    "optimizer_state_bytes": Column("int", "optimizer state storage, measured from the tensors"),
    "activations_peak_bytes": Column("int", "peak_memory_bytes - params - grads - optimizer state: everything else "
                                            "the peak holds (activations, temporaries; on CUDA also inputs and "
                                            "library workspaces); see activations_saved_bytes and the tracked_* "
                                            "columns for what it is made of"),
    "activations_saved_bytes": Column("int", "activation tensors alive at the end of the traced step's last forward: "
                                             "what one micro-batch's forward saved for backward (MemTracker)"),
    "untracked_bytes": Column("int", "CUDA: peak_allocated_bytes - peak_tracked_bytes, what the allocator held "
                                     "beyond the tensors the trace saw (the input batch, cuBLAS/cuDNN workspaces); "
                                     "empty on CPU"),
    "tracked_params_bytes": Column("int", "MemTracker category at the traced peak"),
    "tracked_buffers_bytes": Column("int"), "tracked_grads_bytes": Column("int"),
    "tracked_optimizer_state_bytes": Column("int"), "tracked_activations_bytes": Column("int"),
    "tracked_temporaries_bytes": Column("int"),
    "phase_memory": Column("json", "[[phase, micro_step, bytes]]: after each forward/backward/optimizer/zero_grad"),
    "step_memory": Column("json", "[[step, phase, micro_step, bytes, weights_version]]: phase_memory for each of "
                                  "the trace_steps traced steps; weights_version (the parameters' in-place writes "
                                  "since the trace began) changes only when the weights do"),
    "kept_graph_nodes": Column("json", "list per traced step: autograd nodes reachable from the kept running loss"),
    "host_rss_bytes": Column("json", "list per traced step: the process's resident memory after the step"),
    "grad_norm": Column("float", "L2 norm of all gradients as the first traced step's optimizer update uses them "
                                 "(after DDP's all-reduce): equal across splits of the same model, data and "
                                 "weights when accumulation is exact; inf or nan when fp16 gradients overflowed",
                        overflow=True),
    "step_times_ms": Column("json", "list: every measured optimizer step, milliseconds (the slowest rank's under "
                                    "DDP)"),
    "step_time_median_ms": Column("float"), "step_time_p10_ms": Column("float"), "step_time_p90_ms": Column("float"),
    "step_time_ci95_low_ms": Column("float", "95 % bootstrap interval of the median step time, low end (2,000 "
                                             "resamples of the timed steps, fixed seed); empty under 5 steps"),
    "step_time_ci95_high_ms": Column("float", "the same interval's high end"),
    "step_time_ci95_rel": Column("float", "the interval's width over the median: the row's dispersion figure"),
    "noisy": Column("bool", "step_time_ci95_rel above 0.10 (bench.measure.step_stats.NOISY_CI95_REL): such a cell is "
                            "measured once more in a fresh process and the narrower measurement kept (not in a grid "
                            "of exactly its steps, adaptive_timing = false); empty under 5 steps"),
    "remeasured": Column("bool", "the first measurement was noisy and the cell ran again; the columns hold the "
                                 "narrower of the two, discarded_* the other"),
    "discarded_step_times_ms": Column("json", "the other measurement's step times, when remeasured"),
    "discarded_ci95_rel": Column("float", "the other measurement's dispersion, when remeasured"),
    "load_avg_1m": Column("float", "the host's 1-minute load average when the cell started (os.getloadavg)"),
    "load_avg_1m_after": Column("float", "the same when the cell ended"),
    "quiet_wait_s": Column("float", "seconds the runner waited for other work to leave the cell's cores free before "
                                    "measuring (at most run.quiet_wait_s)"),
    "foreign_load_cores": Column("float", "cores other processes kept busy while the steps were timed: /proc/stat's "
                                          "busy time less the cell's own process tree's, over the wall time; empty "
                                          "under DDP"),
    "loaded": Column("bool", "foreign_load_cores took more than the cores the cell's threads leave free (+0.25, "
                             "bench.measure.host.QUIET_SLACK_CORES): the timing shared the machine"),
    "warmup_steps_run": Column("int", "warm-up steps taken before the trace and the timing: at least run.warmup_steps, "
                                      "then until a step's time is within 10 % of the one before"),
    "ci95_target_rel": Column("float", "the width of the median's 95 % interval the timing stopped at (run."
                                       "target_ci95_rel); empty: a fixed count of run.measured_steps (DDP)"),
    "ci95_target_met": Column("bool", "the timing reached ci95_target_rel within run.timing_budget_s"),
    "cpu_steal_pct": Column("float", "CPU time stolen by the hypervisor while the cell ran, % of all CPU time "
                                     "(/proc/stat); empty where unreadable"),
    "reference_flops_per_s_before": Column("float", "the CPU's speed just before the timed steps on a fixed "
                                                    "workload (median FLOP/s of fp32 512x512 matmuls over 0.1 s, "
                                                    "0.25 s in rows before 2026-12-05; the cell's threads): rows "
                                                    "whose figures differ show the machine itself ran faster or "
                                                    "slower; empty on CUDA and under DDP"),
    "reference_flops_per_s_after": Column("float", "the same, just after the timed steps"),
    "samples_per_s": Column("float", "effective_batch / median step time: one process's (under DDP, the slowest "
                                     "rank sets each step)"),
    "global_samples_per_s": Column("float", "global_batch / median step time: all processes together"),
    "scaling_efficiency": Column("float", "global_samples_per_s / (world_size x samples_per_s of the 1-process ok "
                                          "row of the same configuration in this runs file), computed when the "
                                          "file is read (bench.results.derived; never written); empty for 1 "
                                          "process or when that row is missing"),
    "allreduce_calls_per_step": Column("float", "gradient-bucket all-reduces per optimizer step (DDP comm hook), "
                                                "per rank"),
    "synced_backwards_per_step": Column("float", "backward passes that all-reduced per optimizer step: 1 with "
                                                 "no_sync, K without"),
    "allreduce_ms_per_step": Column("float", "all-reduce launch-to-completion time per optimizer step, summed over "
                                             "buckets; the slowest rank's (CUDA events on GPU, wall time on CPU)"),
    "model_flops_per_sample": Column("float", "forward + backward FLOPs without recompute (flop_counter)"),
    "hardware_flops_per_sample": Column("float", "forward + backward FLOPs with checkpoint recompute"),
    "peak_flops_per_s": Column("float", "device dense peak for the precision"),
    "peak_flops_source": Column("str", "datasheet (GPU catalog) or measured (CPU matmul)"),
    "mfu_pct": Column("float", "model FLOPs x samples/s / peak"),
    "hfu_pct": Column("float", "hardware FLOPs x samples/s / peak"),
    # The input pipeline: rows of input = loader | loader_gpu_decode (empty for synthetic input).
    "input_wait_ms": Column("json", "list: every measured step's wait for its K micro-batches, milliseconds (host "
                                    "time from asking the loader until each batch is on the device, summed)"),
    "input_wait_median_ms": Column("float"), "input_wait_p90_ms": Column("float"),
    "input_wait_pct": Column("float", "median input wait / median step time x 100"),
    "input_bound": Column("bool", "the median step waits >= 5 % of its time for input, or the loader alone is "
                                  "slower than the step without its wait"),
    "loader_samples_per_s": Column("float", "the loader alone after training, same workers, batches fetched onto "
                                            "the device, no model: median of the repeats"),
    "loader_samples_per_s_min": Column("float"), "loader_samples_per_s_max": Column("float"),
    "loader_cpu_ms_per_sample": Column("float", "CPU time (user + system) of the training process and its workers "
                                                "per sample while the loader ran alone: the feeding cost per sample"),
    "synthetic_samples_per_s": Column("float", "samples_per_s of the same configuration's synthetic-input ok row in "
                                               "this runs file, computed when the file is read (bench.results."
                                               "derived; never written); empty when there is none"),
    "host_rss_main_bytes": Column("int", "resident memory of the training process after the timed steps"),
    "host_rss_workers_bytes": Column("int", "resident memory of the loader workers, summed (shared pages counted in "
                                            "each)"),
    "host_pss_total_bytes": Column("int", "proportional memory of the training process and its workers together "
                                          "(shared pages split: no double counting)"),
    "pinned_peak_bytes": Column("int", "peak page-locked host memory of CUDA's host allocator (pinned batches); 0 "
                                       "on CPU"),
    "host_cpu_model": Column("str", "the CPU that decoded (/proc/cpuinfo model name)"),
    "host_cpus": Column("int", "cores the cell could run on (its affinity)"),
    "data_source": Column("str", "generated (the ImageNet-like set, bench data make) | dir (--data-dir)"),
    "data_set": Column("str", "the generated set's name (spec and digest) or the --data-dir path"),
    "data_images": Column("int", "images in the data set"),
    "data_bytes": Column("int", "bytes of its image files"),
    "data_seed": Column("int", "seed of the generated set; empty for a --data-dir"),
}

ESTIMATE_COLUMNS: dict[str, Column] = {
    **COLUMNS,
    "estimate_inputs_bytes": Column("int", "input micro-batch on the device (in peak_allocated_bytes, not in "
                                           "peak_tracked_bytes)"),
    "estimate_workspace_bytes": Column("int", "cuBLAS/cuBLASLt workspace allowance in peak_allocated_bytes "
                                              "(CUDA estimates)"),
    "tracked_autocast_cache_bytes": Column("int", "autocast's low-precision weight copies (its weight-cast cache) at the "
                                                  "traced peak: a category of its own, inside peak_tracked_bytes and "
                                                  "activations_peak_bytes, not inside tracked_activations_bytes"),
    "estimate_attention": Column("str", "the attention kernel the estimate assumed: eager (probabilities kept), "
                                        "flash or efficient (CUDA SDPA's fused kernels), math, or cpu"),
    "fits_gpus": Column("str", "catalog GPUs (bench/data/gpus.csv) whose memory holds peak_reserved_bytes + the "
                               "cost planner's headroom; ';'-separated, CUDA estimates only"),
    "estimate_method": Column("str", "what the estimate models and what it does not"),
}
"""An estimate's row (`bench estimate`, status estimated): the runner's columns, the peak computed on fake tensors,
and what only an estimate has."""

PREDICTED_COLUMNS: dict[str, Column] = {
    **ESTIMATE_COLUMNS,
    "gpu": Column("str", "catalog key of the GPU predicted for (bench/data/gpus.csv)"),
    "predicted_step_time_ms": Column("float", "predicted optimizer step: max(GPU time, host dispatch time)"),
    "predicted_gpu_ms": Column("float", "sum of the ops' roofline times and per-kernel costs"),
    "predicted_host_ms": Column("float", "ops dispatched x the host's measured cost per op"),
    "predicted_compute_ms": Column("float", "time of the ops bound by tensor work (FLOPs over peak, whole waves)"),
    "predicted_memory_ms": Column("float", "time of the ops bound by memory bandwidth"),
    "predicted_non_tensor_ms": Column("float", "time of the ops bound by non-tensor work (SMs x clock)"),
    "predicted_kernel_overhead_ms": Column("float", "fixed per-kernel cost, all kernels"),
    "predicted_bound": Column("str", "compute | memory | non-tensor | overhead (per-kernel cost or host dispatch): "
                                     "what sets the predicted step"),
    "op_mix": Column("str", "matmul | conv | grouped-conv: what the step's compute FLOPs are mostly "
                            "(bench.speed.model.mix_of); with the kind of GPU, the validation slice whose error applies"),
    "samples_per_s_low": Column("float", "samples_per_s / the upper end of the 80 % band of predicted/measured "
                                         "(held-out validation slice of this kind of GPU and op mix; its "
                                         "percentiles split-conformal over GPUs, docs/speed.md)"),
    "samples_per_s_high": Column("float", "samples_per_s / the lower end of the same band"),
    "speed_model_version": Column("str", "version of bench/data/speed_params.json"),
    "speed_basis": Column("str", "predicted (model vX, leave-one-GPU-out, <slice>: median error Y %, p90 Z %, "
                                 "N rows)"),
}
"""A prediction's row (`bench predict`, status predicted), one per cell and GPU: an estimate's columns and the
throughput model's."""

AUTOTUNE_COLUMNS: dict[str, Column] = {
    "cell_id": Column("str", "probe-<model>-<size>px-<precision>-<optimizer>-<gpu>"),
    "gpu": Column("str", "catalog GPU key"), "model": Column("str"), "image_size": COLUMNS["image_size"],
    "precision": Column("str"), "checkpointing": Column("str"), "optimizer": Column("str"),
    "budget_bytes": Column("int", "the GPU's nominal memory"),
    "largest_micro_batch": Column("int", "the estimator's largest micro-batch within the budget, no headroom"),
    "fake_steps": Column("int", "estimator trials the search took"),
    "status": Column("str", "estimated"), "error_message": Column("str"),
    "device_type": Column("str"), "device_name": Column("str"),
    "torch_version": Column("str"), "git_commit": Column("str"),
    **{name: Column("bool" if name == "git_dirty" else "str") for name in PROVENANCE_COLUMNS
       if name not in ("torch_version", "git_commit")},
    "started_utc": Column("str"),
}
"""The memory estimator's largest micro-batch per (GPU, precision, checkpointing): seed 002's claims table
(`bench.claims.autotune`)."""

PEAK_COLUMNS: dict[str, Column] = {
    "device_tag": Column("str"), "device_name": Column("str"),
    "threads": Column("int", "intra-op threads the matmul ran with", minimum=1),
    "precision": Column("str"), "flops_per_s": Column("float", "the fastest matmul call's FLOP/s"),
    "matrix_side": Column("int", "side of the square matrices multiplied", minimum=1),
    "rounds": Column("int", minimum=1), "seconds_per_round": Column("float"),
    "measured_utc": Column("str"), "torch_version": Column("str"),
    "foreign_load_cores": Column("float", "cores other processes kept busy meanwhile (empty: unrecorded)"),
}
"""A CPU's stored matmul peak per thread count and precision (`<root>/peaks/<device-tag>/peaks.csv`,
`bench.results.peaks`): what the rows measured on it divide by for MFU."""

RowKind = Literal["measured", "estimated", "predicted", "autotune"]


@dataclass(frozen=True)
class RowSchema:
    """A kind of row: its columns, the statuses its rows may have, what names a row, and how a file of them grows."""

    kind: RowKind
    columns: dict[str, Column]
    statuses: tuple[Status, ...]
    """Outcomes a row of this kind may have: a computed row is never `ok`, so never read as a measurement."""
    key: tuple[str, ...] = ("cell_id",)
    """The columns that name a row: a later row with the same values replaces it."""
    history: bool = False
    """Rows are appended, a replacing one too (a measurement is never overwritten); otherwise a file of computed
    rows, recomputed whole, replaces a row in place."""


FAILURES: tuple[Status, ...] = ("oom", "error", "skipped")
SCHEMAS: dict[RowKind, RowSchema] = {
    "measured": RowSchema("measured", COLUMNS, ("ok", *FAILURES, "timeout"), history=True),
    "estimated": RowSchema("estimated", ESTIMATE_COLUMNS, ("estimated", *FAILURES)),
    "predicted": RowSchema("predicted", PREDICTED_COLUMNS, ("predicted", *FAILURES), key=("cell_id", "gpu")),
    "autotune": RowSchema("autotune", AUTOTUNE_COLUMNS, ("estimated",)),
}
"""Every kind of row a runs file holds. A file's kind follows from its header (`schema_for_header`), never from
the folder it lies in."""


def schema_for_header(header: list[str]) -> RowSchema:
    """The kind of row a file with this header holds: the first schema of `SCHEMAS` that has every column of it
    (an estimate's columns include the runner's, a prediction's an estimate's: each holds a column the one before
    lacks); the runner's when none has them all, so the reader names the unknown column.

    >>> schema_for_header(["cell_id", "status", "samples_per_s"]).kind
    'measured'
    >>> schema_for_header(["cell_id", "status", "estimate_method"]).kind, schema_for_header(["gpu", "speed_basis"]).kind
    ('estimated', 'predicted')
    >>> schema_for_header(["cell_id", "largest_micro_batch"]).kind
    'autotune'
    """
    return next((schema for schema in SCHEMAS.values() if set(header) <= set(schema.columns)), SCHEMAS["measured"])


REQUIRED_COLUMNS: tuple[str, ...] = ("cell_id", *(name for name in field_docs()
                                                  if name not in (*extra_axis_defaults(), *PROVENANCE_FIELDS)),
                                     "device_type", "device_name", "status")
"""Columns every runs file has had since the first version: a file without one is not a runs file."""
