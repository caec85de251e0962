"""The rows a claim reads: one experiment's rows from one source, and which cells were read.

Sources, by what they can stand for:

- `cuda`: measured on a GPU (`results/<experiment>/<gpu-tag>/runs.csv`);
- `estimate`: the CUDA grid predicted without a device (`results/<experiment>/estimate/runs.csv`,
  `bench estimate`), memory only;
- `cpu`: measured on a CPU under the grid's CPU profile (smaller images, same mechanisms);
- `equivalence`: the equivalence study (`results/equivalence/<device>/equivalence.csv`): one step
  as K micro-batches against one large batch, every variant;
- `arithmetic`: no rows: the article's own figures, the FLOP counter and the GPU catalog;
- `torch`: no rows: a behaviour of the installed torch, run on the CPU when the claims are checked
  (an API's default, what GradScaler does on an overflow).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pandas as pd

from bench.results.store import EQUIVALENCE_CSV, EQUIVALENCE_FOLDER, PREDICTED_FOLDER
from bench.results.read import file_schema, read_equivalence, read_runs, read_text

Source = Literal["cuda", "estimate", "cpu", "equivalence", "arithmetic", "torch", "predicted"]
ROWLESS: tuple[Source, ...] = ("arithmetic", "torch")
"""Sources that read no rows: their experiment is their own name."""
USABLE_STATUS = {"cuda": "ok", "cpu": "ok", "estimate": "estimated", "equivalence": "ok", "arithmetic": "ok",
                 "torch": "ok", "predicted": "predicted"}
SOURCE_WORDS = {"cuda": "measured on GPU", "estimate": "estimated for GPU (no device)", "cpu": "measured on CPU",
                "equivalence": "equivalence study", "arithmetic": "computed from the article's own figures",
                "torch": "run on the installed torch (CPU)",
                "predicted": "predicted by the throughput model (no device)"}
MEASURED_SOURCES: tuple[Source, ...] = ("cuda", "cpu")
"""Sources whose rows a device measured: they name the claims table's folder."""


EQUIVALENCE = EQUIVALENCE_FOLDER
"""The experiment name a claim gives the equivalence study's table: its results folder's."""


class Missing(Exception):
    """The rows lack what a measurement needs; the message says what."""


@dataclass
class Rows:
    """One experiment's rows from one source; records every cell a measurement reads."""

    source: Source
    folder: Path
    """results/<experiment>/<tag>: where the rows are."""
    frame: pd.DataFrame
    used: list[str] = field(default_factory=list)

    @property
    def device_name(self) -> str:
        names = sorted(set(self.frame.device_name.astype(str)))
        return names[0] if names else ""

    def all(self, **where: object) -> pd.DataFrame:
        """Usable rows (ok, or estimated) matching `where`, in cell-id order; Missing if none."""
        matching = self._matching(where)
        usable = matching[matching.status == USABLE_STATUS[self.source]].sort_values("cell_id")
        if usable.empty:
            raise Missing(self._why_missing(matching, where))
        self.used.extend(cell for cell in usable.cell_id if cell not in self.used)
        return usable

    def one(self, **where: object) -> pd.Series:
        """The single usable row matching `where` (the first by cell id if several)."""
        return self.all(**where).iloc[0]

    def autocast(self, **where: object) -> tuple[str, pd.Series]:
        """The fp16 row matching `where` (the articles' autocast + GradScaler), else the bf16 one."""
        try:
            return "fp16", self.one(precision="fp16", **where)
        except Missing:
            return "bf16", self.one(precision="bf16", **where)

    def _matching(self, where: dict) -> pd.DataFrame:
        frame = self.frame
        for column, value in where.items():
            if column not in frame.columns:
                raise Missing(f"{self.folder}/runs.csv has no {column} column")
            frame = frame[frame[column].astype(str) == str(value)]
        return frame

    def _why_missing(self, matching: pd.DataFrame, where: dict) -> str:
        wanted = ", ".join(f"{key}={value}" for key, value in where.items())
        if matching.empty:
            return f"no row with {wanted} in {self.folder}"
        row = matching.sort_values("cell_id").iloc[0]
        reason = f": {row.error_message}" if str(row.error_message) else ""
        return f"the row with {wanted} is {row.status}{reason}"


