"""The library's functions: what the commands do, callable from Python. `bench/__init__.py` re-exports them;
`bench.commands` calls them (never the reverse: no module here imports the CLI layer).

Each imports what it needs when called, so importing this module is cheap (no torch).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal

if TYPE_CHECKING:  # the types, for readers and checkers; imported lazily below
    import pandas as pd

    from bench.cost.price import CostTable
    from bench.grid.cell import Cell
    from bench.grid.spec import Grid
    from bench.measure.device import DeviceInfo
    from bench.memory.estimate import Estimate
    from bench.memory.estimate_grid import GridEstimate
    from bench.memory.probe import OnTrial, ProbeReport, ProbeResult
    from bench.planner.ranking import Plan
    from bench.report.compare import Comparison
    from bench.speed.predict import GridPrediction
    from bench.speed.refit import Fitted, Validated

__all__ = ["load_grid", "estimate", "estimate_grids", "predict_grids", "measure_cell", "run_grid", "probe",
           "probe_report", "price", "plan", "read_rows", "load_for_device", "compare"]


def load_grid(path: str | Path, profile: Literal["cuda", "cpu"] = "cuda") -> Grid:
    """A grid file (`experiments/*.toml`) validated and expanded into cells, under `profile`
    (`cuda`: the grid as written; `cpu`: its CPU profile's overrides), its cells checked against their models'
    bounds as every command checks them. Bad input raises `bench.errors.GridFileError` with a one-line message."""
    from bench.train.model_bounds import load_checked_grid as load

    return load(path, profile)


def estimate(cell: Cell, target: Literal["cuda", "cpu"] = "cuda") -> Estimate:
    """The cell's peak memory predicted without running it (fake tensors): for a GPU (`cuda`:
    `peak_allocated_bytes`, `peak_reserved_bytes`) or for this CPU's runner (`cpu`: `peak_bytes`)."""
    from bench.memory.estimate import estimate_cell

    return estimate_cell(cell, target)


def estimate_grids(files: Iterable[str | Path], *, profile: Literal["cuda", "cpu"] = "cuda",
                   results_root: str | Path = "results", on_grid: Callable[[Grid], None] | None = None,
                   on_row: Callable[[dict, int, int], None] | None = None) -> list[GridEstimate]:
    """Every cell of each grid file estimated, as `bench estimate` does: every file and its models' bounds checked
    first (bad input raises a one-line `BadInput` before anything is estimated), then each grid's rows written to
    `<results_root>/<experiment>/estimate/runs.csv` (a cell the model refuses is an error row) and charted beside
    them. `on_grid` is told of each grid as it begins, `on_row` of each row (row, index, cells in the grid)."""
    from bench.train.model_bounds import load_checked_grid as load

    grids = [load(path, profile) for path in files]
    from bench.memory.estimate_grid import GridEstimate, estimate_grid  # late: torch, once the input is checked
    from bench.memory.validate import agreement
    from bench.report.estimate_chart import write_estimate_chart
    estimated = []
    for grid in grids:
        if on_grid:
            on_grid(grid)
        rows: list[dict] = []

        def keep(row: dict, index: int, total: int) -> None:
            rows.append(row)
            if on_row:
                on_row(row, index, total)

        path = estimate_grid(grid, Path(results_root), on_row=keep)
        chart = write_estimate_chart(path.parent) if any(row["status"] == "estimated" for row in rows) else None
        agreements = {model: agreement(model=model) for model in dict.fromkeys(cell.model for cell in grid.cells)}
        estimated.append(GridEstimate(grid, path, tuple(rows), chart, agreements))
    return estimated


