"""A ranked plan: which (instance, micro-batch, accumulation, precision, checkpointing,
optimizer) trains a model at a target effective batch for the fewest dollars.

Candidates come from measured rows priced by `bench.cost.price`. On an instance with n GPUs the
target effective batch E is split as micro_batch x accum_steps_per_gpu x n, so a row with
micro-batch m serves E when m x n divides E. When that changes the accumulation the row was
measured with, per-sample speed and peak memory are assumed unchanged (both are set by the
micro-batch; the optimizer step is amortised over fewer samples, so this errs fast) and the
option says so. Options that do not fit, lack a speed, break the budget or the deadline
are counted and left out; the rest are ranked by dollars per run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from bench.cost.catalog import Instance
from bench.cost.price import (
    LABELLED,
    Assumptions,
    CostLine,
    MeasuredRow,
    MeasuredScaling,
    ProjectionErrors,
    Workload,
    measured_scaling,
    not_priced,
    price_line,
)
from bench.errors import BadInput
from bench.frames import Tabular
from bench.results.keys import varying
from bench.units import gib

if TYPE_CHECKING:
    from bench.cost.feeding import LoaderCost
    from bench.memory.validate import Agreement


class PlanError(BadInput):
    """The rows cannot answer the request as asked. The message is one line."""


# Better evidence first, in the order of the errors docs/speed/validation.md measures across public pairs of GPUs:
# a GPU measurement, then one scaled by the model's ratio between the GPUs, then the model alone, then a measured
# MFU carried to another GPU, then a CPU profile's MFU (never validated on a GPU).
_EVIDENCE = {"measured": 0, "projected_by_model": 1, "predicted": 2, "projected_from_gpu": 3,
             "projected_from_cpu_profile": 4}


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """What to train, and the limits a plan must respect."""

    model: str
    """timm model name, as in the rows' `model` column."""
    effective_batch: int
    """Samples per optimizer step across all GPUs."""
    workload: Workload = Workload()
    image_size: int | None = None
    """Only rows at this image size; required when the rows have several."""
    budget_usd: float | None = None
    """Leave out options costing more per run."""
    deadline_hours: float | None = None
    """Leave out options taking longer per run."""
    spot: bool = False
    """Rank by spot prices (options without one are left out)."""
    rank_by: Literal["cost", "hours"] = "cost"
    """Rank by dollars per run (ties by hours), or by hours per run (ties by dollars)."""


