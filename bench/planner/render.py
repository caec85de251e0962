"""A plan in words and as JSON: `plan_text` for the console, `plan_record` for `--format json`, both read from the one
`bench.planner.ranking.Plan`, so the two never disagree."""

from __future__ import annotations

import textwrap
from dataclasses import asdict
from datetime import date
from typing import Any

from bench.cost.catalog import stale_note
from bench.cost.feeding import TRAINING_PROCESS_CORES, Feeding, LoaderCost
from bench.cost.outputs import context_lines, feeding_lines
from bench.cost.price import line_feeding, record
from bench.memory.validate import agreement_text
from bench.planner.ranking import Option, Plan


WIDTH = 120
"""`bench plan`'s lines are at most this wide when stdout is not a terminal (`--wide`: every column, unwrapped)."""

NOT_INCLUDED = ("not included: reading and decoding the data (the speed is the training step's on inputs already on "
                "the GPU; the feeding line says the host cores the input pipeline needs), evaluation, checkpoint "
                "saving, and start-up (provisioning, installing, building and warming up the model)")
"""What a plan's hours and dollars leave out, said once on every plan."""


def plan_text(plan: Plan, top: int, wide: bool = False, width: int = WIDTH) -> str:
    """Console text: the ranked options (hours and dollars as ranges where predicted), why the winner wins, then
    what the plan assumes, leaves out and left out, the basis of each option's speed, the cores that feed the
    winner and the estimator's agreement with public fit/OOM rows. Lines are wrapped at `width` (the command passes
    the terminal's) unless `wide`, which adds the feeding and basis columns to the table. The JSON
    (`plan_record`) says the same from the same record."""
    request, loader_costs = plan.request, plan.loader_costs
    sizes = [] if plan.image_size is None else [plan.image_size]
    cpu_projected = any(option.line.basis == "projected_from_cpu_profile" for option in plan.options)
    basis = "spot" if request.spot else "on-demand"
    limits = [f"budget ${request.budget_usd:g}" if request.budget_usd else "",
              f"deadline {request.deadline_hours:g} h" if request.deadline_hours else ""]
    ranked_by = "hours per run" if request.rank_by == "hours" else f"{basis} USD per run"
    out = [f"plan: {request.model} at effective batch {request.effective_batch}, ranked by {ranked_by}"
           + "".join(f", {limit}" for limit in limits if limit)]
    feeds = {id(option): line_feeding(option.line, list(loader_costs)) for option in plan.options}
    shown = plan.options[:top]
    out += _rank_table(shown, feeds, wide)
    if len(plan.options) > top:
        out.append(f"  ... {len(plan.options) - top} more (--top)")
    bases = list(dict.fromkeys(option.basis_text for option in shown))
    notes = [f"why: {plan.reason}"]
    if not wide:  # each option's basis (hours and dollars as ranges where predicted), a shared basis said once
        notes += [f"basis [{index}]: {text}" for index, text in enumerate(bases, start=1)]
        notes += [f"  {rank}: [{bases.index(option.basis_text) + 1}]"
                  + (f" {option.evidence.removeprefix(option.basis_text).lstrip('; ')}"
                     if option.evidence != option.basis_text else "")
                  for rank, option in enumerate(shown, start=1)]
    measured = any(option.line.basis != "predicted" for option in plan.options) or not plan.options
    context = context_lines(request.workload, plan.assumptions, sizes, plan.catalog, plan.oldest_price_observed,
                       cpu_projected, [option.line.instance for option in plan.options],
                       "the measured image size" if measured else "the predicted image size")
    context.append(NOT_INCLUDED)
    context += feeding_lines(sizes, list(loader_costs), plan.loader_source)
    if plan.left_out:
        context.append("left out: " + "; ".join(f"{count} {why}" for why, count in plan.left_out.items()))
    notes += [f"  {line}" for line in context]
    if plan.options and loader_costs:  # without loader rows the feeding line above already says so, once
        notes.append(f"feeding: {_winner_feeding(plan.options[0], feeds[id(plan.options[0])])}")
    notes.append(f"memory answers: {agreement_text(plan.memory_agreement)}")
    for note in notes:
        indent = note[:len(note) - len(note.lstrip())]
        out += [note] if wide else wrapped(note.lstrip(), indent, width)
    return "\n".join(out)