def predict_grids(files: Iterable[str | Path], *, gpus: Iterable[str] = (), only: dict[str, str] | None = None,
                  results_root: str | Path = "results", on_grid: Callable[[Grid], None] | None = None,
                  on_row: Callable[[dict], None] | None = None) -> list[GridPrediction]:
    """Every cell of each grid file's CUDA grid predicted on catalog GPUs (`gpus`, default every one) by the
    throughput model, as `bench predict` does: rows to `<results_root>/<experiment>/predicted/runs.csv` and the
    throughput lost at the most-accumulated split to `accumulation.csv` beside them. `only` keeps the cells with
    those axis values (axis -> value). Every file, GPU and filter is checked before anything is predicted;
    `on_grid` is told of each grid as it begins, `on_row` of each predicted row."""
    from bench.errors import OptionError, refused_step
    from bench.measure.hardware import gpu_key_hint, gpu_keys
    from bench.train.model_bounds import load_checked_grid as load

    gpus = tuple(gpus)
    unknown = [key for key in gpus if key not in gpu_keys()]
    if unknown:
        raise OptionError(f"--gpu {unknown[0]}: not a catalog key; {gpu_key_hint(unknown[0])}")
    grids = [load(path, "cuda") for path in files]
    grids = [grid.only(only) for grid in grids] if only else grids
    from bench.speed.predict import predict_grid_files  # late: torch, once the input is checked
    predicted = []
    for grid in grids:
        if on_grid:
            on_grid(grid)
        sizes = ", ".join(sorted({f"{cell.model} at {cell.image_size} px" for cell in grid.cells}))
        with refused_step(grid.name, f"a cell of {grid.path} ({sizes})"):
            predicted.append(predict_grid_files(grid, Path(results_root), gpus or None, on_row))
    return predicted


# The throughput model's own files (developer work: `bench predict --fit`, `--validate`, `--trace-reference`,
# `--measure-host`); not in `__all__`, they rewrite the repository's data, not a user's results.

def refit_speed_model() -> Fitted:
    """Fit the throughput model's efficiency parameters on the traced reference rows -> `bench/data/speed_params.json`
    (its version and validation kept until `validate_speed_model` measures the new fit)."""
    from bench.speed.refit import refit

    return refit()


def validate_speed_model(folder: str | Path = "docs/speed") -> tuple[Validated, str, list[Path]]:
    """The model's errors on held-out public rows: CSVs under `folder`, the bands into the parameter file, then the
    page and charts (`bench.report.speed_validation`): (what was measured, the page's text, the page and charts)."""
    from bench.report.speed_validation import write_validation_report
    from bench.speed.refit import revalidate

    validated = revalidate(Path(folder))
    text, written = write_validation_report(validated, Path(folder))
    return validated, text, written


def trace_speed_reference(on_begin: Callable[[int], None] | None = None,
                          on_trace: Callable[[Any, str], None] | None = None) -> tuple[Path, int]:
    """Trace the reference rows' configurations again -> `bench/data/reference/reference_ops.csv.gz` (minutes):
    (the file, the traces)."""
    from bench.speed.refit import retrace_reference

    return retrace_reference(on_begin, on_trace)


def measure_speed_host() -> tuple[dict, Path]:
    """This CPU's cost per dispatched op -> `bench/data/host_dispatch.csv`: (the row, the file)."""
    from bench.speed.refit import remeasure_host

    return remeasure_host()


def measure_cell(cell: Cell, *, device: Literal["auto", "cuda", "cpu"] = "auto", timeout_s: float = 600.0,
            memory_limit_gib: float | None = None, results_root: str | Path | None = None) -> dict[str, Any]:
    """Run one cell in its own process, as `bench run` does, and return its measured columns
    (`status`, `peak_memory_bytes`, `samples_per_s`, `step_times_ms`, ...; docs/results.md).

    MFU needs a peak: the GPU's datasheet figure, or on a CPU the matmul peak stored under
    `results_root` (measured there first if absent). Without `results_root` on a CPU, MFU is left
    empty. Nothing is written to a runs file: `run_grid` does that."""
    from bench.grid.model_ref import ModelSpec
    from bench.measure.device import detect_device
    from bench.measure.flops import flops_per_sample
    from bench.measure.peak import PeakFlops
    from bench.results.peaks import ensure_peak
    from bench.run.cell_measurement import CellTask
    from bench.run.cell_process import run_cell

    info = detect_device(device)
    if info.type == "cpu" and results_root is None:
        peak = PeakFlops(None, "no results_root given: CPU peak not looked up, no MFU")
    else:
        peak = ensure_peak(info, cell.precision, Path(results_root or "results"))
    flops = flops_per_sample(ModelSpec.of(cell), cell.image_size, cell.checkpointing)
    return run_cell(CellTask(cell, info, peak, flops, memory_limit_gib), timeout_s)


