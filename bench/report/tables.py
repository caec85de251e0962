"""Report tables: the per-cell table and "what accumulation costs", as DataFrames and markdown."""

from __future__ import annotations

import json

import pandas as pd

from bench.measure.step_stats import MIN_STEPS_FOR_SPREAD, rate_change_interval
from bench.report.rows import (
    PRECISION_ORDER,
    ordered,
    pair_label,
    reference_optimizer,
    timing_flags,
    variant_labels,
)
from bench.results.keys import SPLIT, configuration_key, sort_key, varying
from bench.units import GIB, byte_unit


def cell_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per cell, rounded, units in the headers; the step time's spread and a noisy mark beside it."""
    scale, unit = _memory_unit(rows.peak_memory_bytes)

    def memory(column: str) -> pd.Series:
        return (rows[column].astype("Float64") / scale).round(3)
    variants = variant_labels(rows)
    return pd.DataFrame({
        "model": rows.model,
        "image (px)": rows.image_size,
        "micro×K": [pair_label(m, k) for m, k in zip(rows.micro_batch, rows.accum_steps)],
        "precision": rows.precision,
        "ckpt": rows.checkpointing,
        "optimizer": rows.optimizer,
        **({"variant": variants} if (variants != "").any() else {}),
        "status": rows.status,
        f"peak ({unit})": memory("peak_memory_bytes"),
        f"reserved ({unit})": memory("peak_reserved_bytes"),
        f"saved activations ({unit})": memory("activations_saved_bytes"),
        f"optimizer state ({unit})": memory("optimizer_state_bytes"),
        "step (ms)": rows.step_time_median_ms.round(1),
        "±95 % (%)": [spread_text(row) for row in rows.itertuples()],
        "samples/s": rows.samples_per_s.round(2),
        "MFU (%)": rows.mfu_pct.round(2),
        "HFU (%)": rows.hfu_pct.round(2),
        "load (1 min)": rows.load_avg_1m.round(2),
        # rows measured before the quiet guard have no foreign load: the column appears once a row has one
        **({"other load (cores)": rows.foreign_load_cores.round(2)}
           if "foreign_load_cores" in rows and rows.foreign_load_cores.notna().any() else {}),
        **({"machine (GFLOP/s)": (machine_speed(rows) / 1e9).round(1)} if machine_speed(rows).notna().any() else {}),
    })


def machine_speed(rows: pd.DataFrame) -> pd.Series:
    """Each row's reference-matmul speed, the mean of its probes before and after the timed steps (empty for rows
    measured without them: on CUDA, under DDP, or before the probe existed)."""
    probes = rows[[column for column in PROBE_COLUMNS if column in rows]].astype("Float64")
    return probes.mean(axis=1, skipna=True).astype("Float64") if not probes.empty else pd.Series(
        pd.NA, index=rows.index, dtype="Float64")


PROBE_COLUMNS = ("reference_flops_per_s_before", "reference_flops_per_s_after")


def machine_speed_note(rows: pd.DataFrame) -> str | None:
    """How far the machine's own speed moved across the rows, as the reader must weigh differences between cells
    (each row's interval covers only its own steps); None when fewer than two rows carry the probe.

    >>> rows = pd.DataFrame({"reference_flops_per_s_before": [100e9, 80e9, 90e9],
    ...                      "reference_flops_per_s_after": [100e9, 80e9, 110e9]})
    >>> print(machine_speed_note(rows))  # doctest: +NORMALIZE_WHITESPACE
    **The machine's own speed.** A fixed workload (fp32 512×512 matmuls with the cells' threads, their median
    call) timed just before and just after each cell's steps ran at 80.0 to 110.0 GFLOP/s (median 95.0) over 6
    probes in 3 rows: a spread of 32 % of the median. Each row's ±95 % interval covers its own steps only; a
    difference between two cells smaller than this spread may be the machine, not the configuration.
    """
    columns = [column for column in PROBE_COLUMNS if column in rows]
    probes = pd.concat([rows[column] for column in columns]).astype("Float64").dropna() if columns else pd.Series()
    carrying = int(machine_speed(rows).notna().sum())
    if carrying < 2:
        return None
    low, high, median = probes.min() / 1e9, probes.max() / 1e9, probes.median() / 1e9
    return ("**The machine's own speed.** A fixed workload (fp32 512×512 matmuls with the cells' threads, their median "
            f"call) timed just before and just after each cell's steps ran at {low:.1f} to {high:.1f} GFLOP/s (median "
            f"{median:.1f}) over {len(probes)} probes in {carrying} rows: a spread of "
            f"{100 * (high - low) / median:.0f} % of the median. Each row's ±95 % interval covers its own steps "
            "only; a difference between two cells smaller than this spread may be the machine, not the configuration.")


