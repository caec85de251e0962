"""The device's peak FLOP/s for a precision: datasheet on a known GPU, measured once on a CPU.

A CPU has no datasheet peak worth dividing by, so its peak is measured: the best of several
rounds of a large matmul per precision, once per device and thread count, and stored with its
date and the foreign load it was measured under in `<results>/peaks/<device-tag>/peaks.csv`. Every
results folder measured on that device then divides by the same number; a stored peak measured under
load (or before the load was recorded) is measured again; `bench peak --measure` re-measures it, on purpose.
A peak measured quiet is also kept in the user's cache folder (`bench.cache`, keyed by the device, its threads,
the torch version and this module's source), so a new results root on the same machine copies that row into its
own `peaks.csv` instead of measuring again (5 s a precision, after a wait of up to 2 minutes for a quiet machine).
"""

from __future__ import annotations

import csv
import io
import statistics
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from bench.cache import DiskCache
from bench.measure.device import DeviceInfo
from bench.measure.hardware import PEAK_COLUMN, find_gpu
from bench.measure.host import foreign_load_cores, loaded, read_load, wait_for_quiet
from bench.measure.timing import best_time_s

PEAKS_FOLDER = "peaks"
CPU_MATRIX_SIDE = {"fp32": 2048, "bf16": 2048, "fp16": 512}
"""The largest side measured: enough to keep every core busy. A precision the CPU runs slowly stops at a smaller
side (`cpu_matrix_side`): fp16 is emulated on CPUs, and bf16 without AVX512-BF16 or AMX runs a generic loop
(about 1 GFLOP/s per thread on an AVX2 EPYC, torch 2.14: 10-20 s for one 2048 x 2048 matmul)."""
CPU_CALL_S = 0.5
"""At most this long for one matmul of the side measured (`cpu_matrix_side`)."""
CPU_ROUNDS = 3
CPU_SECONDS_PER_ROUND = 0.5
"""The peak is the fastest matmul call of CPU_ROUNDS rounds of this long each. Measured alone on a 2-core Zen 4 VM,
4 alternated repeats each: 3 x 0.5 s gave a median of 203.9 GFLOP/s fp32 and 426.6 bf16 where 5 x 1.0 s gave
203.6 and 428.8 (-0.5 %, inside either setting's own 1-3 % spread between repeats), in 1.5 s a precision instead
of 5. A stored peak says the rounds and seconds it was measured with."""
STORED_COLUMNS = ("device_tag", "device_name", "threads", "precision", "flops_per_s", "matrix_side", "rounds",
                  "seconds_per_round", "measured_utc", "torch_version", "foreign_load_cores")
PEAK_QUIET_WAIT_S = 120.0
"""Seconds to wait at most for other work to leave the CPU's cores free before measuring its peak."""

_MATMUL_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class PeakFlops:
    flops_per_s: float | None
    """None when no trustworthy peak is known: MFU is then left empty, not guessed."""
    source: str


def ensure_peak(device: DeviceInfo, precision: str, results_root: Path) -> PeakFlops:
    """The denominator of MFU/HFU for cells on `device` in `precision`: the datasheet's on a GPU, the
    stored measurement on a CPU. Where a CPU has none stored (or only one measured under load), this measures
    it and writes it to `peaks_file` first (`store_peaks`), as `ensure_` says: the one call here that may
    take seconds and write."""
    if device.type == "cuda":
        spec = find_gpu(device.name)
        if spec is None:
            return PeakFlops(None, f"unknown GPU {device.name!r}: not in bench/data/gpus.csv, no MFU")
        value = spec.peak_flops_per_s(precision)
        if value is None:
            return PeakFlops(None, f"{spec.gpu} datasheet has no {precision} peak, no MFU")
        return PeakFlops(value, f"datasheet: {spec.gpu} {PEAK_COLUMN[precision]} ({spec.source})")
    stored = stored_peak(device, precision, results_root) or copy_machine_peak(device, precision, results_root)
    if stored is None:
        stored = store_peaks(device, (precision,), results_root)[precision]
    return PeakFlops(float(stored["flops_per_s"]), describe_stored(stored, peaks_file(device, results_root)))


