"""Feeding a GPU: how many CPU cores the input pipeline needs to keep up with a configuration.

The loader rows (`input = loader`, `bench run experiments/input_pipeline.toml`) measure the CPU
time one sample costs to read, decode, augment, collate and copy (`loader_cpu_ms_per_sample`:
user + system time of the training process and its workers, the loader running alone). A GPU
consuming S samples/s then keeps S x ms / 1000 cores busy decoding, plus
`TRAINING_PROCESS_CORES` for its training process (the Python loop that issues the kernels). An
instance with n GPUs needs n times that, rounded up; one with fewer vCPUs cannot feed its GPUs
at that speed. CPU time rather than a wall-clock rate per worker: on a shared or oversubscribed
host the wall clock counts other processes' time, the CPU time barely (on an idle host one
worker's samples/s is 1000 / ms). Pure arithmetic apart from `load_loader_costs`, which reads rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from bench.errors import OptionError
from bench.results.read import file_schema, read_runs

TRAINING_PROCESS_CORES = 1.0
"""Cores each GPU's training process needs beside its loader workers (the loop issuing kernels)."""


@dataclass(frozen=True)
class LoaderCost:
    """CPU cost per sample of the loader, from loader rows measured on one host at one image size."""

    cpu_ms_per_sample: float
    """Median over the rows."""
    cpu_ms_min: float
    cpu_ms_max: float
    rows: int
    image_size: int
    host_cpu_model: str
    workers: tuple[int, ...]
    data_set: str

    @property
    def samples_per_s_per_core(self) -> float:
        """What one fully busy core decodes and augments per second.

        >>> round(LoaderCost(2.5, 2.0, 3.0, 4, 224, "cpu", (2,), "set").samples_per_s_per_core)
        400
        """
        return 1000 / self.cpu_ms_per_sample

    def describe(self) -> str:
        """How the figure was measured, in one phrase."""
        spread = (f"{self.cpu_ms_min:.2f}-{self.cpu_ms_max:.2f}, " if self.rows > 1 else "")
        return (f"loader {self.cpu_ms_per_sample:.2f} CPU ms per sample ({self.samples_per_s_per_core:,.0f} samples/s "
                f"per core; median of {self.rows} loader row(s), {spread}workers "
                f"{', '.join(str(w) for w in self.workers)}, {self.image_size} px crops, data {self.data_set}) "
                f"measured on {self.host_cpu_model}")


def load_loader_costs(folders: list[Path]) -> list[LoaderCost]:
    """The loader costs of the ok loader rows (decoded on the CPU) in `folders`' runs files."""
    # Only a runner's file has loader rows: nothing measured a loader in an estimate's or a prediction's, whatever its
    # folder is called (its header says its kind).
    runs = [Path(folder) / "runs.csv" for folder in folders if (Path(folder) / "runs.csv").is_file()]
    frames = [read_runs(path) for path in runs if file_schema(path).kind == "measured"]
    return loader_costs(pd.concat(frames, ignore_index=True)) if frames else []


STUDY_GLOB = "results/input_pipeline*/*"
"""The repository's committed input-pipeline studies (`make bench-input`): the loader rows a plan falls back on
when none are given, labelled as measured on another host."""


def study_loader_costs(root: Path = Path(__file__).resolve().parents[2]) -> tuple[list[LoaderCost], str]:
    """The loader costs of the repository's own input-pipeline studies, and where they are (relative to the
    repository); ([], "") when the package runs without its repository's results."""
    folders = sorted(folder for folder in root.glob(STUDY_GLOB) if (folder / "runs.csv").is_file())
    costs = load_loader_costs(folders)
    where = ", ".join(str(folder.relative_to(root)) for folder in folders)
    return costs, (f"the repository's input-pipeline study ({where}; another host: measure yours with "
                   "make bench-input and pass --loader-rows)" if costs else "")


def priced_loader_costs(loader_rows: list[Path], folders: list[Path],
                        study_fallback: bool = False) -> tuple[list[LoaderCost], str]:
    """The loader costs that size the feeding of a priced row, and where they were looked for: those of the
    `loader_rows` folders when given (each must hold a runs file), else of the `folders` priced; with
    `study_fallback` (a plan, which always states the cores that feed it) the repository's own study when those
    have none, said as measured on another host."""
    for folder in loader_rows:
        if not (Path(folder) / "runs.csv").is_file():
            raise OptionError(f"--loader-rows {folder}: no runs.csv here; pass a results folder such as "
                              "results/input_pipeline/<device-tag>")
    sources = list(loader_rows) or list(folders)
    costs, where = load_loader_costs(sources), ", ".join(str(folder) for folder in sources)
    if not costs and not loader_rows and study_fallback:
        costs, study = study_loader_costs()
        where = study or where
    return costs, where