def run_grid(path: str | Path, *, device: Literal["auto", "cuda", "cpu"] = "auto",
             results_root: str | Path = "results", force: bool = False) -> list[dict]:
    """Every cell of a grid file not yet measured, as `bench run FILE` does: rows appended to
    `<results_root>/<experiment>/<device-tag>/runs.csv` as each cell ends; returns this run's rows."""
    from bench.measure.device import detect_device
    from bench.run.grid_runner import RunOptions
    from bench.run.grid_runner import run_grid as run

    info = detect_device(device)
    (grid,) = load_for_device([Path(path)], info)  # the models' bounds (blocks, patch) checked too, as `bench run`
    return run(grid, info, RunOptions(results_root=Path(results_root), force=force))  # it takes the results lock


def load_for_device(files: Iterable[str | Path], device: DeviceInfo, max_cells: int | None = None) -> list[Grid]:
    """Every grid file loaded under the device's profile (`cpu` on a CPU) and checked against its models' bounds and
    the precisions it runs, as `bench run` loads them: a bad file or precision raises a one-line `BadInput` before anything runs."""
    from bench.grid.spec import MAX_CELLS, require_precisions
    from bench.train.model_bounds import load_checked_grid as load

    profile = "cuda" if device.type == "cuda" else "cpu"
    grids = [load(path, profile, MAX_CELLS if max_cells is None else max_cells) for path in files]
    for grid in grids:
        require_precisions(grid, device.precisions, device.name)
    return grids


def probe(model: str, *, gpu: str | None = None, memory_gib: float | None = None,
          memory_limit_gib: float | None = None, device: Literal["auto", "cuda", "cpu"] = "auto",
          accum_steps: int = 1, timeout_s: float = 600.0, on_trial: OnTrial | None = None,
          **axes: Any) -> ProbeResult:
    """The largest micro-batch of `model` that fits, as `bench probe` finds it.

    With `gpu` (a GPU catalog key such as "A100-40GB") or `memory_gib`, from the estimator alone (peak
    reserved + 10 % headroom); otherwise predicted, then found by real trials on `device` (on a CPU
    `memory_limit_gib` is required). `axes` are the grid's (`image_size`, `precision`, `checkpointing`,
    `optimizer`, `channels_last`, ...) and the model's (`model_kwargs` a dict, `in_chans`, `image_width`,
    `num_classes`); `model` is a timm name, hf-hub:ORG/NAME, package.module:factory or path/to/file.py:factory.
    `on_trial` is called with each `Trial` as it ends. Several GPUs at once, with the estimator's measured
    agreement: `probe_report`."""
    report = probe_report(model, gpus=() if gpu is None else (gpu,), memory_gib=memory_gib,
                          memory_limit_gib=memory_limit_gib, device=device, accum_steps=accum_steps,
                          timeout_s=timeout_s, on_trial=on_trial, **axes)
    return report.answers[0].result