def peaks_file(device: DeviceInfo, results_root: Path) -> Path:
    return Path(results_root) / PEAKS_FOLDER / device.tag / "peaks.csv"


def stored_peak(device: DeviceInfo, precision: str, results_root: Path) -> dict | None:
    """The stored measurement for this device, thread count and precision, or None."""
    path = peaks_file(device, results_root)
    if not path.is_file():
        return None
    for row in csv.DictReader(path.read_text(encoding="utf-8-sig").splitlines()):
        if row["precision"] == precision and int(row["threads"]) == device.threads and quiet_peak(row, device):
            return row
    return None


MACHINE_PEAKS = DiskCache("cpu_peaks", sources=("measure/peak.py",),
                          check=lambda row: None if isinstance(row, dict) and set(row) == set(STORED_COLUMNS)
                          else "not a stored peak row")
"""This machine's quiet peaks across results roots: a peak belongs to the CPU and its threads, not to a folder."""


def _machine_key(device: DeviceInfo, precision: str) -> dict:
    return {"device_tag": device.tag, "threads": device.threads, "precision": precision}


def copy_machine_peak(device: DeviceInfo, precision: str, results_root: Path) -> dict | None:
    """The peak this machine measured quiet for another results root, written into this root's `peaks.csv` as it
    was measured (date, load, rounds), or None when there is none."""
    row = MACHINE_PEAKS.get(_machine_key(device, precision))
    if row is None or not quiet_peak(row, device):
        return None
    _write_peak_rows(peaks_file(device, results_root), device, {precision: row})
    return row


def quiet_peak(row: dict, device: DeviceInfo) -> bool:
    """A stored peak measured with the machine to itself (its foreign load recorded and small)."""
    recorded = row.get("foreign_load_cores") or ""
    return recorded != "" and not loaded(float(recorded), device.threads)


def cpu_matrix_side(precision: str) -> int:
    """The side the CPU's peak is measured at: from 256, doubled while one matmul of the doubled side (8 times the
    work) would stay under `CPU_CALL_S`, up to `CPU_MATRIX_SIDE`.

    >>> 256 <= cpu_matrix_side("fp32") <= CPU_MATRIX_SIDE["fp32"]
    True
    """
    dtype = _MATMUL_DTYPES[precision]
    side = 256
    while side < CPU_MATRIX_SIDE[precision]:
        a = torch.randn(side, side).to(dtype)
        torch.matmul(a, a)  # kernel selection and thread start-up
        began = time.perf_counter()
        torch.matmul(a, a)
        if 8 * (time.perf_counter() - began) >= CPU_CALL_S:
            break
        side *= 2
    return side


def store_peaks(device: DeviceInfo, precisions: tuple[str, ...], results_root: Path) -> dict[str, dict]:
    """Measure the CPU's matmul peak for `precisions` and store it (replacing earlier rows for them)."""
    path = peaks_file(device, results_root)
    measured_utc = datetime.now(timezone.utc).isoformat(timespec="seconds")
    torch.set_num_threads(device.threads)  # as the cells will run
    fresh = {}
    for precision in precisions:
        wait_for_quiet(device.threads, PEAK_QUIET_WAIT_S)
        before = read_load()
        side = cpu_matrix_side(precision)
        flops = max(measure_matmul_peak(precision, torch.device("cpu"), side, CPU_SECONDS_PER_ROUND)[0]
                    for _ in range(CPU_ROUNDS))
        foreign = foreign_load_cores(before, read_load())
        fresh[precision] = {"device_tag": device.tag, "device_name": device.name, "threads": device.threads,
                            "precision": precision, "flops_per_s": flops, "matrix_side": side,
                            "rounds": CPU_ROUNDS, "seconds_per_round": CPU_SECONDS_PER_ROUND,
                            "measured_utc": measured_utc, "torch_version": torch.__version__,
                            "foreign_load_cores": "" if foreign is None else round(foreign, 3)}
    written = _write_peak_rows(path, device, fresh)
    for precision, row in written.items():
        if quiet_peak(row, device):
            MACHINE_PEAKS.put(_machine_key(device, precision), row)
    return written


