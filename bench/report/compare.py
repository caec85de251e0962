"""Two sets of rows side by side (`bench compare A B`): matched on the configuration key, each figure's two values,
their ratio B/A and whether the difference is real given both rows' spreads. Pure: rows in, a `Comparison` out.

The sides are measured rows (a runs file), computed ones (`bench estimate`, `bench predict`) or a plan's options
(`bench plan --format json`), each turned into `Entry`s first (`entries_from_rows`, `entries_from_plan`). Whether a
difference is real follows pyperf's and asv's practice, in this order:

1. one side a prediction with a stated band (`samples_per_s_low/high`, the plan's ranges) and the other a
   measurement: the measured value inside the band or not;
2. both sides measured rows that keep their raw step times (`step_times_ms`, at least `MIN_STEPS` each): a two-sided
   Mann-Whitney U test on them (scipy; asv's test), real when p < `SIGNIFICANCE`; samples/s and MFU are the
   effective batch over the step, so the same test decides them;
3. both sides with an interval (a measured row's 95 % interval of the median step, or a band): the intervals apart
   means real, overlapping means not;
4. otherwise a stated noise threshold: real when B/A lies outside [1/(1+t), 1+t] (asv's default factor 1.1: t=0.1).

Example: two measured rows of one cell (no raw steps kept), B twice as slow with tight intervals:
    >>> row = {"cell_id": "c-1", "status": "ok", "model": "m", "image_size": 32, "micro_batch": 8, "accum_steps": 1,
    ...        "effective_batch": 8, "device_type": "cpu", "step_time_median_ms": 100.0,
    ...        "step_time_ci95_low_ms": 99.0, "step_time_ci95_high_ms": 101.0}
    >>> slow = {**row, "step_time_median_ms": 200.0, "step_time_ci95_low_ms": 198.0, "step_time_ci95_high_ms": 202.0}
    >>> result = compare(entries_from_rows([row], "measured"), entries_from_rows([slow], "measured"))
    >>> [(f.figure, f.ratio, f.verdict) for f in result.pairs[0].figures]
    [('step_time_ms', 2.0, 'real')]
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from bench.results.keys import Key, configuration_key, key_columns, sort_key, variant
from bench.units import GIB

SIGNIFICANCE = 0.05
"""The Mann-Whitney test's two-sided p-value below which a difference of raw step times is real (asv's level)."""
MIN_STEPS = 5
"""Fewer raw steps than this on a side: too few for the test (its smallest p-value at 4 and 4 steps is 0.029)."""

NOISE_THRESHOLD = 0.10
"""Relative difference taken as noise where no spread is known: asv's default factor of 1.1."""

Kind = Literal["measured", "estimated", "predicted", "plan"]
Verdict = Literal["real", "not real", "inside band", "outside band"]
Method = Literal["band", "mann-whitney", "ci95", "threshold"]


@dataclass(frozen=True)
class Figure:
    name: str
    label: str
    """Column heading: unit included."""
    digits: int


FIGURES: tuple[Figure, ...] = (
    Figure("samples_per_s", "samples/s", 1), Figure("step_time_ms", "step ms", 1),
    Figure("peak_memory_gib", "peak GiB", 2), Figure("peak_allocated_gib", "peak alloc GiB", 2),
    Figure("peak_reserved_gib", "peak reserved GiB", 2), Figure("mfu_pct", "MFU %", 1),
    Figure("hours_per_run", "hours/run", 2), Figure("usd_per_run", "$/run", 2))
"""Every figure compared, in the order shown; a pair shows those both sides have."""


@dataclass(frozen=True)
class Value:
    """One figure of one row: the value and, where known, its interval (`low`..`high`)."""

    value: float
    low: float | None = None
    high: float | None = None
    interval: Literal["ci95", "band"] | None = None
    """ci95: a measured row's 95 % interval of the median; band: a prediction's stated error band."""
    steps_ms: tuple[float, ...] = ()
    """A measured row's raw step times (`step_times_ms`), for the figures derived from its step; empty elsewhere."""