def _rank_table(shown: tuple[Option, ...], feeds: dict, wide: bool) -> list[str]:
    """The ranked options, one line each, every column as wide as its longest entry (a long instance label moves
    the next column for every line alike); `wide` adds the feeding and the basis."""
    if not shown:
        return []
    feeding = {id(o): feeds[id(o)][0].describe() if feeds[id(o)] else "no loader rows" for o in shown}
    instance_width = max(len("instance"), *(len(option.line.instance.label) for option in shown))
    configuration_width = max(len("configuration"), *(len(option.configuration) for option in shown))
    feeding_width = max(len("feeding"), *(len(text) for text in feeding.values()))
    head = f"  {'rank':>4}  {'usd_per_run':>11}  {'hours_per_run':>13}  {'instance':<{instance_width}}  "
    lines = [head + (f"{'configuration':<{configuration_width}}  {'feeding':<{feeding_width}}  basis" if wide
                     else "configuration")]
    for rank, option in enumerate(shown, start=1):
        line = (f"  {rank:>4}  {option.usd_per_run:>11,.2f}  {option.hours_per_run:>13,.2f}  "
                f"{option.line.instance.label:<{instance_width}}  ")
        lines.append(line + (f"{option.configuration:<{configuration_width}}  "
                             f"{feeding[id(option)]:<{feeding_width}}  {option.evidence}" if wide
                             else option.configuration))
    return lines


def wrapped(text: str, indent: str = "", width: int = WIDTH) -> list[str]:
    """`text` in lines of at most `width` characters, continuation lines indented four more spaces."""
    return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + "    ",
                         break_long_words=False, break_on_hyphens=False)


def _winner_feeding(option, fed: tuple[Feeding, LoaderCost, str] | None) -> str:
    """One line: the cores the recommended option needs to feed its GPUs, and whether it has them."""
    if fed is None:
        return "not estimated (no loader rows; see above)"
    need, cost, note = fed
    instance = option.line.instance
    head = (f"{instance.label} at {option.line.samples_per_s_per_gpu:,.0f} samples/s per GPU needs "
            f"{need.cores_per_gpu:.1f} decoding cores per GPU + {TRAINING_PROCESS_CORES:g} for its training process: "
            f"{need.vcpus_needed} vCPUs")
    has = ("; the catalog does not list its vCPUs" if need.vcpus is None else
           f"; it has {need.vcpus}" + ("" if need.feeds else ": it CANNOT FEED its GPUs at this speed"))
    return f"{head}{has} ({cost.describe()}{note})"


def plan_record(plan: Plan, top: int) -> dict[str, Any]:
    """`bench plan --format json`'s body: the request, what was left out, the ranked options (the first `top`), why
    the winner wins and the estimator's measured agreement with public fit/OOM rows (as `bench probe` gives it):
    what `plan_text` says, from the same record."""
    request, agreement = plan.request, plan.memory_agreement
    return {"request": {"model": request.model, "effective_batch": request.effective_batch,
                        "image_size": request.image_size, "budget_usd": request.budget_usd,
                        "deadline_hours": request.deadline_hours, "spot": request.spot,
                        "rank_by": request.rank_by},
            "catalog": plan.catalog, "assumptions": {"dataset_size": request.workload.dataset_size,
                                                     "epochs": request.workload.epochs,
                                                     "samples_per_run": request.workload.samples_per_run,
                                                     **asdict(plan.assumptions)},
            "image_size": plan.image_size, "left_out": plan.left_out,
            "oldest_price_observed": plan.oldest_price_observed,
            "stale_prices": stale_note([o.line.instance for o in plan.options], date.today()),
            "options_total": len(plan.options),
            "options": [{**frame_row, "line": record(option.line, request.workload.samples_per_run,
                                                     list(plan.loader_costs),
                                                     strategy=" ".join(filter(None, (option.line.row.strategy,
                                                                                     option.variant))))}
                        for frame_row, option in zip(plan.frame_rows()[:top], plan.options)],
            "reason": plan.reason,
            "estimator_agreement": agreement and agreement.document()}
