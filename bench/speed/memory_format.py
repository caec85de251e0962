"""Channels-last against contiguous: the ratio the throughput model predicts between a configuration's two memory
formats, against the ratio measured (timm's benchmarks run every model both ways on one GPU), from the validation's
held-out predictions (`docs/speed/validation.csv`: no fit here, seconds).

A pair is two rows that differ only in memory format (source, GPU, mode, precision, model, batch, image size and
software stack equal); each side is predicted twice: leave-one-GPU-out (the pair's GPU in neither fit) and
leave-one-family-out (no model of the pair's family in the fit: how the format terms carry to a model never seen).
"""

from __future__ import annotations

import numpy as np

PAIR_COLUMNS = ("source", "gpu", "mode", "precision", "model", "family", "op_mix", "batch_size", "measured_ratio",
                "predicted_ratio", "error_pct", "lofo_predicted_ratio", "lofo_error_pct")
"""memory_format.csv: one line per pair; ratios are channels-last samples/s over contiguous."""
_SAME = ("source", "gpu", "mode", "precision", "model", "batch_size", "image_size", "stack")


def format_pairs(validation: list[dict]) -> list[dict]:
    """`PAIR_COLUMNS` lines of every pair in `validation` (validation.csv's rows, as read).

    >>> row = lambda layout, measured, predicted: {"source": "s", "gpu": "g", "mode": "train", "precision": "fp16",
    ...     "model": "m", "family": "f", "op_mix": "conv", "batch_size": "8", "image_size": "224", "stack": "",
    ...     "memory_format": layout, "measured_samples_per_s": measured, "logo_predicted_samples_per_s": predicted,
    ...     "lofo_predicted_samples_per_s": predicted}
    >>> format_pairs([row("channels_last", "150", "100"), row("contiguous", "100", "100")])[0]["error_pct"]
    -33.3
    """
    sides: dict[tuple, dict[str, dict]] = {}
    for row in validation:
        sides.setdefault(tuple(row[name] for name in _SAME), {})[row["memory_format"]] = row
    lines = []
    for key, pair in sorted(sides.items()):
        if set(pair) != {"channels_last", "contiguous"}:
            continue
        nhwc, nchw = pair["channels_last"], pair["contiguous"]
        ratio = lambda column: float(nhwc[column]) / float(nchw[column])  # noqa: E731
        measured = ratio("measured_samples_per_s")
        logo, lofo = ratio("logo_predicted_samples_per_s"), ratio("lofo_predicted_samples_per_s")
        lines.append({**{name: nhwc[name] for name in PAIR_COLUMNS[:7]}, "batch_size": int(nhwc["batch_size"]),
                      "measured_ratio": round(measured, 3), "predicted_ratio": round(logo, 3),
                      "error_pct": round(100 * (logo / measured - 1), 1), "lofo_predicted_ratio": round(lofo, 3),
                      "lofo_error_pct": round(100 * (lofo / measured - 1), 1)})
    return lines


def summary(lines: list[dict], by: str | None = None) -> list[dict]:
    """Per `mode` (and `by`, a column): pairs, the measured ratio's spread, the predicted one's, the error's."""
    groups: dict[tuple, list[dict]] = {}
    for line in lines:
        groups.setdefault((line["mode"], line[by] if by else "all"), []).append(line)
    table = []
    for (mode, value), members in sorted(groups.items()):
        measured = np.array([m["measured_ratio"] for m in members])
        predicted = np.array([m["predicted_ratio"] for m in members])
        errors = np.abs([m["error_pct"] for m in members])
        lofo_errors = np.abs([m["lofo_error_pct"] for m in members])
        table.append({"mode": mode, "value": value, "pairs": len(members),
                      "measured_p10": round(float(np.percentile(measured, 10)), 2),
                      "measured_median": round(float(np.median(measured)), 2),
                      "measured_p90": round(float(np.percentile(measured, 90)), 2),
                      "predicted_median": round(float(np.median(predicted)), 3),
                      "median_error_pct": round(float(np.median(errors)), 1),
                      "p90_error_pct": round(float(np.percentile(errors, 90)), 1),
                      "lofo_median_error_pct": round(float(np.median(lofo_errors)), 1),
                      "lofo_p90_error_pct": round(float(np.percentile(lofo_errors, 90)), 1)})
    return table
