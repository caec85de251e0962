"""The denominator of MFU/HFU: a GPU's datasheet peak, or a CPU's measured peak stored beside the rows.

A CPU has no datasheet peak worth dividing by, so its peak is measured (`bench.measure.peak.measure_cpu_peak`)
once per device, thread count and precision, and stored with its date and the foreign load it was measured under
in `<results>/peaks/<device-tag>/peaks.csv` (columns `bench.results.schema.PEAK_COLUMNS`), read and written as
every results table is (`bench.results.read`, `bench.results.store`). Every results folder measured on that device
then divides by the same number; a stored peak measured under load (or before the load was recorded) is measured
again; `bench peak --measure` re-measures it, on purpose. A peak measured quiet is also kept in the user's cache
folder (`bench.cache`, keyed by the device, its threads, the torch version and the measuring code), so a new
results root on the same machine copies that row into its own `peaks.csv` instead of measuring again (1.5 s a
precision, after a wait of up to 2 minutes for a quiet machine).
"""

from __future__ import annotations

from pathlib import Path

from bench.cache import DiskCache
from bench.measure.device import DeviceInfo
from bench.measure.host import loaded
from bench.measure.peak import PeakFlops, datasheet_peak, measure_cpu_peak
from bench.results.read import cell_text, read_text
from bench.results.schema import PEAK_COLUMNS
from bench.results.store import PEAKS_FOLDER, RunsFile, results_folder

_KEY = ("threads", "precision")
"""What names a row of a device's peaks file."""


def ensure_peak(device: DeviceInfo, precision: str, results_root: Path) -> PeakFlops:
    """The denominator of MFU/HFU for cells on `device` in `precision`: the datasheet's on a GPU, the
    stored measurement on a CPU. Where a CPU has none stored (or only one measured under load), this measures
    it and writes it to `peaks_file` first (`store_peaks`), as `ensure_` says: the one call here that may
    take seconds and write."""
    if device.type == "cuda":
        return datasheet_peak(device, precision)
    stored = stored_peak(device, precision, results_root) or copy_machine_peak(device, precision, results_root)
    if stored is None:
        stored = store_peaks(device, (precision,), results_root)[precision]
    return PeakFlops(float(stored["flops_per_s"]), describe_stored(stored, peaks_file(device, results_root)))


def peaks_file(device: DeviceInfo, results_root: Path) -> Path:
    return results_folder(results_root, PEAKS_FOLDER, device.tag) / "peaks.csv"


def _peaks(path: Path) -> RunsFile:
    return RunsFile(path, PEAK_COLUMNS, key=_KEY, history=False)


def stored_peak(device: DeviceInfo, precision: str, results_root: Path) -> dict | None:
    """The stored measurement for this device, thread count and precision (as the file holds it), or None."""
    path = peaks_file(device, results_root)
    for row in read_text(path, PEAK_COLUMNS, key=_KEY).rows:
        if row["precision"] == precision and int(row["threads"]) == device.threads and quiet_peak(row, device):
            return row
    return None


MACHINE_PEAKS = DiskCache("cpu_peaks", sources=("measure/peak.py", "results/peaks.py"),
                          check=lambda row: None if isinstance(row, dict) and set(row) == set(PEAK_COLUMNS)
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
    _peaks(peaks_file(device, results_root)).write(row)
    return row


def quiet_peak(row: dict, device: DeviceInfo) -> bool:
    """A stored peak measured with the machine to itself (its foreign load recorded and small)."""
    recorded = row.get("foreign_load_cores") or ""
    return recorded != "" and not loaded(float(recorded), device.threads)


def store_peaks(device: DeviceInfo, precisions: tuple[str, ...], results_root: Path) -> dict[str, dict]:
    """Measure the CPU's matmul peak for `precisions` and store it (replacing earlier rows for them); returns the
    rows as the file holds them (text)."""
    peaks = _peaks(peaks_file(device, results_root))
    written = {}
    for precision in precisions:
        row = measure_cpu_peak(device, precision)
        peaks.write(row)
        written[precision] = {name: cell_text(value) for name, value in row.items()}
        if quiet_peak(written[precision], device):
            MACHINE_PEAKS.put(_machine_key(device, precision), written[precision])
    return written


def describe_stored(row: dict, path: Path) -> str:
    """How a stored CPU peak was measured, for the rows that divide by it."""
    load = row.get("foreign_load_cores") or "unrecorded"
    return (f"measured {row['measured_utc'][:10]}: best of {row['rounds']} rounds of {row['seconds_per_round']} s "
            f"of torch.matmul {row['matrix_side']}x{row['matrix_side']} {row['precision']} on this CPU, "
            f"{row['threads']} threads, foreign load {load} cores ({Path(*path.parts[-3:])})")
