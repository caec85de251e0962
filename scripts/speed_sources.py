"""Write docs/speed/sources.md: every calibration and validation source of the throughput model, with the rows
the fit uses and the rows it drops, each drop counted by its reason.

The counts are computed here by replaying the selection of `bench.speed.reference` (the same functions and
constants the fit reads), not written by hand: `python scripts/speed_sources.py` (no fit, a few seconds).
"""

from __future__ import annotations

import csv
from collections import Counter
from importlib import resources
from pathlib import Path

import timm

from bench.measure.hardware import gpu_keys
from bench.speed import reference as ref

OUT = Path("docs/speed/sources.md")


def _read(name: str) -> list[dict]:
    return list(csv.DictReader(resources.files("bench.data").joinpath(ref.REFERENCE_FOLDER, name)
                               .read_text().splitlines()))


def timm_train(traced: set[str]) -> tuple[int, Counter, int]:
    """(rows in the file, drops by reason, rows used)."""
    raw = _read(ref.MEASUREMENTS_FILE)
    dropped: Counter = Counter()
    for row in raw:
        if not timm.is_model(row["model"]):
            dropped["model no longer registered in timm"] += 1
        elif ref.family_of(row["model"]) is None:
            dropped["model in no validation family (`bench.speed.reference.FAMILIES`)"] += 1
    candidates = ref.timm_train_rows()
    chosen = ref.select_rows(candidates)
    dropped[f"not in the per-family spread (`select_rows`: {ref.PER_FAMILY} models per family with both "
            "memory formats, slowest to fastest)"] += len(candidates) - len(chosen)
    used = [row for row in chosen if row.trace in traced]
    dropped["not traceable under fake tensors (absent from reference_ops.csv.gz)"] += len(chosen) - len(used)
    return len(raw), dropped, len(used)


def dle(traced: set[str]) -> dict[str, tuple[int, Counter, int]]:
    """Per mode (train, infer): (rows in the file, drops by reason, rows used)."""
    out = {}
    for mode in ("train", "infer"):
        raw = [row for row in _read(ref.DLE_FILE) if row["mode"] == mode]
        dropped: Counter = Counter()
        for row in raw:
            if int(row["n_gpus"]) != 1:
                dropped["more than one GPU (the fit takes one-GPU rows; 8-GPU training rows are the DDP check)"] += 1
            elif row["gpu"] not in ref.DLE_GPUS:
                dropped[f"GPU {row['gpu']} not in the catalog (no sourced clock or bandwidth)"] += 1
            elif not row["batch_size_per_gpu"]:
                dropped["batch size not stated"] += 1
            elif not timm.is_model(row["timm_equiv"]):
                dropped["no registered timm equivalent"] += 1
            elif any(doubt in row["flags"] for doubt in ref.DLE_DOUBTS):
                doubt = next(d for d in ref.DLE_DOUBTS if d in row["flags"])
                dropped[f"doubt flag `{doubt}`"] += 1
        kept = [row for row in ref.dle_rows() if row.mode == mode]
        eligible = len(raw) - sum(dropped.values())
        dropped["same configuration in a later table (the latest kept)"] += eligible - len(kept)
        used = [row for row in kept if row.trace in traced]
        dropped["not traceable under fake tensors"] += len(kept) - len(used)
        out[mode] = (len(raw), dropped, len(used))
    return out


def timm_infer(traced: set[str]) -> tuple[int, Counter, int]:
    raw = _read(ref.INFER_FILE)
    dropped: Counter = Counter()
    kept = ref.timm_infer_rows()
    used = [row for row in kept if row.trace in traced]
    dropped["not traceable under fake tensors"] += len(kept) - len(used)
    return len(raw), dropped, len(used)


def lambda_train(traced: set[str]) -> tuple[int, Counter, int]:
    """Lambda's table: its one-GPU BERT rows."""
    raw = _read(ref.LAMBDA_FILE)
    known = set(gpu_keys())
    dropped: Counter = Counter()
    for row in raw:
        if row["model"] not in ref.STANDINS:
            dropped["model without a traced stand-in (`STANDINS`): GNMT, Tacotron 2, WaveGlow (recurrent), SSD "
                    "(detection), NCF (embeddings)"] += 1
        elif row["gpus"] != "1":
            dropped["more than one GPU (the fit takes one-GPU rows)"] += 1
        elif row["gpu"] not in known:
            dropped[f"GPU {row['gpu']} not in the catalog (no sourced datasheet figures)"] += 1
        else:
            doubt = next((d for d in ref.LAMBDA_DOUBTS if f"[{d}]" in row["notes"]), None)
            if doubt:
                dropped[f"doubt flag `{doubt}`"] += 1
    kept = ref.lambda_rows()
    dropped["merged into their configuration's row (one per GPU, model, precision, batch and container: the "
            "median of its systems)"] += len(ref.lambda_systems()) - len(kept)
    used = [row for row in kept if row.trace in traced]
    dropped["not traceable under fake tensors"] += len(kept) - len(used)
    return len(raw), dropped, len(used)


