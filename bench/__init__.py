"""bench: gradient accumulation vs large batch, measured.

Data flows one way: spec -> cells -> runner -> rows -> (report | cost).

The Python API (docs/api.md has runnable examples, executed by the tests): `load_grid`, `estimate`,
`estimate_grids`, `predict_grids`, `measure_cell`, `run_grid`, `probe`, `probe_report`, `price`, `plan`,
`read_rows` (not `measure` or `cost`: those names are subpackages), defined in `bench.api`; the commands call
the same functions. Each imports what it needs when called, so `import bench` itself is cheap (no torch). The
objects they return have `to_frame()` (a pandas DataFrame) and show as tables in Jupyter.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_grid", "estimate", "estimate_grids", "predict_grids", "measure_cell", "run_grid", "probe",
           "probe_report", "price", "plan", "read_rows"]


def __getattr__(name: str) -> Any:
    """The API's functions, imported from `bench.api` when first asked for: importing `bench` (or any of its
    modules, or `python -m bench`) runs nothing else."""
    if name in __all__:
        from bench import api

        return getattr(api, name)
    raise AttributeError(f"module 'bench' has no attribute {name!r}")