def spread_text(row) -> str:
    """`±4.1` (half the 95 % interval of the median step time, % of it), `±12.0 NOISY`, or why none."""
    if row.status != "ok":
        return ""
    if pd.isna(row.step_time_ci95_rel):
        return f"n={len(json.loads(row.step_times_ms)) if row.step_times_ms else 0}, not stated"
    text = f"±{50 * row.step_time_ci95_rel:.1f}"
    return (text + (" NOISY" if _true(row.noisy) else "") + (" LOADED" if _true(getattr(row, "loaded", None)) else "")
            + (" (remeasured)" if _true(row.remeasured) else ""))


def _true(flag: object) -> bool:
    """A nullable boolean column's value: True only when it is set and true."""
    return bool(pd.notna(flag) and flag)


def _memory_unit(values: pd.Series) -> tuple[float, str]:
    return byte_unit(pd.to_numeric(values, errors="coerce").max())


def accumulation_cost(rows: pd.DataFrame) -> pd.DataFrame:
    """Per configuration: the large-batch end against the most-accumulated end.

    Compared at checkpointing off (when measured) with the reference optimizer, and only between
    rows whose configuration key (`bench.results.keys`) and effective batch agree, so only the
    micro-batch/accumulation split differs between the two cells. Where the compared
    configurations differ in more than model and precision, a column per such axis says how.
    """
    optimizer = reference_optimizer(rows)
    subset = rows[rows.optimizer == optimizer]
    if (subset.checkpointing == "off").any():
        subset = subset[subset.checkpointing == "off"]
    groups: dict[tuple, list] = {}
    for label, row in zip(subset.index, subset.to_dict("records")):
        key = configuration_key(row, ignore=SPLIT)
        groups.setdefault((key, int(row["micro_batch"]) * int(row["accum_steps"])), []).append(label)
    shown = ("model", "precision", "optimizer")
    extra = [name for name in varying(key for key, _ in groups) if name not in shown]
    batches = {batch for _, batch in groups}
    lines = []
    for model in sorted(set(subset.model)):
        for precision in ordered(subset[subset.model == model].precision, PRECISION_ORDER):
            chosen = sorted(((key, batch) for key, batch in groups
                             if dict(key)["model"] == model and dict(key)["precision"] == precision),
                            key=lambda item: (*sort_key(item[0]), item[1]))
            for key, batch in chosen:
                cells = subset.loc[groups[key, batch]]
                large, accumulated = cells.loc[cells.accum_steps.idxmin()], cells.loc[cells.accum_steps.idxmax()]
                if large.cell_id == accumulated.cell_id:
                    continue
                apart = {name: dict(key)[name] for name in extra}
                if len(batches) > 1:
                    apart["effective batch"] = batch
                lines.append(_compare(model, precision, optimizer, large, accumulated, apart))
    return pd.DataFrame(lines)