@dataclass(frozen=True)
class Entry:
    """One row of a side, in the terms both sides share."""

    key: Key
    label: str
    """What a reader recognises: `resnet50 224px 64x2 bf16 ckpt-off adamw`, then the device."""
    kind: Kind
    device: str
    """Where it ran or is predicted for: a catalog GPU key, a GPU's name, `cpu`, or `cuda` (an estimate for any GPU)."""
    instance: str | None = None
    """The plan's instance (provider and type); None for rows."""
    figures: dict[str, Value] = field(default_factory=dict)
    flags: tuple[str, ...] = ()
    """noisy, loaded, remeasured: what a reader must know before trusting the row's time."""


@dataclass(frozen=True)
class FigureComparison:
    figure: str
    a: Value
    b: Value
    ratio: float | None
    """B / A; None where A is 0."""
    verdict: Verdict
    method: Method
    how: str
    """The rule that gave the verdict, in words."""


@dataclass(frozen=True)
class Pair:
    a: Entry
    b: Entry
    figures: list[FigureComparison]


@dataclass(frozen=True)
class Comparison:
    a_source: str
    b_source: str
    pairs: list[Pair]
    unmatched_a: list[Entry]
    unmatched_b: list[Entry]
    left_out_a: int
    """Rows of A with no figures to compare (failed cells: oom, error, skipped, timeout)."""
    left_out_b: int
    threshold: float


def _number(value: Any) -> float | None:
    """A finite float, or None for an empty field (None, NaN, pandas' NA, '')."""
    if value is None or value == "":
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _device(row: Mapping[str, Any], kind: Kind) -> str:
    if kind == "predicted":
        return str(row.get("gpu") or "cuda")
    if kind == "estimated" or row.get("device_type") != "cuda":
        return "cuda" if row.get("device_type") == "cuda" else "cpu"
    from bench.measure.hardware import find_gpu

    name = str(row.get("device_name") or "")
    spec = find_gpu(name) if name else None
    return spec.gpu if spec else name or "cuda"


def label_of(row: Mapping[str, Any]) -> str:
    """`resnet50 224px 64x2 bf16 ckpt-off adamw`, then the axes away from their default."""
    words = [f"{row.get('model')} {row.get('image_size')}px {row.get('micro_batch')}x{row.get('accum_steps')}",
             *(str(row[name]) for name in ("precision",) if row.get(name)),
             *(f"ckpt-{row['checkpointing']}" for _ in (1,) if row.get("checkpointing")),
             *(str(row[name]) for name in ("optimizer",) if row.get(name))]
    shown = ("model", "image_size", "micro_batch", "accum_steps", "precision", "checkpointing", "optimizer")
    return " ".join(filter(None, (*words, variant(row, named=shown))))


def _row_figures(row: Mapping[str, Any], kind: Kind) -> dict[str, Value]:
    """The figures of a runs-file row: a measured one's with the 95 % interval of its median step, a prediction's
    with its band (samples/s low..high, carried over to the step time and MFU)."""
    figures: dict[str, Value] = {}
    samples, mfu = _number(row.get("samples_per_s")), _number(row.get("mfu_pct"))
    step = _number(row.get("predicted_step_time_ms" if kind == "predicted" else "step_time_median_ms"))
    if kind == "predicted":
        low, high = _number(row.get("samples_per_s_low")), _number(row.get("samples_per_s_high"))
        band = samples is not None and low is not None and high is not None
        if samples is not None:
            figures["samples_per_s"] = Value(samples, low, high, "band") if band else Value(samples)
        if step is not None:  # the step is the effective batch over samples/s: the band's ends swap
            figures["step_time_ms"] = (Value(step, step * samples / high, step * samples / low, "band") if band
                                       else Value(step))
        if mfu is not None:
            figures["mfu_pct"] = Value(mfu, mfu * low / samples, mfu * high / samples, "band") if band else Value(mfu)
    else:
        ci_low, ci_high = _number(row.get("step_time_ci95_low_ms")), _number(row.get("step_time_ci95_high_ms"))
        ci = step is not None and ci_low is not None and ci_high is not None and ci_low > 0
        steps = _steps(row.get("step_times_ms"))
        if step is not None:
            figures["step_time_ms"] = Value(step, ci_low, ci_high, "ci95", steps) if ci else Value(step, steps_ms=steps)
        # samples/s and MFU are inverse to the median step: its interval carries over, ends swapped
        for name, number in (("samples_per_s", samples), ("mfu_pct", mfu)):
            if number is not None:
                figures[name] = Value(number, number * step / ci_high, number * step / ci_low, "ci95", steps) if ci \
                    else Value(number, steps_ms=steps)
    for name in ("peak_memory", "peak_allocated", "peak_reserved"):
        number = _number(row.get(f"{name}_bytes"))
        if number is not None:
            figures[f"{name}_gib"] = Value(number / GIB)
    return figures