def _write_peak_rows(path: Path, device: DeviceInfo, fresh: dict[str, dict]) -> dict[str, dict]:
    """Replace `path`'s rows for `fresh`'s precisions at the device's thread count with `fresh`'s (atomically);
    returns them as the file holds them (strings)."""
    lines = path.read_text(encoding="utf-8-sig").splitlines() if path.is_file() else []
    kept = [row for row in csv.DictReader(lines)
            if not (row["precision"] in fresh and int(row["threads"]) == device.threads)]
    kept = [{column: row.get(column, "") for column in STORED_COLUMNS} for row in kept]  # an older file's rows
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=STORED_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows([*kept, *fresh.values()])
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f"{path.name}.{id(buffer)}.tmp")
    temporary.write_text(buffer.getvalue())
    temporary.replace(path)
    return {precision: {key: str(value) for key, value in row.items()} for precision, row in fresh.items()}


def describe_stored(row: dict, path: Path) -> str:
    """How a stored CPU peak was measured, for the rows that divide by it."""
    load = row.get("foreign_load_cores") or "unrecorded"
    return (f"measured {row['measured_utc'][:10]}: best of {row['rounds']} rounds of {row['seconds_per_round']} s "
            f"of torch.matmul {row['matrix_side']}x{row['matrix_side']} {row['precision']} on this CPU, "
            f"{row['threads']} threads, foreign load {load} cores ({Path(*path.parts[-3:])})")


def measure_matmul_peak(precision: str, device: torch.device, size: int = 1024,
                        min_time_s: float = 0.3) -> tuple[float, int]:
    """Best observed FLOP/s of a square matmul in `precision`, and the matrix side used."""
    dtype = _MATMUL_DTYPES[precision]
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    torch.matmul(a, b)  # first call pays for kernel selection and thread start-up
    return 2 * size**3 / best_time_s(lambda: torch.matmul(a, b), device, min_time_s=min_time_s), size


REFERENCE_MATRIX_SIDE = 512
REFERENCE_SECONDS = 0.1
"""How long each probe calls the matmul (about 70 calls on a 2-core Zen 4 VM). Measured alone, 15 alternated
probes each: 0.25, 0.1 and 0.05 s gave the same median (199.5, 199.6, 199.3 GFLOP/s) and spread (1.51, 1.56,
1.54 % standard deviation); rows measured before 2026-12-05 probed 0.25 s. Two probes a CPU cell, so 0.3 s
less a cell, which a tiny cell's measurement (about 1 s) had spent half on."""


def reference_flops_per_s(seconds: float = REFERENCE_SECONDS) -> float:
    """The CPU's speed now on a fixed workload: the median FLOP/s of fp32 512x512 matmuls over `seconds`,
    with the threads this process has.

    Taken just before and just after a cell's timed steps, it shows whether the machine itself ran at
    another speed for rows measured minutes apart (a VM's neighbours, its clock), which the interval of one
    row's median cannot show. The median, not the best: a slower stretch is what it is there to see.
    """
    side = REFERENCE_MATRIX_SIDE
    a, b = torch.randn(side, side), torch.randn(side, side)
    torch.matmul(a, b)  # kernel selection and thread start-up
    call_times_s, began = [], time.perf_counter()
    while not call_times_s or time.perf_counter() - began < seconds:
        started = time.perf_counter()
        torch.matmul(a, b)
        call_times_s.append(time.perf_counter() - started)
    return 2 * side**3 / statistics.median(call_times_s)


def measure_copy_bandwidth(device: torch.device, nbytes: int, repeats: int = 10) -> float:
    """Best bytes/s of a device-to-device copy of `nbytes`, counting the read and the write."""
    source = torch.empty(nbytes, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    return 2 * nbytes / best_time_s(lambda: target.copy_(source), device, repeats=repeats)