@dataclass(frozen=True)
class Option:
    """One way to run the plan, priced."""

    line: CostLine
    """A priced line (`line.cost` is set)."""
    accum_steps_per_gpu: int
    spot: bool = False
    """Priced at the spot rate instead of on-demand."""
    variant: str = ""
    """The axes this option's row differs in from another option's, beyond those its label names
    (`channels_last=True`); "" when every option shares them."""

    @property
    def usd_basis(self) -> str:
        return "spot" if self.spot else "on-demand"

    @property
    def usd_per_hour(self) -> float:
        instance = self.line.instance
        return instance.spot_usd_per_hour if self.spot else instance.usd_per_hour

    @property
    def hours_per_run(self) -> float:
        return self.line.cost.hours_per_run

    @property
    def usd_per_run(self) -> float:
        return self.hours_per_run * self.usd_per_hour

    @property
    def hours_range(self) -> tuple[float, float] | None:
        """Hours per run at the ends of the speed's interval (`CostLine.speed_interval`: a predicted or projected
        speed's 80 % band, a measured one's 95 % interval; None: not known)."""
        return self.line.over_speed_range(self.hours_per_run)

    @property
    def usd_range(self) -> tuple[float, float] | None:
        hours = self.hours_range
        return None if hours is None else (hours[0] * self.usd_per_hour, hours[1] * self.usd_per_hour)

    @property
    def ranges(self) -> dict[str, float | None]:
        """`usd_per_run_low` ... `hours_per_run_high`: the ends of the speed's interval (`hours_range`; None: none)."""
        usd, hours = self.usd_range or (None, None), self.hours_range or (None, None)
        return {"usd_per_run_low": usd[0], "usd_per_run_high": usd[1], "hours_per_run_low": hours[0],
                "hours_per_run_high": hours[1]}

    @property
    def configuration(self) -> str:
        """`16x1 per GPU bf16 ckpt-off adamw`, then the variant when options differ in more (`channels_last=True`)."""
        row = self.line.row
        return " ".join(filter(None, (f"{row.micro_batch}x{self.accum_steps_per_gpu} per GPU {row.precision} "
                                      f"ckpt-{row.checkpointing} {row.optimizer}", self.variant)))

    @property
    def basis_text(self) -> str:
        """The speed's basis: `measured`, `projected_from_gpu (...its error)`, ... or the throughput model's version
        and error."""
        if self.line.basis == "predicted":
            return self.line.row.speed_basis
        error = self.line.speed_error
        return f"{self.line.basis} ({error})" if error else self.line.basis or ""

    @property
    def evidence(self) -> str:
        """The speed's basis, plus the re-split accumulation when there is one (and a predicted row's memory fit)."""
        row = self.line.row
        text = self.basis_text
        how = "measured"
        if self.hours_range:
            (h_low, h_high), (u_low, u_high) = self.hours_range, self.usd_range
            text += f"; {h_low:,.2f}-{h_high:,.2f} h, ${u_low:,.2f}-{u_high:,.2f} ({self.line.interval_basis})"
        elif self.line.basis == "projected_from_cpu_profile":
            text += "; no range: a CPU profile's MFU has never been checked against a GPU"
        if self.line.basis == "predicted":
            memory = self.line.memory
            text += f"; memory {gib(memory.required_bytes, 1, unit=False)} of {gib(memory.capacity_bytes, None)}"
            how = "predicted"
        if self.accum_steps_per_gpu != row.accum_steps:
            text += f"; {how} at {row.micro_batch}x{row.accum_steps}, speed and memory assumed the same"
        return text


@dataclass(frozen=True)
class Plan(Tabular):
    """Options ranked cheapest first, what was left out and why, and why the winner wins."""

    request: PlanRequest
    assumptions: Assumptions
    image_size: int | None
    """The image size of the rows considered (None when no row matched the model)."""
    options: tuple[Option, ...]
    left_out: dict[str, int]
    reason: str
    catalog: str = ""
    """The instance catalog priced, in words (its file, which prices, which providers)."""
    loader_costs: tuple[LoaderCost, ...] = ()
    """The loader rows' CPU cost per sample that sizes the cores feeding each option (empty: none found)."""
    loader_source: str = ""
    """Where those loader rows were looked for."""
    memory_agreement: Agreement | None = None
    """The estimator's measured agreement with public fit/OOM rows, which a predicted option's memory rests on
    (None: not known where the package runs without its repository's results)."""

    @property
    def oldest_price_observed(self) -> str | None:
        return min((option.line.instance.observed for option in self.options), default=None)

    def frame_rows(self) -> list[dict]:
        """One row per option, cheapest first (`to_frame()`, and the table a notebook shows)."""
        return [{"rank": rank, "usd_per_run": option.usd_per_run, "hours_per_run": option.hours_per_run,
                 **option.ranges, "usd_per_hour": option.usd_per_hour, "usd_basis": option.usd_basis,
                 "instance": option.line.instance.label, "configuration": option.configuration,
                 "micro_batch": option.line.row.micro_batch, "accum_steps_per_gpu": option.accum_steps_per_gpu,
                 "gpu_count": option.line.instance.gpu_count, "global_batch": option.line.global_batch,
                 "evidence": option.evidence}
                for rank, option in enumerate(self.options, start=1)]