def _steps(value: Any) -> tuple[float, ...]:
    """A row's raw step times: the reader's list, or the runs file's JSON text; () where absent or unreadable."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return ()
    if not isinstance(value, (list, tuple)):
        return ()
    steps = tuple(number for number in map(_number, value) if number is not None)
    return steps if len(steps) == len(value) else ()


def entries_from_rows(rows: Iterable[Mapping[str, Any]], kind: Kind) -> list[Entry]:
    """The rows of a runs file (`bench.results.read.records`) as entries; failed rows (no figures) are left out."""
    entries = []
    for row in rows:
        if row.get("status") not in ("ok", "estimated", "predicted"):
            continue
        flags = tuple(name for name in ("noisy", "loaded", "remeasured") if row.get(name) is True)
        device = _device(row, kind)
        entries.append(Entry(configuration_key(row), f"{label_of(row)} @ {device}", kind, device,
                             figures=_row_figures(row, kind), flags=flags))
    return entries


def entries_from_plan(options: Iterable[Mapping[str, Any]]) -> list[Entry]:
    """The options of a plan's JSON document (`options`, docs/json.md) as entries: per-GPU samples/s with its band,
    peak memory, hours and dollars per run with their ranges."""
    entries = []
    for option in options:
        line = option.get("line") or {}
        figures: dict[str, Value] = {}
        for name, value_key, low_key, high_key in (
                ("samples_per_s", "samples_per_s_per_gpu", "samples_per_s_per_gpu_low", "samples_per_s_per_gpu_high"),
                ("hours_per_run", "hours_per_run", "hours_per_run_low", "hours_per_run_high"),
                ("usd_per_run", "usd_per_run", "usd_per_run_low", "usd_per_run_high")):
            source = option if name != "samples_per_s" else line
            value, low, high = (_number(source.get(k)) for k in (value_key, low_key, high_key))
            if value is not None:
                both = low is not None and high is not None
                figures[name] = Value(value, min(low, high), max(low, high), "band") if both else Value(value)
        peak = _number(line.get("peak_memory_gib"))
        if peak is not None:
            figures["peak_memory_gib"] = Value(peak)
        device = str(line.get("gpu") or "cuda")
        instance = str(option.get("instance") or "") or None
        # A plan's line names only some axes (cost.csv's columns): its key holds those, and matches on them alone.
        unstated = [name for name in key_columns() if name not in line]
        entries.append(Entry(configuration_key(line, ignore=unstated), f"{label_of(line)} @ {instance or device}", "plan", device,
                             instance, figures))
    return entries


def _matches(a: Entry, b: Entry) -> bool:
    """Same configuration (in the axes both keys hold: a plan's names fewer); and where either side is computed (a
    prediction, an estimate, a plan), for the same device (an estimate for any GPU matches every GPU) and, between
    two plans, the same instance. Two measured rows match across devices: comparing machines is what they are for."""
    shared = set(dict(a.key)) & set(dict(b.key))
    if [item for item in a.key if item[0] in shared] != [item for item in b.key if item[0] in shared]:
        return False
    if a.instance and b.instance and a.instance != b.instance:
        return False
    if a.kind == "measured" and b.kind == "measured":
        return True
    if a.device == b.device:
        return True
    gpu = {a.device, b.device} - {"cuda"}
    return len(gpu) == 1 and "cuda" in (a.device, b.device) and gpu != {"cpu"}


def _interval(value: Value) -> tuple[float, float] | None:
    return None if value.low is None or value.high is None else (value.low, value.high)


def judge(a: Value, b: Value, a_kind: Kind, b_kind: Kind, threshold: float = NOISE_THRESHOLD) -> tuple[Verdict, Method, str]:
    """Whether B differs from A, and by which rule (module docstring).

    >>> judge(Value(100.0, 90.0, 110.0, "band"), Value(104.0), "predicted", "measured")
    ('inside band', 'band', "measured inside the prediction's band 90..110")
    >>> judge(Value(100.0), Value(105.0), "measured", "measured")
    ('not real', 'threshold', 'no spread kept: within the 10 % noise threshold')
    """
    for predicted, measured, p_kind, m_kind in ((a, b, a_kind, b_kind), (b, a, b_kind, a_kind)):
        band = _interval(predicted)
        if p_kind in ("predicted", "plan") and m_kind == "measured" and predicted.interval == "band" and band:
            inside = band[0] <= measured.value <= band[1]
            where = "inside" if inside else "outside"
            return f"{where} band", "band", f"measured {where} the prediction's band {band[0]:.4g}..{band[1]:.4g}"
    if a_kind == b_kind == "measured" and min(len(a.steps_ms), len(b.steps_ms)) >= MIN_STEPS:
        from scipy.stats import mannwhitneyu  # imported here: only a comparison of raw steps needs scipy

        p_value = float(mannwhitneyu(a.steps_ms, b.steps_ms, alternative="two-sided").pvalue)
        real = p_value < SIGNIFICANCE
        return (("real" if real else "not real"), "mann-whitney",
                f"raw steps ({len(a.steps_ms)} and {len(b.steps_ms)}): Mann-Whitney p={p_value:.2g} "
                f"{'<' if real else '>='} {SIGNIFICANCE:g}")
    a_range, b_range = _interval(a), _interval(b)
    if a_range and b_range:
        apart = a_range[1] < b_range[0] or b_range[1] < a_range[0]
        words = {"ci95": "95 % intervals", "band": "bands"}
        what = " and ".join(dict.fromkeys(words[v.interval] for v in (a, b) if v.interval))
        return ("real", "ci95", f"{what} apart") if apart else ("not real", "ci95", f"{what} overlap")
    ratio = b.value / a.value if a.value else math.inf
    real = not (1 / (1 + threshold) <= ratio <= 1 + threshold)
    return (("real" if real else "not real"), "threshold",
            f"no spread kept: {'beyond' if real else 'within'} the {threshold:.0%} noise threshold".replace("%", " %"))


def compare_pair(a: Entry, b: Entry, threshold: float = NOISE_THRESHOLD) -> Pair:
    """Every figure both entries have, in `FIGURES` order."""
    figures = []
    for figure in FIGURES:
        if figure.name in a.figures and figure.name in b.figures:
            va, vb = a.figures[figure.name], b.figures[figure.name]
            verdict, method, how = judge(va, vb, a.kind, b.kind, threshold)
            figures.append(FigureComparison(figure.name, va, vb, vb.value / va.value if va.value else None,
                                            verdict, method, how))
    return Pair(a, b, figures)


def compare(a: list[Entry], b: list[Entry], *, a_source: str = "A", b_source: str = "B",
            threshold: float = NOISE_THRESHOLD, left_out: tuple[int, int] = (0, 0)) -> Comparison:
    """Every matching (A, B) pair compared; the entries of either side without a partner listed, never dropped."""
    pairs = [compare_pair(x, y, threshold) for x in a for y in b if _matches(x, y)]
    matched_a = {id(p.a) for p in pairs}
    matched_b = {id(p.b) for p in pairs}
    pairs.sort(key=lambda p: (sort_key(p.a.key), p.a.device, p.b.device, p.b.instance or ""))
    return Comparison(a_source, b_source, pairs, [e for e in a if id(e) not in matched_a],
                      [e for e in b if id(e) not in matched_b], left_out[0], left_out[1], threshold)


@dataclass(frozen=True)
class Summary:
    """One figure over every pair: how many, the median |B/A - 1|, how many real or outside the band."""

    figure: str
    pairs: int
    median_error: float
    real: int
    """Pairs whose difference is real (or whose measured value lies outside the band)."""
    banded: int
    """Pairs judged against a prediction's band."""
    inside: int