def _compare(model: str, precision: str, optimizer: str, large: pd.Series, accumulated: pd.Series,
             apart: dict) -> dict:
    both_ok = large.status == "ok" and accumulated.status == "ok"

    def change_pct(column: str) -> float | None:
        return round(100 * (large[column] - accumulated[column]) / large[column], 1) if both_ok else None

    def value(row: pd.Series, column: str, digits: int, scale: float = 1.0) -> object:
        return round(row[column] / scale, digits) if row.status == "ok" else row.status

    return {
        "model": model, "precision": precision, "optimizer": optimizer, **apart,
        "large batch": pair_label(large.micro_batch, large.accum_steps),
        "accumulated": pair_label(accumulated.micro_batch, accumulated.accum_steps),
        "peak large (GiB)": value(large, "peak_memory_bytes", 3, GIB),
        "peak accumulated (GiB)": value(accumulated, "peak_memory_bytes", 3, GIB),
        "memory saved (%)": change_pct("peak_memory_bytes"),
        "throughput lost (%)": change_pct("samples_per_s"),
        "95 % interval (%)": _lost_interval(large, accumulated) if both_ok else None,
        "MFU large (%)": value(large, "mfu_pct", 2),
        "MFU accumulated (%)": value(accumulated, "mfu_pct", 2),
        "flags": "; ".join(f"{end} {flags}" for end, row in (("large", large), ("accumulated", accumulated))
                           if (flags := timing_flags(row))),
    }


def _lost_interval(large: pd.Series, accumulated: pd.Series) -> str:
    """The 95 % bootstrap interval of the throughput lost, from both cells' timed steps."""
    times = [json.loads(row.step_times_ms) if row.step_times_ms else [] for row in (large, accumulated)]
    if min(len(steps) for steps in times) < MIN_STEPS_FOR_SPREAD:
        return f"not stated (n < {MIN_STEPS_FOR_SPREAD})"
    _, low, high = rate_change_interval(times[0], times[1], int(large.effective_batch), int(accumulated.effective_batch))
    return f"{100 * low:.1f} to {100 * high:.1f}"


def data_parallel(rows: pd.DataFrame) -> pd.DataFrame:
    """The DDP columns of every cell that has a world size (empty when none ran on several processes)."""
    if "world_size" not in rows or not (rows.world_size > 1).any():
        return pd.DataFrame()
    return pd.DataFrame({
        "model": rows.model,
        "micro×K": [pair_label(m, k) for m, k in zip(rows.micro_batch, rows.accum_steps)],
        "processes": rows.world_size,
        "sync": rows.ddp_sync.where(rows.world_size > 1, "-"),
        "status": rows.status,
        "peak per rank, max (GiB)": (rows.peak_memory_max_rank_bytes / GIB).round(3),
        "global samples/s": rows.global_samples_per_s.round(2),
        "scaling efficiency": rows.scaling_efficiency.round(3),
        "all-reduces per step": rows.allreduce_calls_per_step,
        "all-reduce (ms/step)": rows.allreduce_ms_per_step.round(1),
        "flags": [timing_flags(row) for _, row in rows.iterrows()],
    })


ESTIMATE_COMPARED = ["cell_id", "peak_memory_bytes", "peak_reserved_bytes", "memory_source"]


def estimate_vs_measured(measured: pd.DataFrame, estimated: pd.DataFrame) -> pd.DataFrame:
    """One line per cell measured `ok` and `estimated` (same grid and profile, so the same ids),
    with the predicted / measured ratios of peak and reserved memory.

    >>> m = pd.DataFrame({"cell_id": ["a"], "status": ["ok"], "peak_memory_bytes": [100],
    ...                   "peak_reserved_bytes": [120], "memory_source": ["cuda_allocator"]})
    >>> e = m.assign(status="estimated", peak_memory_bytes=105, peak_reserved_bytes=110)
    >>> estimate_vs_measured(m, e).peak_ratio.tolist()
    [1.05]
    """
    joined = measured[measured.status == "ok"][ESTIMATE_COMPARED].merge(
        estimated[estimated.status == "estimated"][ESTIMATE_COMPARED], on="cell_id",
        suffixes=("_measured", "_estimated"))
    joined["peak_ratio"] = joined.peak_memory_bytes_estimated / joined.peak_memory_bytes_measured
    joined["reserved_ratio"] = joined.peak_reserved_bytes_estimated / joined.peak_reserved_bytes_measured
    joined["within_10pct"] = (joined.peak_ratio - 1).abs() <= 0.10
    return joined


