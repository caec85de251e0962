"""The throughput model's own files, rewritten: its fit (`bench/data/speed_params.json`), its errors on held-out
public rows (the validation tables and the bands the parameter file carries), the reference rows' traces and this
host's cost per dispatched op. Developer work, run through `bench.api` by `bench predict --fit`, `--validate`,
`--trace-reference` and `--measure-host`; each writes the repository's own files, never a user's results.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from bench.frames import write_csv

DATA = Path(__file__).resolve().parents[1] / "data"
"""`bench/data/`: where the model's parameters, reference traces and host cost live."""


@dataclass(frozen=True)
class Fitted:
    """A refit: the parameter file written, its text, and how many reference rows it was fitted on."""

    path: Path
    text: str
    rows: int


def refit(data: Path = DATA) -> Fitted:
    """Fit the efficiency parameters on the traced reference rows and write the parameter file (the committed
    version and validation kept: `--validate` measures the new fit's errors)."""
    from bench.speed.calibrate import fitted_params_json
    from bench.speed.params import PARAMS_FILE

    text, dataset = fitted_params_json()
    path = data / PARAMS_FILE
    path.write_text(text)
    return Fitted(path, text, len(dataset.rows))


@dataclass(frozen=True)
class Validated:
    """What `revalidate` measured: the held-out tables (`bench.speed.validate.validation_tables`, the projections
    added), the predicted ratios between GPUs, the model's version, and the parameter file it wrote the bands to."""

    tables: dict
    ratios: list[dict]
    version: str
    params_path: Path


def revalidate(folder: Path, data: Path = DATA) -> Validated:
    """Leave-one-GPU-out and leave-one-family-out errors, the projections' errors and the bands, written as CSVs
    under `folder`; the bands and projections go into the parameter file first (the cross-GPU ratios, written last,
    are predicted with them)."""
    from bench.speed.calibrate import validation_json
    from bench.speed.params import PARAMS_FILE, load_model_file, params_json
    from bench.speed.validate import (ERROR_COLUMNS, PROJECTION_COLUMNS, VALIDATION_COLUMNS, cross_gpu_columns,
                                      cross_gpu_ratios, projection_band, projection_by_pair, projection_pairs,
                                      validation_tables)

    current = load_model_file()
    folder.mkdir(parents=True, exist_ok=True)
    tables = validation_tables()
    write_csv(tables["rows"], folder / "validation.csv", VALIDATION_COLUMNS)
    for name in ("logo_by_gpu", "logo_by_family", "lofo_by_family", "lofo_by_gpu"):
        write_csv(tables[name], folder / f"{name}.csv", (name.rpartition("_")[2], *ERROR_COLUMNS))
    pairs = projection_pairs()
    tables["projection"], tables["projection_by_pair"] = projection_band(pairs), projection_by_pair(pairs)
    write_csv(tables["projection_by_pair"], folder / "projection_by_pair.csv", PROJECTION_COLUMNS)
    validated = replace(current, bands=tables["bands"], projection=tables["projection"],
                        model_scaled=tables["model_scaled"], training_gpus=tables["training_gpus"])
    path = data / PARAMS_FILE
    path.write_text(params_json(current.version, current.params, current.fitted_on, validation_json(validated)))
    load_model_file.cache_clear()
    ratios = cross_gpu_ratios()
    write_csv(ratios, folder / "cross_gpu.csv", cross_gpu_columns())
    return Validated(tables, ratios, current.version, path)


def retrace_reference(on_begin: Callable[[int], None] | None = None,
                      on_trace: Callable[[object, str], None] | None = None, data: Path = DATA) -> tuple[Path, int]:
    """Trace the configurations of the reference rows again and write their ops table: (path, traces). `on_begin`
    gets the number of rows first, `on_trace` each configuration's outcome as it is traced."""
    from bench.speed.reference import OPS_FILE, REFERENCE_FOLDER, reference_rows, trace_reference, write_reference_ops

    rows = reference_rows()
    if on_begin:
        on_begin(len(rows))
    tables = trace_reference(rows, on_trace)
    path = data / REFERENCE_FOLDER / OPS_FILE
    write_reference_ops(tables, path)
    return path, len(tables)


def remeasure_host(data: Path = DATA) -> tuple[dict, Path]:
    """Measure this CPU's cost per dispatched op and write it: (the row, its file)."""
    from bench.speed.dispatch import HOST_FILE, measure_host_dispatch, write_host_dispatch

    row = measure_host_dispatch()
    path = data / HOST_FILE
    write_host_dispatch(row, path)
    return row, path