def loader_costs(rows: pd.DataFrame) -> list[LoaderCost]:
    """One `LoaderCost` per (host CPU, image size) among `rows`' ok loader rows."""
    if "input" not in rows or rows.empty:
        return []
    loader = rows[(rows.status == "ok") & (rows.input == "loader") & rows.loader_cpu_ms_per_sample.notna()]
    costs = []
    for (cpu, size), group in loader.groupby(["host_cpu_model", "image_size"], sort=True):
        ms = group.loader_cpu_ms_per_sample.astype(float)
        costs.append(LoaderCost(float(np.median(ms)), float(ms.min()), float(ms.max()), len(group), int(size),
                                str(cpu), tuple(sorted({int(w) for w in group.loader_workers})),
                                ", ".join(sorted(set(group.data_set)))))
    return costs


def loader_cost_for(costs: list[LoaderCost], image_size: int) -> tuple[LoaderCost, str] | None:
    """The loader cost measured at `image_size`, else at the nearest size (the crop's size changes the
    resize and collate, not the decode), with a note saying which; None without loader rows."""
    if not costs:
        return None
    best = min(costs, key=lambda c: (abs(c.image_size - image_size), -c.rows))
    note = "" if best.image_size == image_size else (
        f"; measured at {best.image_size} px, used for {image_size} px (decoding the full-size JPEG dominates; "
        f"a larger crop costs more to resize and copy, so this errs {'low' if best.image_size < image_size else 'high'})")
    return best, note


def cores_to_feed(samples_per_s: float, cpu_ms_per_sample: float) -> float:
    """Cores kept busy decoding `samples_per_s` samples at `cpu_ms_per_sample` each.

    >>> cores_to_feed(3000.0, 2.5)
    7.5
    """
    return samples_per_s * cpu_ms_per_sample / 1000


@dataclass(frozen=True)
class Feeding:
    """Whether an instance's CPUs can feed its GPUs at a configuration's speed."""

    cores_per_gpu: float
    """Decoding cores per GPU at its samples/s (the training process's core not included)."""
    vcpus_needed: int
    """GPUs x (decoding cores + the training process's), rounded up."""
    vcpus: int | None
    """The instance's vCPUs; None when the catalog does not list them."""

    @property
    def feeds(self) -> bool | None:
        """None when the vCPU count is unknown."""
        return None if self.vcpus is None else self.vcpus >= self.vcpus_needed

    def describe(self) -> str:
        """`3.1 cores/GPU, 34 of 96 vCPUs` or `CANNOT FEED: 3.1 cores/GPU, needs 34 vCPUs, has 8`."""
        has = f"{self.vcpus}" if self.vcpus is not None else "an unknown number of"
        if self.feeds is False:
            return f"CANNOT FEED: {self.cores_per_gpu:.1f} cores/GPU, needs {self.vcpus_needed} vCPUs, has {has}"
        return f"{self.cores_per_gpu:.1f} cores/GPU, needs {self.vcpus_needed} of {has} vCPUs"


def feeding(samples_per_s_per_gpu: float, gpu_count: int, vcpus: int | None, cost: LoaderCost) -> Feeding:
    """The cores `gpu_count` GPUs at `samples_per_s_per_gpu` each need, against the instance's vCPUs.

    Example: 8 GPUs at 3,000 samples/s each, 2.5 CPU ms per sample: 7.5 cores each, plus one for
    the training process, 68 vCPUs; a 96-vCPU instance feeds them:
        >>> cost = LoaderCost(2.5, 2.5, 2.5, 1, 224, "cpu", (8,), "set")
        >>> f = feeding(3000.0, 8, 96, cost)
        >>> f.vcpus_needed, f.feeds
        (68, True)
    """
    per_gpu = cores_to_feed(samples_per_s_per_gpu, cost.cpu_ms_per_sample)
    return Feeding(per_gpu, math.ceil(gpu_count * (per_gpu + TRAINING_PROCESS_CORES) - 1e-9), vcpus)


FORMULA = (f"cores per GPU = its samples/s x loader CPU ms per sample / 1000, + {TRAINING_PROCESS_CORES:g} for its "
           "training process, x GPUs, against the instance's vCPUs (a vCPU is a hardware thread: with SMT this "
           "errs optimistic)")


def no_loader_rows(where: str) -> str:
    """What to say when there is nothing to estimate from."""
    place = f" in {where}" if where else " given"
    return (f"feeding: no loader rows (input = loader){place}: the CPU cores needed to feed each GPU are not "
            "estimated (run make bench-input, then pass --loader-rows results/input_pipeline/<device-tag>)")
