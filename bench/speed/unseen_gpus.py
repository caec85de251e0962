"""The throughput model on GPUs its fit has no row of: Lambda's one-GPU BERT training rows on H100, H200 and B200
(`bench.speed.reference.lambda_rows`), predicted with the shipped parameters, with the band each prediction states.

Held out by construction: the fit (`bench.speed.calibrate`) never reads these rows, and it has no training row of
a Hopper or Blackwell GPU. Three questions, answered from the committed traces in seconds:

- absolute: predicted / measured - 1 per configuration, and how many systems' figures the stated 80 % band holds;
- cross-GPU: the predicted ratio between two GPUs against the measured one, same model and precision, which is
  what ranking GPUs rests on (Lambda's containers differ between some GPUs: the table names them);
- what sets the predicted step on each GPU (the share of tensor, memory, non-tensor and launch time).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench.measure.hardware import gpu_spec
from bench.speed.calibrate import Dataset, predict_samples_per_s
from bench.speed.model import op_mixes, op_times
from bench.speed.params import ModelFile, load_model_file
from bench.speed.reference import lambda_rows, read_reference_ops

ROW_COLUMNS = ("gpu", "model", "precision", "container", "batch_size", "systems", "measured_samples_per_s",
               "measured_spread_pct", "predicted_samples_per_s", "error_pct", "band_low", "band_high",
               "systems_inside_band", "tensor_pct", "memory_pct", "non_tensor_pct", "launch_pct", "band_rests_on")
"""unseen_gpus.csv: one line per GPU, model, precision and container: the median of its systems' rows."""
RATIO_PAIRS = (("H200", "H100-80GB"), ("H100-PCIe", "H100-80GB"), ("B200", "H100-80GB"), ("B200", "H200"))
"""Cross-GPU ratios checked, numerator first: the H200 is the H100's chip with more and faster memory, the PCIe
card the same generation at lower clocks and power, the B200 the next generation."""
RATIO_COLUMNS = ("pair", "model", "precision", "containers", "measured_ratio", "predicted_ratio", "error_pct")
_PARTS = ("tensor", "memory", "non_tensor", "launch")


@dataclass(frozen=True)
class UnseenGpuCheck:
    rows: list[dict]
    """`ROW_COLUMNS`."""
    ratios: list[dict]
    """`RATIO_COLUMNS`."""
    systems: int
    """Lambda rows (one per system) behind `rows`."""

    def summary(self) -> dict:
        """Median and largest |error| of the configurations, and the share of systems inside their band."""
        errors = np.abs([row["error_pct"] for row in self.rows])
        ratio_errors = np.abs([row["error_pct"] for row in self.ratios])
        inside = sum(row["systems_inside_band"] for row in self.rows)
        return {"configurations": len(self.rows), "systems": self.systems,
                "median_error_pct": round(float(np.median(errors)), 1), "max_error_pct": round(float(errors.max()), 1),
                "inside_band_pct": round(100 * inside / self.systems, 1),
                "ratio_median_error_pct": round(float(np.median(ratio_errors)), 1),
                "ratio_max_error_pct": round(float(ratio_errors.max()), 1)}


def unseen_gpu_check(model: ModelFile | None = None) -> UnseenGpuCheck:
    """The check, with the shipped model file (or `model`)."""
    model = model or load_model_file()
    data = Dataset.of(lambda_rows(), read_reference_ops())
    predicted = predict_samples_per_s(data, model.params)
    times = op_times(data.features, None, model.params)
    stacked = np.stack([times.tensor_s, times.memory_s, times.non_tensor_s])
    longest = stacked.argmax(axis=0)  # an op's time is its longest resource's (`bench.speed.model.step_time`)
    parts = [np.bincount(data.row_index, weights=stacked[i] * (longest == i), minlength=len(data.rows))
             for i in range(3)]
    parts.append(np.bincount(data.row_index, weights=times.kernel_s, minlength=len(data.rows)))
    mixes = op_mixes(data.table, data.row_index, len(data.rows))
    groups: dict[tuple, list[int]] = {}
    for i, row in enumerate(data.rows):
        groups.setdefault((row.gpu, row.model, row.precision, row.stack), []).append(i)
    table = []
    for (gpu, name, precision, container), members in sorted(groups.items()):
        first, spec = members[0], gpu_spec(gpu)
        assert len({data.rows[i].batch_size for i in members}) == 1, (gpu, name, precision, container)
        measured = np.array([data.rows[i].samples_per_s for i in members])
        median, value = float(np.median(measured)), float(predicted[first])
        low, high = model.interval(value, spec, mixes[first])
        total = sum(float(part[first]) for part in parts)
        table.append({
            "gpu": gpu, "model": name, "precision": precision, "container": container,
            "batch_size": data.rows[first].batch_size, "systems": len(members), "measured_samples_per_s": median,
            "measured_spread_pct": round(100 * float(measured.max() - measured.min()) / median, 1),
            "predicted_samples_per_s": round(value, 1), "error_pct": round(100 * (value / median - 1), 1),
            "band_low": round(low, 1), "band_high": round(high, 1),
            "systems_inside_band": int(((low <= measured) & (measured <= high)).sum()),
            **{f"{part_name}_pct": round(100 * float(part[first]) / total, 1) for part_name, part in zip(_PARTS, parts)},
            "band_rests_on": model.rests_on(spec, mixes[first])})
    return UnseenGpuCheck(table, ratio_table(table), len(data.rows))


def ratio_table(rows: list[dict]) -> list[dict]:
    """`RATIO_PAIRS` per model and precision, from each GPU's most-measured container (its line with most systems).

    >>> line = lambda gpu, measured, predicted: {"gpu": gpu, "model": "m", "precision": "fp16", "container": "c",
    ...     "systems": 1, "measured_samples_per_s": measured, "predicted_samples_per_s": predicted}
    >>> ratio_table([line("H200", 110.0, 103.0), line("H100-80GB", 100.0, 100.0)])[0]["error_pct"]
    -6.4
    """
    best: dict[tuple, dict] = {}
    for row in rows:
        key = (row["gpu"], row["model"], row["precision"])
        if key not in best or row["systems"] > best[key]["systems"]:
            best[key] = row
    table = []
    for top, bottom in RATIO_PAIRS:
        for model, precision in sorted({(row["model"], row["precision"]) for row in rows}):
            a, b = best.get((top, model, precision)), best.get((bottom, model, precision))
            if a is None or b is None:
                continue
            measured = a["measured_samples_per_s"] / b["measured_samples_per_s"]
            predicted = a["predicted_samples_per_s"] / b["predicted_samples_per_s"]
            containers = a["container"] if a["container"] == b["container"] else f"{a['container']} / {b['container']}"
            table.append({"pair": f"{top} / {bottom}", "model": model, "precision": precision,
                          "containers": containers, "measured_ratio": round(measured, 3),
                          "predicted_ratio": round(predicted, 3), "error_pct": round(100 * (predicted / measured - 1), 1)})
    return table