def format_pairs(measured: pd.DataFrame, estimated: pd.DataFrame, predicted: pd.DataFrame) -> pd.DataFrame:
    """Channels-last over NCHW, one line per configuration measured `ok` in both memory formats: the measured peak,
    reserved peak and samples/s beside the estimator's peaks (`estimated`) and the throughput model's samples/s
    (`predicted`: rows of the measured device's GPU). A ratio whose two rows are not both there is empty; no
    configuration measured both ways, no lines.

    >>> cell = {"model": "m", "image_size": 224, "precision": "fp16", "checkpointing": "off", "optimizer": "sgd",
    ...         "micro_batch": 64, "accum_steps": 1}
    >>> m = pd.DataFrame([{**cell, "channels_last": cl, "status": "ok", "peak_memory_bytes": peak,
    ...                    "peak_reserved_bytes": None, "samples_per_s": speed}
    ...                   for cl, peak, speed in ((False, 100, 10.0), (True, 120, 15.0))])
    >>> e = m.assign(status="estimated", peak_memory_bytes=[110, 111], samples_per_s=None)
    >>> p = m.assign(status="predicted", samples_per_s=[10.0, 12.0])
    >>> line = format_pairs(m, e, p).iloc[0]
    >>> [float(line[name]) for name in ("peak CL/NCHW", "estimated", "samples/s CL/NCHW", "predicted")]
    [1.2, 1.009, 1.5, 1.2]
    >>> "reserved CL/NCHW" in line  # no reserved peak measured (a CPU row): no column
    False
    """
    def by_format(frame: pd.DataFrame, status: str) -> dict[tuple, dict[bool, dict]]:
        pairs: dict[tuple, dict[bool, dict]] = {}
        for row in frame[frame.status == status].to_dict("records") if len(frame) else []:
            channels_last = bool(dict(configuration_key(row))["channels_last"])
            pairs.setdefault(configuration_key(row, ignore=("channels_last",)), {})[channels_last] = row
        return pairs

    def ratio(pair: dict[bool, dict] | None, column: str) -> float | None:
        if not pair or len(pair) < 2:
            return None
        nchw, cl = (pd.to_numeric(pair[channels_last].get(column), errors="coerce") for channels_last in (False, True))
        return round(float(cl / nchw), 3) if pd.notna(nchw) and pd.notna(cl) and nchw > 0 else None

    measured_pairs = {key: pair for key, pair in by_format(measured, "ok").items() if len(pair) == 2}
    estimated_pairs, predicted_pairs = by_format(estimated, "estimated"), by_format(predicted, "predicted")
    lines = []
    for key, pair in measured_pairs.items():
        nchw, estimate = pair[False], estimated_pairs.get(key)
        lines.append({
            "model": nchw["model"], "image (px)": nchw["image_size"],
            "micro×K": pair_label(nchw["micro_batch"], nchw["accum_steps"]), "precision": nchw["precision"],
            "optimizer": nchw["optimizer"], "peak NCHW (GiB)": round(float(nchw["peak_memory_bytes"]) / GIB, 3),
            "peak CL/NCHW": ratio(pair, "peak_memory_bytes"), "estimated": ratio(estimate, "peak_memory_bytes"),
            "reserved CL/NCHW": ratio(pair, "peak_reserved_bytes"),
            "estimated reserved": ratio(estimate, "peak_reserved_bytes"),
            "samples/s NCHW": round(float(nchw["samples_per_s"]), 2),
            "samples/s CL/NCHW": ratio(pair, "samples_per_s"),
            "predicted": ratio(predicted_pairs.get(key), "samples_per_s"),
        })
    table = pd.DataFrame(lines)
    return table.dropna(axis=1, how="all") if len(table) else table


