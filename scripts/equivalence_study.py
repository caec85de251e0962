"""The equivalence study: every variant of `bench.equivalence`, K = 1..16, ResNet-50 and ViT-B/16.

Writes `equivalence.csv` (one row per model, variant and K, with provenance), `equivalence.md`
(the tables) and `equivalence.png` (gradient difference against K) to results/equivalence/<device>/.

    python scripts/equivalence_study.py [--models resnet50,vit_base_patch16_224] [--accum 1,2,4,8,16]
        [--effective-batch 32] [--image-size 32] [--dtype fp32] [--device cpu] [--out DIR]

A variant that cannot run for a model or a K (BatchNorm variants on a model without BatchNorm,
an unequal split of 2 samples into 1 + 1 ...) is a `skipped` row with the reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
import pandas as pd

from bench.device import detect_device
from bench.equivalence import TOLERANCE, VARIANTS, Comparison, EquivalenceError, Settings, compare, prepare
from bench.provenance import git_state, library_versions

COLUMNS = [
    "model", "variant", "image_size_px", "dtype", "device", "optimizer", "seed", "effective_batch",
    "accum_steps", "micro_batch_sizes", "status", "equivalent", "tolerance", "grad_rel_l2", "grad_norm_ratio",
    "worst_parameters", "loss_large_batch_nats", "loss_accumulated_nats", "bn_stats_rel_l2",
    "bn_updates_large_batch", "bn_updates_accumulated", "weights_rel_l2", "weights_max_abs_diff", "reason",
    "device_name", "threads", "harness_commit", "harness_dirty", "torch_version", "timm_version", "utc_time",
]
"""The CSV header. Relative L2 columns are ||accumulated - large batch|| / ||large batch|| (no unit)."""

BATCHNORM_PANEL_VARIANTS = ("correct", "checkpoint", "frozen_bn")
"""The BatchNorm running-statistics panel: the plain loop, the double update, the fix."""


def main() -> None:
    args = _parse()
    device = detect_device(args.device)
    out = args.out or Path("results") / "equivalence" / device.type
    out.mkdir(parents=True, exist_ok=True)
    commit, dirty = git_state()
    context = {"device_name": device.name, "threads": device.threads, "harness_commit": commit,
               "harness_dirty": dirty, **library_versions(),
               "utc_time": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    began = time.perf_counter()
    rows = []
    for model in args.models:
        settings = Settings(model=model, effective_batch=args.effective_batch, image_size=args.image_size,
                            dtype=args.dtype, device=device.type)
        for variant in VARIANTS:
            rows += _measure(settings, variant, args.accum, context)
    # Whole numbers stay whole where skipped rows leave gaps.
    table = pd.DataFrame(rows, columns=COLUMNS).astype(
        {"accum_steps": "Int64", "bn_updates_large_batch": "Int64", "bn_updates_accumulated": "Int64"})
    table.to_csv(out / "equivalence.csv", index=False)
    (out / "equivalence.md").write_text(_markdown(table, args.accum))
    _chart(table, args.accum, out / "equivalence.png")
    print(f"{len(table)} rows in {time.perf_counter() - began:.0f} s -> {out}/equivalence.{{csv,md,png}}")


def _measure(settings: Settings, variant: str, accum_steps: list[int], context: dict) -> list[dict]:
    """One row per K for this model and variant; `skipped` rows where it cannot run."""
    base = {"model": settings.model, "variant": variant, "image_size_px": settings.image_size,
            "dtype": settings.dtype, "device": settings.device, "optimizer": settings.optimizer,
            "seed": settings.seed, "effective_batch": settings.effective_batch, **context}
    try:
        prepared = prepare(settings, variant)
    except EquivalenceError as exc:
        print(f"  skipped  {settings.model} {variant}: {exc.message}")
        return [{**base, "status": "skipped", "reason": exc.message}]
    rows = []
    for k in accum_steps:
        try:
            comparison = compare(prepared, k)
        except EquivalenceError as exc:
            print(f"  skipped  {settings.model} {variant} K={k}: {exc.message}")
            rows.append({**base, "accum_steps": k, "status": "skipped", "reason": exc.message})
            continue
        print(f"  {'equal' if comparison.equivalent else 'differs':<8} {settings.model} {variant} K={k}: "
              f"gradient relative L2 {comparison.grad_rel_l2:.2e}")
        rows.append({**base, **_row(comparison)})
    return rows


def _row(c: Comparison) -> dict:
    fields = {f.name: getattr(c, f.name) for f in dataclasses.fields(c) if f.name != "settings"}
    return {**fields, "status": "ok", "micro_batch_sizes": json.dumps(c.micro_batch_sizes),
            "worst_parameters": json.dumps(c.worst_parameters), "grad_norm_ratio": c.grad_norm_ratio,
            "loss_large_batch_nats": c.loss_large_batch, "loss_accumulated_nats": c.loss_accumulated}


def _markdown(table: pd.DataFrame, accum_steps: list[int]) -> str:
    ok, first = table[table.status == "ok"], table.iloc[0]
    tolerance = TOLERANCE[first['dtype']]
    lines = [
        f"# Accumulation against one large batch ({first['device']})",
        "",
        f"One {first['optimizer']} step from the same weights and the same {first['effective_batch']} samples "
        f"({first['image_size_px']} px, {first['dtype']}), as one batch and as K accumulated micro-batches. "
        f"`=`: equivalent by the rule (relative L2 of the gradients and of the BatchNorm statistics "
        f"<= {tolerance:g}); `x`: not. Measured on {first['device_name']}, {first['threads']} threads, "
        f"torch {first['torch_version']}, timm {first['timm_version']}, commit {str(first['harness_commit'])[:10]}, "
        f"{first['utc_time']}.",
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


def _chart(table: pd.DataFrame, accum_steps: list[int], path: Path) -> None:
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


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=lambda text: text.split(","), default=["resnet50", "vit_base_patch16_224"])
    parser.add_argument("--accum", type=lambda text: [int(k) for k in text.split(",")], default=[1, 2, 4, 8, 16])
    parser.add_argument("--effective-batch", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--dtype", choices=tuple(TOLERANCE), default="fp32")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="cpu")
    parser.add_argument("--out", type=Path, help="folder for the files (default: results/equivalence/<device>)")
    return parser.parse_args()


if __name__ == "__main__":
    try:
        main()
    except EquivalenceError as exc:
        sys.exit(f"equivalence_study: {exc}")