def input_bound_lines() -> list[str]:
    """The TF32 and FP32 training rows, each with how much faster its table's fp16 row of it ran (the rule of
    `bench.speed.reference.not_input_bound`), and whether the fit keeps it."""
    rows = ref.candidate_rows()
    checked = [(row, ref.input_headroom(row, rows)) for row in rows if row.mode == "train" and row.precision != "fp16"]
    kept = sum((headroom or 0.0) >= ref.INPUT_HEADROOM for _, headroom in checked)
    lines = ["## TF32 and FP32 training rows: not input-bound", "",
             f"DLE's training rows read real ImageNet through a data loader, so a row may be set by its loader, not "
             f"its GPU; such a row would drag the TF32 efficiency down. The fit keeps a TF32 or FP32 training row "
             f"only where its own table shows the input pipeline feeding at least {ref.INPUT_HEADROOM:g}x its "
             f"rate: an fp16 row of the same source, GPU, model and software (container) that ran that much faster "
             f"(`bench.speed.reference.not_input_bound`). **{kept} of {len(checked)} kept**; the lowest headroom is "
             f"{min(h for _, h in checked if h):.2f}x.", "",
             "| source | GPU | model | precision | batch | samples/s | software | fp16 row of the table, x faster |",
             "|---|---|---|---|---|---|---|---|"]
    for row, headroom in sorted(checked, key=lambda pair: (pair[0].source, pair[0].gpu, pair[0].model, pair[0].stack)):
        lines.append(f"| {row.source} | {row.gpu} | {row.model} | {row.precision} | {row.batch_size} | "
                     f"{row.samples_per_s:g} | {row.stack or '-'} | "
                     f"{'none: dropped' if headroom is None else f'{headroom:.2f}'} |")
    return lines + [""]


def _line(name: str, source: str, mode: str, counts: tuple[int, Counter, int]) -> list[str]:
    total, dropped, used = counts
    drops = "; ".join(f"{n} {why}" for why, n in sorted(dropped.items(), key=lambda kv: -kv[1]) if n) or "none"
    assert total == used + sum(dropped.values()), f"{name} {mode}: counts do not add up"
    return [f"| `{name}` | `{source}` | {mode} | {total} | {used} | {drops} |"]


def main() -> None:
    traced = set(ref.read_reference_ops())
    dle_counts = dle(traced)
    lines = [
        "# Throughput model: calibration and validation sources", "",
        "Written by `python scripts/speed_sources.py`, which replays the row selection of "
        "`bench.speed.reference` (the functions the fit calls) on the files in `bench/data/reference/` "
        "(their provenance: that folder's README) and counts every row: the counts are computed, and "
        "`used + dropped = rows in file` is checked for each line.", "",
        "| file | source (`source` column of validation.csv) | mode | rows in file | used by the fit "
        "| dropped, and why |",
        "|---|---|---|---|---|---|",
        *_line(ref.MEASUREMENTS_FILE, "timm-train", "train", timm_train(traced)),
        *_line(ref.DLE_FILE, "dle-train", "train", dle_counts["train"]),
        *_line(ref.DLE_FILE, "dle-infer", "infer", dle_counts["infer"]),
        *_line(ref.INFER_FILE, "timm-infer", "infer", timm_infer(traced)),
        *_line(ref.LAMBDA_FILE, "lambda-train", "train", lambda_train(traced)), "",
        *input_bound_lines(),
        "## In-sample or held out", "",
        "- **The shipped parameters (`bench/data/speed_params.json`) are fitted on every used row above**: "
        "for them, every row is in-sample. Lambda's rows are the only Hopper and Blackwell rows; "
        "`docs/speed/hopper_blackwell.md` gives their held-out errors.",
        "- **The validation (`docs/speed/validation.*`, `bench predict --validate`) holds rows out by refitting**: "
        "leave-one-GPU-out (columns `logo_*`), leave-one-family-out (`lofo_*`), leave-one-source-out (`loso_*`, "
        "training sources) and leave-one-generation-out (`logen_*`, training rows of volta and ampere). Each "
        "held-out prediction comes from a fit that never saw that row's GPU, family, source or generation; the "
        "80 % bands come only from the held-out predictions of training rows (logo and loso pooled; logen for "
        "a GPU of a generation without training rows).",
        "- **No row of the study models (ResNet-50, ViT-B/16, ViT-L/16) is in the repository**: predictions for "
        "them are out of sample by construction. Hopper and Blackwell rows are BERT training only (no vision "
        "model, no bf16): a vision prediction on those GPUs rests on BERT's matmuls and the other GPUs' "
        "convolutions.", "",
        "## Other files", "",
        "- `dle_platforms.csv`: each DGX's interconnect; with `dle_convnets_perf.csv`'s one- and 8-GPU training "
        "rows it is the data-parallel check (`docs/speed/dle_8gpu_scaling.csv`), not part of the fit.",
        "- `reference_ops.csv.gz`: the traced op tables of the used rows (not a measurement).", ""]
    OUT.write_text("\n".join(lines))
    print(OUT.read_text())


if __name__ == "__main__":
    main()