def make_plan(rows: list[MeasuredRow], instances: tuple[Instance, ...], request: PlanRequest,
              assumptions: Assumptions, errors: ProjectionErrors = ProjectionErrors()) -> Plan:
    """Rank every fitting option by dollars per run (on-demand, or spot when asked); a projection from a GPU row
    states the error `errors` gives it (`bench.planner.rows.projection_errors`: the throughput model's validation).

    Example: two made-up L4 rows; the larger micro-batch is faster, so it wins on the one instance:
        >>> from bench.cost.catalog import load_catalog
        >>> def row(micro, accum, samples_per_s):
        ...     return MeasuredRow(dict(status="ok", cell_id=f"{micro}x{accum}", experiment="e", profile="cuda",
        ...         model="m", image_size=224, micro_batch=micro, accum_steps=accum, precision="bf16", checkpointing="off",
        ...         optimizer="adamw", device_type="cuda", device_name="NVIDIA L4", samples_per_s=samples_per_s,
        ...         mfu_pct=None, model_flops_per_sample=None, peak_memory_bytes=2**33))
        >>> g6 = tuple(i for i in load_catalog().select() if i.instance == "g6.xlarge")
        >>> plan = make_plan([row(64, 2, 400.0), row(8, 16, 300.0)], g6,
        ...                  PlanRequest(model="m", effective_batch=128), Assumptions())
        >>> [o.configuration for o in plan.options]
        ['64x2 per GPU bf16 ckpt-off adamw', '8x16 per GPU bf16 ckpt-off adamw']
    """
    rows = [row for row in rows if row.model == request.model
            and (request.image_size is None or row.image_size == request.image_size)]
    sizes = sorted({row.image_size for row in rows})
    if len(sizes) > 1:
        raise PlanError(f"rows for {request.model} have image sizes {sizes}: choose one (--image-size)")
    left_out: Counter[str] = Counter()
    best: dict[tuple, Option] = {}
    measured = measured_scaling(rows)
    for row in rows:
        refusal = not_priced(row, assumptions)
        if refusal is not None:
            left_out[refusal.label] += 1
            continue
        for instance in instances:
            if not row.serves(instance.gpu):
                continue
            option = _option(row, instance, request, assumptions, measured, left_out, errors)
            if option is not None:
                # Rows of one configuration measured at another accumulation re-split to the same option;
                # any other axis (channels_last, attention, ...) keeps them apart.
                key = (instance, option.accum_steps_per_gpu, row.key(ignore=("accum_steps",)))
                if key not in best or _better_evidence(option, best[key]):
                    best[key] = option
    order = ((lambda o: (o.hours_per_run, o.usd_per_run)) if request.rank_by == "hours"
             else (lambda o: (o.usd_per_run, o.hours_per_run)))
    options = tuple(sorted(_named(best.values()), key=order))
    return Plan(request, assumptions, sizes[0] if sizes else None, options, dict(left_out),
                explain(options, request.rank_by))


def _named(options: Iterable[Option]) -> list[Option]:
    """The options, each with the axes that tell its row from another option's (beyond its label) as its variant."""
    options = list(options)
    apart = [name for name in varying(option.line.row.key() for option in options) if name not in LABELLED]
    return [replace(option, variant=" ".join(f"{name}={dict(option.line.row.key())[name]}" for name in apart))
            for option in options]