def probe_report(model: str, *, gpus: Iterable[str] = (), memory_gib: float | None = None,
                 memory_limit_gib: float | None = None, device: Literal["auto", "cuda", "cpu"] = "auto",
                 accum_steps: int = 1, headroom: float | None = None, timeout_s: float = 600.0,
                 check_cell: Callable[[Cell], None] | None = None, on_trial: OnTrial | None = None,
                 on_text: Callable[[str], None] | None = None, **axes: Any) -> ProbeReport:
    """`probe` for every GPU of `gpus` at once (each micro-batch traced once for all), as `bench probe` answers:
    a `ProbeReport` of one `BudgetAnswer` per budget, each with the estimator's measured agreement with public
    fit/OOM rows. `headroom` (default `bench.memory.fit.DEFAULT_HEADROOM`) is kept free above the estimate when
    answering for a GPU or a size. `check_cell` checks the model before any trace (default: that it is an image
    classifier for its input); `on_text` gets a progress line as each budget's probe begins."""
    from bench.errors import ModelRefError
    from bench.grid.model_ref import model_problem, parse_model_kwargs
    from bench.memory.budget import probe_budget
    from bench.memory.probe import ProbeConfig, probe_budgets

    problem = model_problem(model)
    if problem:
        raise ModelRefError(problem)
    if isinstance(axes.get("model_kwargs"), dict):
        axes["model_kwargs"] = parse_model_kwargs(json.dumps(axes["model_kwargs"]))
    chosen = {} if headroom is None else {"headroom": headroom}
    budgets = [probe_budget(gpu=gpu, memory_gib=memory_gib, memory_limit_gib=memory_limit_gib, device=device,
                            **chosen) for gpu in list(gpus) or [None]]  # a bad choice refused before any trace
    config = ProbeConfig.of(model, accum_steps, **axes)
    if check_cell is None:
        from bench.train.model_build import check_cell_classifier as check_cell
    check_cell(config.base)
    return probe_budgets(config, budgets, memory_limit_gib=memory_limit_gib, timeout_s=timeout_s,
                         on_trial=on_trial, on_text=on_text)


def price(folder: str | Path, *, allow_cpu_projection: bool = False, providers: Iterable[str] = (),
          catalog: str | Path | None = None, include_superseded: bool = False, dataset_size: int | None = None,
          epochs: float | None = None, scaling_efficiency: float | None = None, headroom: float | None = None,
          loader_rows: Iterable[str | Path] = ()) -> CostTable:
    """Every ok row of `folder/runs.csv` priced on every current catalog instance (`include_superseded`: the old
    prices too), as `bench cost` does (nothing is written: `bench cost` writes cost.csv, cost.md and the chart). A
    row measured on a catalog GPU is carried to the others by the throughput model's ratio between them (its
    configuration traced once, in the shared trace cache). `loader_rows`: folders whose loader rows size the cores
    that feed each line (default: those in `folder`). Options left None take the defaults of
    `bench.cost.price.Workload` and `Assumptions`."""
    from bench.cost.catalog import select_instances
    from bench.cost.feeding import priced_loader_costs
    from bench.cost.outputs import load_ok_rows
    from bench.cost.price import price_rows
    from bench.planner.rows import projection_errors, with_model_speeds

    described, instances = select_instances(None if catalog is None else Path(catalog),
                                            include_superseded=include_superseded, providers=tuple(providers))
    table = price_rows(with_model_speeds(load_ok_rows(Path(folder))), instances, _workload(dataset_size, epochs),
                       _assumptions(scaling_efficiency, headroom, allow_cpu_projection), projection_errors())
    loader_costs, loader_source = priced_loader_costs([Path(f) for f in loader_rows], [Path(folder)])
    return replace(table, catalog=described, loader_costs=tuple(loader_costs), loader_source=loader_source)