def predicted_accumulation_cost(estimates: pd.DataFrame) -> pd.DataFrame:
    """The estimator's answer to "what accumulation costs" for the grid as written (its CUDA profile):
    predicted peak memory at the large-batch end and the most-accumulated end, per model and precision.

    Memory only: an estimate has no time.
    """
    if estimates.empty:
        return pd.DataFrame()
    cuda = estimates[(estimates.profile == "cuda")].assign(
        status=lambda frame: frame.status.replace({"estimated": "ok"}))
    if cuda.empty:
        return pd.DataFrame()
    table = accumulation_cost(cuda)
    if table.empty:
        return table
    table = table.drop(columns=["throughput lost (%)", "95 % interval (%)", "MFU large (%)", "MFU accumulated (%)",
                                "flags"])
    if "image_size" in table:  # the configurations compared differ in size: each line has its own
        table.insert(1, "image (px)", table.pop("image_size").astype(int))
    else:
        sizes = cuda.groupby("model").image_size.first()
        table.insert(1, "image (px)", [int(sizes[model]) for model in table.model])
    return table.rename(columns={"peak large (GiB)": "predicted peak large (GiB)",
                                 "peak accumulated (GiB)": "predicted peak accumulated (GiB)",
                                 "memory saved (%)": "predicted memory saved (%)"})


def cpu_profile_banner(rows: pd.DataFrame) -> str:
    """What a CPU-profile folder can and cannot show, in one paragraph."""
    sizes = ", ".join(f"{int(size)} px" for size in sorted(set(rows.image_size)))
    batches = ", ".join(str(int(batch)) for batch in sorted(set(rows.effective_batch)))
    return (f"**CPU profile: the mechanisms, not the GPU answer.** These rows were measured on a CPU at {sizes} "
            f"and effective batch {batches}, the grid's smaller CPU profile. At that size parameters, gradients and "
            "optimizer state set the peak, so splitting the batch barely moves it; and a CPU has no tensor cores, "
            "no kernel-launch cost and no caching allocator, so its timings say nothing about a GPU's (and they vary "
            "with the CPU model and its load). What these rows do show: what is allocated when inside a step, "
            "what each optimizer keeps, how the step scales with K. The question the study asks, at the grid's "
            "real size on a GPU, is answered below by the memory estimator (predicted, no device ran it).")


def run_to_run(every_row: pd.DataFrame) -> pd.DataFrame:
    """One line per measurement of a cell measured ok more than once (`bench run --force`, a rerun into the same
    folder): the run that measured it (`run_id`; rows measured before run ids say so), its samples/s with the
    interval its own steps give (the 95 % interval of the median step), the spread between the cell's measurements
    (slowest over fastest), and whether they disagree beyond their own spreads (their intervals do not overlap): a
    figure such measurements give is not one number, whichever row the other tables show (the last)."""
    ok = every_row[every_row.status == "ok"]
    repeated = ok[ok.cell_id.duplicated(keep=False)]
    lines = []
    for cell_id, runs in repeated.groupby("cell_id", sort=True):
        speed = runs.samples_per_s.astype(float)
        # samples/s is the effective batch over the median step: its interval is the step interval's, inverted
        low = speed * runs.step_time_median_ms / runs.step_time_ci95_high_ms
        high = speed * runs.step_time_median_ms / runs.step_time_ci95_low_ms
        disagree = bool(low.max() > high.min()) if low.notna().all() and high.notna().all() else None
        for (_, run), lo, hi in zip(runs.iterrows(), low, high):
            run_id = run.get("run_id")
            lines.append({"cell": cell_id, "run": run_id if isinstance(run_id, str) and run_id else "before run ids",
                          "started (UTC)": run.started_utc,
                          "samples/s": round(float(run.samples_per_s), 2),
                          "own 95 % interval": "" if pd.isna(lo) else f"{lo:.2f} to {hi:.2f}",
                          "between runs (slowest / fastest)": round(float(speed.min() / speed.max()), 3),
                          "runs disagree": {True: "yes: beyond their spreads", False: "no", None: "unknown"}[disagree],
                          "flags": timing_flags(run)})
    return pd.DataFrame(lines)