def summarise(comparison: Comparison) -> list[Summary]:
    """Per figure: `speed: 12 pairs, median difference 8 %, 10 of 12 inside the band`."""
    found = []
    for figure in FIGURES:
        rows = [f for pair in comparison.pairs for f in pair.figures if f.figure == figure.name]
        errors = [abs(f.ratio - 1) for f in rows if f.ratio is not None]
        if not rows:
            continue
        found.append(Summary(figure.name, len(rows), statistics.median(errors) if errors else math.nan,
                             sum(f.verdict in ("real", "outside band") for f in rows),
                             sum(f.method == "band" for f in rows), sum(f.verdict == "inside band" for f in rows)))
    return found


def summary_line(summary: Summary) -> str:
    """`samples/s: 12 pairs, median difference 8 %, 10 of 12 inside the band` (or `3 of 12 real`).

    >>> summary_line(Summary("samples_per_s", 12, 0.08, 2, 12, 10))
    'samples/s: 12 pairs, median difference 8 %, 10 of 12 inside the band'
    """
    label = next(f.label for f in FIGURES if f.name == summary.figure)
    told = [f"{summary.inside} of {summary.banded} inside the band"] if summary.banded else []
    judged = summary.pairs - summary.banded
    if judged:
        told.append(f"{summary.real - (summary.banded - summary.inside)} of {judged} differ beyond their spreads")
    return f"{label}: {summary.pairs} pairs, median difference {summary.median_error:.0%}, ".replace("%", " %") + \
        ", ".join(told)