def plan(folders: Iterable[str | Path] = (), *, model: str, effective_batch: int, allow_cpu_projection: bool = False,
         providers: Iterable[str] = (), spot: bool = False, budget_usd: float | None = None,
         deadline_hours: float | None = None, image_size: int | None = None, catalog: str | Path | None = None,
         include_superseded: bool = False, dataset_size: int | None = None, epochs: float | None = None,
         scaling_efficiency: float | None = None, headroom: float | None = None,
         predict: Literal["auto", "always", "never"] = "auto", gpus: Iterable[str] = (),
         precisions: Iterable[str] = (), checkpointing: Iterable[str] = (), optimizer: str = "adamw",
         model_options: dict[str, Any] | None = None, rank_by: Literal["cost", "hours"] = "cost",
         loader_rows: Iterable[str | Path] = (), check_cell: Callable[[Cell], None] | None = None,
         on_text: Callable[[str], None] | None = None, on_step: Callable[[str], None] | None = None) -> Plan:
    """(instance, micro-batch x accumulation, precision, checkpointing, optimizer) options ranked by dollars
    per run for `model` at `effective_batch`, from the rows of `folders`, as `bench plan` does: by default
    (`predict="auto"`) the throughput model adds options when the rows hold no GPU row of the model
    (`always`: beside the measured ones; `never`: the rows alone). `gpus` keeps only instances with those
    catalog GPUs; `precisions`, `checkpointing`, `optimizer` and `model_options` (the cells' model fields beyond
    model and image size) are what is predicted; `rank_by` orders by dollars (`cost`) or hours per run;
    `loader_rows` are folders whose loader rows size the cores that feed each option (default: those among
    `folders`, else the repository's own study). `check_cell` checks the model before any trace (default: that it
    is an image classifier); `on_text` gets the predictor's progress lines, `on_step` each stage as it begins
    (one per folder read, then the pricing). Options left None take the defaults of `bench.cost.price.Workload`
    and `Assumptions`. The `Plan` holds everything `bench plan` prints, text or JSON (`bench.planner.render`)."""
    from bench.cost.catalog import select_instances
    from bench.cost.feeding import priced_loader_costs
    from bench.cost.outputs import load_ok_rows
    from bench.memory.validate import agreement
    from bench.planner.ranking import PlanRequest, make_plan
    from bench.planner.rows import plan_rows, projection_errors, with_model_speeds

    step = on_step or (lambda text: None)
    folders = [Path(folder) for folder in folders]
    described, instances = select_instances(None if catalog is None else Path(catalog),
                                            include_superseded=include_superseded, providers=tuple(providers),
                                            gpus=tuple(gpus))
    rows = []
    for folder in folders:
        step(f"reading {folder}")
        rows += [row for row in load_ok_rows(folder) if row.model == model]  # the plan ranks this model's alone
    assumptions = _assumptions(scaling_efficiency, headroom, allow_cpu_projection)
    found = plan_rows(with_model_speeds(rows), model=model, effective_batch=effective_batch, instances=instances,
                      image_size=image_size, predict=predict, precisions=tuple(precisions),
                      checkpointing=tuple(checkpointing), optimizer=optimizer, headroom=assumptions.headroom,
                      model_options=model_options, on_text=on_text, check_cell=check_cell)
    request = PlanRequest(model=model, effective_batch=effective_batch, workload=_workload(dataset_size, epochs),
                          image_size=found.image_size, budget_usd=budget_usd, deadline_hours=deadline_hours, spot=spot,
                          rank_by=rank_by)
    step(f"pricing {len(found.rows)} rows x {len(instances)} instances")
    loader_costs, loader_source = priced_loader_costs([Path(f) for f in loader_rows], folders, study_fallback=True)
    ranked = make_plan(found.rows, instances, request, assumptions, projection_errors())
    return replace(ranked, catalog=described, loader_costs=tuple(loader_costs), loader_source=loader_source,
                   memory_agreement=agreement(assumptions.headroom, model=model))


def read_rows(folder: str | Path) -> pd.DataFrame:
    """The rows of a results folder's `runs.csv` (or of the runs file named) as a DataFrame, checked and typed by
    the one reader every command uses (`bench.results.read.read_runs`): one row per cell, the columns of
    docs/results.md. A missing or invalid file raises `bench.errors.ResultsFileError` with a one-line message."""
    from bench.errors import ResultsFileError
    from bench.results.read import read_runs

    path = Path(folder)
    runs = path / "runs.csv" if path.is_dir() else path
    if not runs.is_file():
        raise ResultsFileError(f"{runs}: no runs file here; name a results folder such as results/smoke/<device-tag>")
    return read_runs(runs)


