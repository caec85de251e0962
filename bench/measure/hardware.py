"""The GPU catalog: datasheet peaks and memory, keyed by normalised device name.

The data lives in `bench/data/gpus.csv`, one row per GPU with its source and the date it
was recorded. Each row's `name_pattern` must match the whole normalised name, so no
row's order matters (a substring chain would let "H20" hit "H200").

`generation`, `sm_count`, `boost_clock_mhz` and `l2_mib` (with `facts_source`) are what the
throughput model needs to tell GPUs apart beyond peaks and bandwidth; empty where no source was found.

`memory_gib` is the nominal capacity (the "40GB" of the product name, read as GiB; what
torch can allocate is a little less). Memory bandwidth is decimal GB/s (1e9 bytes/s), as
datasheets print it.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

# Which datasheet column bounds each precision. fp32 runs with TF32 off, tf32 with it on.
PEAK_COLUMN = {"fp32": "fp32_tflops", "bf16": "bf16_tflops", "fp16": "fp16_tflops", "tf32": "tf32_tflops"}


@dataclass(frozen=True)
class GpuSpec:
    gpu: str
    memory_gib: float
    peak_tflops: dict[str, float | None]
    """Dense peak TFLOP/s by datasheet column (fp32_tflops, tf32_tflops, ...); None if absent."""
    source: str
    observed: str
    memory_bandwidth_gb_per_s: float | None = None
    """Datasheet memory bandwidth, decimal GB/s; its source is `memory_bandwidth_source`."""
    memory_bandwidth_source: str = ""
    generation: str = ""
    """Architecture (volta, turing, ampere, ada, hopper, blackwell): tensor cores differ by generation."""
    sm_count: int | None = None
    boost_clock_mhz: float | None = None
    """Boost clock: the clock the datasheet peaks are quoted at."""
    l2_mib: float | None = None
    facts_source: str = ""
    """The source of `generation`, `sm_count`, `boost_clock_mhz` and `l2_mib`."""

    def peak_flops_per_s(self, precision: str) -> float | None:
        tflops = self.peak_tflops[PEAK_COLUMN[precision]]
        return None if tflops is None else tflops * 1e12


def normalise_gpu_name(name: str) -> str:
    """`torch.cuda.get_device_name()` without vendor and brand words, lower case.

    >>> normalise_gpu_name("NVIDIA GeForce RTX 4090")
    'rtx 4090'
    """
    words = [w for w in name.lower().split() if w not in ("nvidia", "tesla", "geforce")]
    return " ".join(words)


def find_gpu(device_name: str) -> GpuSpec | None:
    """The catalog row for a device name, or None for a GPU the catalog does not know."""
    normalised = normalise_gpu_name(device_name)
    matches = [spec for pattern, spec in _catalog() if pattern.fullmatch(normalised)]
    if len(matches) > 1:
        raise ValueError(f"GPU catalog is ambiguous for {device_name!r}: {[m.gpu for m in matches]}")
    return matches[0] if matches else None


def gpu_spec(gpu: str) -> GpuSpec | None:
    """The catalog row whose key (the `gpu` column) is `gpu`, or None.

    >>> gpu_spec("H200").memory_gib
    141.0
    """
    return next((spec for _, spec in _catalog() if spec.gpu == gpu), None)


def gpu_keys() -> tuple[str, ...]:
    """Every GPU the catalog knows, by key: `('A100-40GB', 'A100-80GB', ...)`."""
    return tuple(spec.gpu for _, spec in _catalog())


@lru_cache(maxsize=None)
def _catalog() -> tuple[tuple[re.Pattern, GpuSpec], ...]:
    text = resources.files("bench.data").joinpath("gpus.csv").read_text()
    rows = []
    for row in csv.DictReader(text.splitlines()):
        peaks = {col: _number(row[col]) for col in ("fp32_tflops", "tf32_tflops", "bf16_tflops", "fp16_tflops")}
        bandwidth = _number(row["memory_bandwidth_gb_per_s"])
        spec = GpuSpec(row["gpu"], float(row["memory_gib"]), peaks, row["source"], row["observed"],
                       bandwidth, row["memory_bandwidth_source"], row["generation"], _number(row["sm_count"], int),
                       _number(row["boost_clock_mhz"]), _number(row["l2_mib"]), row["facts_source"])
        rows.append((re.compile(row["name_pattern"]), spec))
    return tuple(rows)


def _number(text: str, kind: type = float) -> float | int | None:
    """A catalog cell: empty means no source was found, never zero."""
    return kind(text) if text else None


def gpu_key_hint(name: str) -> str:
    """For a GPU name the catalog does not know: the keys it may have meant, else every key.

    Keys that start with the name come first (`A100` -> the A100s), then close spellings.

    >>> gpu_key_hint("A100")
    'did you mean A100-40GB, A100-80GB, A100-80GB-PCIe?'
    >>> gpu_key_hint("h100-80gb")
    'did you mean H100-80GB?'
    """
    import difflib

    keys = gpu_keys()
    folded = name.strip().lower()
    close = [key for key in keys if key.lower().startswith(folded)] if folded else []
    close = close or [key for key in keys if key.lower() == folded] or [
        key for key in keys if key.lower() in difflib.get_close_matches(folded, [k.lower() for k in keys], n=3)]
    return f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(keys)}"