_METHOD_WORDS = {"band": "the measured value against the prediction's stated band",
                 "mann-whitney": f"a two-sided Mann-Whitney U test on the two rows' raw step times: real when "
                                 f"p < {SIGNIFICANCE:g} (a drifting machine can make a difference real; see the flags)",
                 "ci95": "the two rows' 95 % intervals (of the median step for a measured row, the band for a "
                         "prediction): apart is real, overlapping is not",
                 "threshold": "no spread on one side or both: real only beyond the noise threshold"}


def method_notes(comparison: Comparison) -> list[str]:
    """One line per rule the comparison used, saying what it means."""
    used = dict.fromkeys(f.method for pair in comparison.pairs for f in pair.figures)
    words = {**_METHOD_WORDS, "threshold": f"{_METHOD_WORDS['threshold']} of {comparison.threshold:.0%} "
                                           "(asv's default factor)".replace("%", " %")}
    return [f"{method}: {words[method]}" for method in used]


def _shown(value: Value, digits: int) -> str:
    text = f"{value.value:.{digits}f}"
    if value.low is not None and value.high is not None:
        text += f" [{value.low:.{digits}f}–{value.high:.{digits}f}]"
    return text


def table_rows(comparison: Comparison) -> list[dict[str, str]]:
    """The comparison as text rows, one per pair and figure: what the text and markdown tables show."""
    digits = {figure.name: figure.digits for figure in FIGURES}
    labels = {figure.name: figure.label for figure in FIGURES}
    rows = []
    for pair in comparison.pairs:
        configuration = pair.a.label if pair.a.label == pair.b.label else f"{pair.a.label} | B @ " + \
            (pair.b.instance or pair.b.device)
        flags = "; ".join(filter(None, (f"A {' '.join(pair.a.flags)}" if pair.a.flags else "",
                                        f"B {' '.join(pair.b.flags)}" if pair.b.flags else "")))
        for index, found in enumerate(pair.figures):
            rows.append({"configuration": configuration if index == 0 else "", "figure": labels[found.figure],
                         "A": _shown(found.a, digits[found.figure]), "B": _shown(found.b, digits[found.figure]),
                         "B/A": "" if found.ratio is None else f"{found.ratio:.3f}",
                         "difference": f"{found.verdict} ({found.method})", "flags": flags if index == 0 else ""})
    return rows