def compare(a: str | Path, b: str | Path, *, threshold: float = 0.10) -> Comparison:
    """Rows of `a` and `b` side by side (`bench compare A B`): each a results folder, a runs file (measured,
    estimated or predicted rows) or a plan's JSON document (`bench plan --format json`). Rows are matched on the
    configuration key; each figure both have gets both values, the ratio B/A and whether the difference is real
    (`bench.report.compare`). `threshold`: the noise taken where neither row keeps a spread. Returns a
    `bench.report.compare.Comparison`; a missing or unreadable side, or no matching row, raises
    `bench.errors.ResultsFileError` with a one-line message."""
    from bench.errors import ResultsFileError
    from bench.report.compare import compare as compare_entries

    sides = [_compare_side(Path(path)) for path in (a, b)]
    for path, (entries, _) in zip((a, b), sides):
        if not entries:
            raise ResultsFileError(f"{path}: no rows with figures to compare (only failed cells, or none)")
    result = compare_entries(sides[0][0], sides[1][0], a_source=str(a), b_source=str(b), threshold=threshold,
                             left_out=(sides[0][1], sides[1][1]))
    if not result.pairs:
        raise ResultsFileError(f"{b}: none of its {len(sides[1][0])} rows matches one of the {len(sides[0][0])} of "
                               f"{a} (same configuration; for a prediction or plan, the same GPU)")
    return result


def _compare_side(path: Path):
    """A side of `compare`: its entries and how many rows had no figures (failed cells)."""
    from bench.errors import ResultsFileError
    from bench.report.compare import entries_from_plan, entries_from_rows
    from bench.results.read import file_schema, read_runs, records

    allowed = "a results folder, a runs file (runs.csv) or a plan's JSON (bench plan --format json)"
    runs = path / "runs.csv" if path.is_dir() else path
    if not path.exists():
        raise ResultsFileError(f"{path}: no such file or folder; pass {allowed}")
    if path.is_dir() and not runs.is_file():
        raise ResultsFileError(f"{path}: no runs.csv in this folder; pass {allowed}")
    if runs.suffix == ".json":
        try:
            document = json.loads(runs.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ResultsFileError(f"{runs}: not a JSON document ({exc}); pass {allowed}") from None
        if not isinstance(document, dict) or document.get("command") != "plan" or \
                not isinstance(document.get("options"), list):
            raise ResultsFileError(f"{runs}: not a plan's JSON (no \"command\": \"plan\" with options); pass {allowed}")
        options = [option for option in document["options"] if isinstance(option, dict)]
        return entries_from_plan(options), len(document["options"]) - len(options)
    if runs.suffix != ".csv":
        raise ResultsFileError(f"{runs}: not a kind of file compare reads (.csv or .json); pass {allowed}")
    schema = file_schema(runs)
    if schema.kind == "autotune":
        raise ResultsFileError(f"{runs}: the estimator's largest batches (bench claims), not rows with figures; "
                               f"pass {allowed}")
    rows = records(read_runs(runs, schema.columns))
    entries = entries_from_rows(rows, schema.kind)
    return entries, len(rows) - len(entries)


def _assumptions(scaling_efficiency: float | None, headroom: float | None, allow_cpu_projection: bool):
    """`Assumptions` with the values given; the dataclass's own defaults for the rest (stated there, once)."""
    from bench.cost.price import Assumptions

    chosen = {name: value for name, value in (("scaling_efficiency", scaling_efficiency), ("headroom", headroom))
              if value is not None}
    return Assumptions(**chosen, allow_cpu_projection=allow_cpu_projection)


def _workload(dataset_size: int | None, epochs: float | None):
    from bench.cost.price import Workload

    chosen = {name: value for name, value in (("dataset_size", dataset_size), ("epochs", epochs)) if value is not None}
    return Workload(**chosen)
