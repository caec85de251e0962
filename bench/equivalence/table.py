"""The equivalence results as a reader sees them: one comparison in the terminal, the study's tables and chart.

The study's `equivalence.md` and `equivalence.png` are rendered from its `equivalence.csv` only
(`write_study_tables`), so they regenerate byte for byte from the rows.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from rich.table import Table  # noqa: E402

from bench.equivalence.compare import TOLERANCE, Comparison  # noqa: E402
from bench.equivalence.variants import VARIANTS  # noqa: E402
from bench.results.read import read_equivalence  # noqa: E402
from bench.results.store import EQUIVALENCE_CSV  # noqa: E402

BATCHNORM_PANEL_VARIANTS = ("correct", "checkpoint", "frozen_bn")
"""The BatchNorm running-statistics panel: the plain loop, the double update, the fix."""


def write_study_tables(folder: Path) -> list[Path]:
    """`equivalence.md` and `equivalence.png` from `folder/equivalence.csv`; returns their paths."""
    table = read_equivalence(folder / EQUIVALENCE_CSV)
    accum_steps = sorted(int(k) for k in table.accum_steps.dropna().unique())
    (folder / "equivalence.md").write_text(study_markdown(table, accum_steps))
    study_chart(table, accum_steps, folder / "equivalence.png")
    return [folder / "equivalence.md", folder / "equivalence.png"]


def study_markdown(table: pd.DataFrame, accum_steps: list[int]) -> str:
    ok, first = table[table.status == "ok"], table.iloc[0]
    tolerance = TOLERANCE[first['dtype']]
    lines = [
        f"# Accumulation against one large batch ({first['device']})",
        "",
        f"One {first['optimizer']} step from the same weights and the same {first['effective_batch']} samples "
        f"({first['image_size_px']} px, {first['dtype']}), as one batch and as K accumulated micro-batches. "
        f"`=`: equivalent by the rule (relative L2 of the gradients and of the BatchNorm statistics "
        f"<= {tolerance:g}); `x`: not. Measured on {first['device_name']}, {first['threads']} threads, "
        f"torch {first['torch_version']}, timm {first['timm_version']}, commit {str(first['git_commit'])[:10]}, "
        f"{first['started_utc']}.",
        "",
        "## Gradients: relative L2 difference",
        "",
        *_k_table(ok, accum_steps, lambda r: f"{r.grad_rel_l2:.1e} {'=' if r.equivalent else 'x'}"),
        "",
        "## BatchNorm running statistics: updates per layer (large batch / accumulated), relative L2 of their change",
        "",
        *_k_table(ok[ok.bn_stats_rel_l2.notna()], accum_steps, lambda r: f"{r.bn_updates_large_batch:.0f}/"
                  f"{r.bn_updates_accumulated:.0f}, {r.bn_stats_rel_l2:.1e}"),
        "",
        "## Why, at the largest K measured",
        "",
        *[f"- {model} {variant} (K = {last['accum_steps']:.0f}): {last['reason']}"
          for (model, variant), group in ok.groupby(["model", "variant"], sort=False)
          for last in [group.loc[group["accum_steps"].idxmax()]]],
    ]
    skipped = table[table.status == "skipped"]
    if len(skipped):
        lines += ["", "## Not run", "",
                  *[f"- {r.model} {r.variant}{'' if pd.isna(r.accum_steps) else f' K = {r.accum_steps:.0f}'}: "
                    f"{r.reason}" for r in skipped.itertuples()]]
    return "\n".join(lines) + "\n"


def _k_table(rows: pd.DataFrame, accum_steps: list[int], cell) -> list[str]:
    """model | variant | one column per K, each filled by `cell(row)`, `-` where not measured."""
    lines = ["| model | variant | " + " | ".join(f"K = {k}" for k in accum_steps) + " |",
             "|---|---|" + "---:|" * len(accum_steps)]
    for (model, variant), group in rows.groupby(["model", "variant"], sort=False):
        by_k = {int(r.accum_steps): cell(r) for r in group.itertuples()}
        lines.append(f"| {model} | {variant} | " + " | ".join(by_k.get(k, "-") for k in accum_steps) + " |")
    return lines


def study_chart(table: pd.DataFrame, accum_steps: list[int], path: Path) -> None:
    ok = table[table.status == "ok"]
    models = list(dict.fromkeys(ok.model))
    batchnorm_models = list(dict.fromkeys(ok[ok.bn_stats_rel_l2.notna()].model))
    panels = [(m, "grad_rel_l2", f"{m}: gradients", None) for m in models]
    panels += [(m, "bn_stats_rel_l2", f"{m}: BatchNorm running statistics", BATCHNORM_PANEL_VARIANTS)
               for m in batchnorm_models]
    tolerance = TOLERANCE[table.iloc[0]["dtype"]]
    colours = {variant: f"C{index}" for index, variant in enumerate(VARIANTS)}  # one colour per variant throughout
    figure, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.5), squeeze=False)
    for axis, (model, column, title, variants) in zip(axes[0], panels):
        for variant, group in ok[ok.model == model].groupby("variant", sort=False):
            if variants is None or variant in variants:
                axis.plot(group.accum_steps, group[column], marker="o", label=variant, color=colours[variant])
        axis.axhline(tolerance, color="grey", linestyle="--", linewidth=1, label=f"tolerance {tolerance:g}")
        axis.set_xscale("log", base=2)
        axis.set_xticks(accum_steps, [str(k) for k in accum_steps])
        # Symmetric log: K = 1 is the large batch itself, often exactly 0, which a log axis cannot show.
        axis.set_yscale("symlog", linthresh=tolerance / 1000)
        axis.set_ylim(bottom=0)
        axis.set(title=title, xlabel="K (micro-batches accumulated)",
                 ylabel="relative L2 difference from the large batch")
        axis.legend(fontsize=8)
    first = table.iloc[0]
    figure.suptitle(f"Accumulation against one batch of {first['effective_batch']}: {first['image_size_px']} px, "
                    f"{first['dtype']}, one {first['optimizer']} step, {first['device_name']}", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)



def comparison_table(comparison: Comparison) -> Table:
    """One accumulated step against the large batch: what each side gave, and the difference."""
    c, s = comparison, comparison.settings
    table = Table(title=f"{s.model}, {s.image_size} px, {s.dtype} on {s.device}, {s.optimizer}; variant {c.variant}: "
                        f"{VARIANTS[c.variant].summary}", title_justify="left")
    for header in ("quantity", "large batch", f"K = {c.accum_steps}", "difference"):
        table.add_column(header, justify="left" if header == "quantity" else "right")
    table.add_row("samples per micro-batch", str(s.effective_batch), ", ".join(map(str, c.micro_batch_sizes)), "")
    table.add_row("loss, cross-entropy (nats)", f"{c.loss_large_batch:.6f}", f"{c.loss_accumulated:.6f}",
                  f"{c.loss_accumulated - c.loss_large_batch:+.2e}")
    table.add_row("gradient L2 norm", f"{c.grad_norm_large_batch:.4e}", f"{c.grad_norm_accumulated:.4e}",
                  f"ratio {c.grad_norm_ratio:.4f}")
    table.add_row("gradients, all parameters", "", "", f"relative L2 {c.grad_rel_l2:.2e}")
    for name, value in c.worst_parameters:
        table.add_row(f"  {name}", "", "", f"relative L2 {value:.2e}")
    if c.bn_stats_rel_l2 is not None:
        table.add_row("BatchNorm updates (most of any layer)", str(c.bn_updates_large_batch),
                      str(c.bn_updates_accumulated), "")
        table.add_row("BatchNorm running mean and variance, change", "", "",
                      f"relative L2 {c.bn_stats_rel_l2:.2e}")
    table.add_row("weights after the step, change", "", "", f"relative L2 {c.weights_rel_l2:.2e}")
    table.add_row("weights after the step", "", "", f"max abs {c.weights_max_abs_diff:.2e}")
    return table