def unmatched_lines(comparison: Comparison, shown: int = 10) -> list[str]:
    """`A: 3 rows without a match in B: ...` (the first `shown` named), and any rows left out for having no
    figures."""
    lines = []
    for side, entries, other, left_out in (("A", comparison.unmatched_a, "B", comparison.left_out_a),
                                           ("B", comparison.unmatched_b, "A", comparison.left_out_b)):
        if entries:
            more = f"; and {len(entries) - shown} more (all in --format json)" if len(entries) > shown else ""
            lines.append(f"{side}: {len(entries)} rows without a match in {other}: "
                         + "; ".join(entry.label for entry in entries[:shown]) + more)
        if left_out:
            lines.append(f"{side}: {left_out} rows left out: failed cells (oom, error, skipped, timeout), no figures")
    return lines


def _error_pct(predicted: Value | None, measured: Value | None) -> float | None:
    """The prediction's error: predicted / measured - 1, in %."""
    if predicted is None or measured is None or not measured.value:
        return None
    return 100 * (predicted.value / measured.value - 1)


def predicted_beside_measured(comparison: Comparison) -> list[dict[str, object]]:
    """Per measured cell (side B) with a prediction (side A): predicted and measured peak allocated memory and
    samples/s, the prediction's error, and whether the measured speed lies inside the prediction's band."""
    rows = []
    for pair in comparison.pairs:
        peak = [pair.a.figures.get("peak_allocated_gib"), pair.b.figures.get("peak_allocated_gib")]
        speed = [pair.a.figures.get("samples_per_s"), pair.b.figures.get("samples_per_s")]
        band = next((f.verdict for f in pair.figures if f.figure == "samples_per_s" and f.method == "band"), None)
        rows.append({"cell": pair.b.label, "predicted peak GiB": None if peak[0] is None else round(peak[0].value, 2),
                     "measured peak GiB": None if peak[1] is None else round(peak[1].value, 2),
                     "peak error %": _round(_error_pct(*peak)),
                     "predicted samples/s": None if speed[0] is None else _shown(speed[0], 1),
                     "measured samples/s": None if speed[1] is None else round(speed[1].value, 1),
                     "speed error %": _round(_error_pct(*speed)),
                     "inside band": {"inside band": "yes", "outside band": "NO"}.get(band or "", ""),
                     "flags": " ".join(pair.b.flags).upper()})
    return rows


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def prediction_summary(comparison: Comparison) -> list[str]:
    """`speed: 12 cells, median error 8 %, 10 of 12 inside the band`, and the same for peak memory (no band)."""
    lines = []
    for name, figure in (("speed", "samples_per_s"), ("peak memory", "peak_allocated_gib")):
        found = [(pair.a.figures.get(figure), pair.b.figures.get(figure), pair) for pair in comparison.pairs]
        errors = [abs(error) for a, b, _ in found if (error := _error_pct(a, b)) is not None]
        if not errors:
            continue
        verdicts = [f.verdict for _, _, pair in found for f in pair.figures if f.figure == figure and f.method == "band"]
        band = (f", {verdicts.count('inside band')} of {len(verdicts)} inside the band" if verdicts
                else ", no band stated")
        lines.append(f"{name}: {len(errors)} cells, median error {statistics.median(errors):.0f} %{band}")
    return lines