def _option(row: MeasuredRow, instance: Instance, request: PlanRequest, assumptions: Assumptions,
            measured: MeasuredScaling, left_out: Counter[str], errors: ProjectionErrors) -> Option | None:
    per_step = row.micro_batch * instance.gpu_count
    if request.effective_batch % per_step:
        if row.predicted_gpu is None:  # a predicted configuration has a row for each GPU count its split divides
            left_out[f"micro-batch x GPUs does not divide the effective batch {request.effective_batch}"] += 1
        return None
    line = price_line(row, instance, request.workload, assumptions, measured,
                      accum_steps_per_gpu=request.effective_batch // per_step, errors=errors)
    if line.cost is None:
        left_out[{"does_not_fit": "do not fit in memory"}.get(line.status, "no speed (no peak or no MFU)")] += 1
        return None
    option = Option(line, request.effective_batch // per_step, spot=request.spot)
    if request.spot and instance.spot_usd_per_hour is None:
        left_out["no spot price"] += 1
    elif request.budget_usd is not None and option.usd_per_run > request.budget_usd:
        left_out[f"over the ${request.budget_usd:g} budget"] += 1
    elif request.deadline_hours is not None and option.hours_per_run > request.deadline_hours:
        left_out[f"past the {request.deadline_hours:g} h deadline"] += 1
    else:
        return option
    return None


def _better_evidence(new: Option, old: Option) -> bool:
    # Same instance and configuration from two rows: the better-evidenced one stands; at equal
    # evidence the exact accumulation, then the slower (the conservative) one.
    def rank(option: Option) -> tuple:
        exact = option.accum_steps_per_gpu == option.line.row.accum_steps
        return _EVIDENCE[option.line.basis or ""], not exact, -option.hours_per_run
    return rank(new) < rank(old)


def explain(options: tuple[Option, ...], rank_by: Literal["cost", "hours"] = "cost") -> str:
    """One line: why the first option beats the second (faster, cheaper per hour, or both; ranked by hours: how
    much faster, and at what price).

    >>> explain(())
    'nothing fits the request'
    """
    if not options:
        return "nothing fits the request"
    winner = options[0]
    head = (f"{winner.line.instance.label}, {winner.configuration}: {_usd(winner)} "
            f"{winner.usd_basis} for {_hours(winner)} ({winner.basis_text})")
    if len(options) == 1:
        return f"{head}: the only option that fits"
    runner = options[1]
    versus = f"vs {_usd(runner)} for the runner-up, "
    speed = runner.hours_per_run / winner.hours_per_run  # > 1: the winner is faster
    price = runner.usd_per_hour / winner.usd_per_hour  # > 1: the winner is cheaper per hour
    faster = "as fast" if abs(speed - 1) < 0.005 else f"{speed:.2f}x faster"
    overlap = _overlap(winner, runner)
    if runner.line.instance == winner.line.instance:
        return f"{head} {versus}{runner.configuration} on the same instance: {faster}{overlap}"
    versus += f"{runner.line.instance.label}, {runner.configuration}: "
    if rank_by == "hours":
        dearer = runner.usd_per_run / winner.usd_per_run  # > 1: the winner is also cheaper per run
        cost = "and cheaper per run" if dearer >= 1 else f"at {1 / dearer:.2f}x the dollars per run"
        return f"{head} {versus}{faster} {cost}{overlap}"
    if speed >= 1 and price >= 1:
        why = f"{faster} and {price:.2f}x cheaper per hour"
    elif speed >= 1:
        why = f"{faster}, which outweighs {1 / price:.2f}x the hourly price"
    else:
        why = f"{price:.2f}x cheaper per hour, which outweighs being {1 / speed:.2f}x slower"
    return f"{head} {versus}{why}{overlap}"


def _usd(option: Option) -> str:
    """`$12.34`, or `$12.34 ($10.10-15.00)` where the speed has an interval (`Option.hours_range`)."""
    usd = option.usd_range
    return f"${option.usd_per_run:,.2f}" + ("" if usd is None else f" (${usd[0]:,.2f}-{usd[1]:,.2f})")


def _hours(option: Option) -> str:
    hours = option.hours_range
    return f"{option.hours_per_run:,.1f} h" + ("" if hours is None else f" ({hours[0]:,.1f}-{hours[1]:,.1f} h)")


def _overlap(winner: Option, runner: Option) -> str:
    """A note when the runner-up's dollar range reaches the winner's: the ranking is within the error."""
    low = runner.usd_range[0] if runner.usd_range else runner.usd_per_run
    high = winner.usd_range[1] if winner.usd_range else winner.usd_per_run
    return "; the two overlap within their stated error, so either may be cheaper" if low <= high else ""