def check_runs_files(paths: list[Path]) -> None:
    """Read every runs file the claims may use, each against its schema: a corrupt one is one line now,
    before minutes of estimating and evaluating."""
    for runs in paths:
        read_text(runs, file_schema(runs).columns)


def load_sources(results_root: Path, experiment: str) -> dict[Source, Rows]:
    """Every source with rows for `experiment`; of several GPUs (or CPUs), the first tag by name.

    The experiment `equivalence` is the equivalence study's table; `arithmetic` needs no rows.
    """
    if experiment in ROWLESS:
        return {experiment: Rows(experiment, Path(results_root), pd.DataFrame(
            {"cell_id": pd.Series(dtype=str), "status": pd.Series(dtype=str), "device_name": pd.Series(dtype=str)}))}
    if experiment == EQUIVALENCE:
        return _equivalence_rows(results_root)
    found: dict[Source, Rows] = {}
    for runs in sorted(Path(results_root, experiment).glob("*/runs.csv")):
        schema = file_schema(runs)
        if schema.kind == "predicted":  # the throughput model's rows: no claim reads a prediction
            continue
        frame = read_runs(runs, schema.columns)
        if frame.empty:
            continue
        source: Source = "estimate" if schema.kind in ("estimated", "autotune") else str(frame.device_type.iloc[0])
        found.setdefault(source, Rows(source, runs.parent, frame))
    return found


def predicted_rows(results_root: Path, experiment: str, gpu: str) -> Rows | None:
    """The throughput model's rows of `experiment` for catalog GPU `gpu` (`bench predict`), or None: what a claim
    about GPU speed is predicted from when no GPU measured it."""
    runs = Path(results_root, experiment, PREDICTED_FOLDER, "runs.csv")
    if not runs.is_file():
        return None
    frame = read_runs(runs, file_schema(runs).columns)
    frame = frame[frame.gpu.astype(str) == gpu]
    return Rows("predicted", runs.parent, frame.assign(device_name=gpu)) if not frame.empty else None


def _equivalence_rows(results_root: Path) -> dict[Source, Rows]:
    """The study's rows, with an id per comparison (model, variant, K) for the table's row lists."""
    for table in sorted(Path(results_root, EQUIVALENCE_FOLDER).glob(f"*/{EQUIVALENCE_CSV}")):
        frame = read_equivalence(table)
        frame["cell_id"] = [f"{model}-{variant}-K{'' if pd.isna(k) else k}"
                            for model, variant, k in zip(frame.model, frame.variant, frame.accum_steps)]
        frame["error_message"] = frame.reason.where(frame.status != "ok", "").fillna("")
        return {"equivalence": Rows("equivalence", table.parent, frame)}
    return {}


# Readings of one row, shared by the claims.

def phases(row: pd.Series) -> list[list]:
    """[[step, phase, micro_step, bytes, weights_version]]: `step_memory`, or `phase_memory` as step 0."""
    text = row.get("step_memory")
    if isinstance(text, str) and text:
        return json.loads(text)
    return [[0, phase, micro, nbytes, None] for phase, micro, nbytes in json.loads(row.phase_memory)]


def phase_bytes(row: pd.Series, phase: str, micro_step: int, step: int = 0) -> float:
    for at_step, name, micro, nbytes, _ in phases(row):
        if (at_step, name, micro) == (step, phase, micro_step):
            return float(nbytes)
    raise Missing(f"{row.cell_id}: no {phase} of micro-step {micro_step} in step {step}")


def saved_activations_bytes(row: pd.Series) -> float:
    """Activations kept for backward at the end of the first forward.

    After forward 0: weights, optimizer state, activations (no gradients: they were set to None).
    After backward 0: weights, optimizer state, gradients. The difference plus the gradients is
    what the forward saved.
    """
    return phase_bytes(row, "forward", 0) - phase_bytes(row, "backward", 0) + float(row.grads_bytes)
