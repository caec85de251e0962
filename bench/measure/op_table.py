"""What the op recorder (`bench.measure.ops`) records of an op (`OpRecord`, its class), and a step's recorded ops
as tables by part, reused for every GPU and K. Plain numbers: no torch here.

Two micro-steps are traced: the first (gradients created) and the second (gradients accumulated
into), then the update (optimizer step and zero_grad). A step with K micro-batches is the first
micro-step, K - 1 times the second, and the update: the prediction for any K costs one trace.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Literal, get_args

import numpy as np

OpClass = Literal["matmul", "conv", "grouped_conv", "attention", "norm", "batch_norm", "reduction",
                  "elementwise", "optimizer", "view"]
"""`batch_norm`: batch normalisation over the batch's statistics (training) and every batch-norm backward, whose
kernels read their input twice (statistics, then the normalising or gradient pass); `norm`: the other
normalisations (layer and group norm, batch norm on running statistics)."""
COMPUTE_CLASSES: tuple[OpClass, ...] = ("matmul", "conv", "grouped_conv", "attention")
"""Classes timed by FLOPs against a tensor-core or FMA peak (and by bytes, whichever is longer)."""


@dataclass(frozen=True)
class OpRecord:
    """One dispatched aten op."""

    name: str
    """The overload, e.g. `aten.convolution.default`."""
    op_class: OpClass
    flops: float
    """torch.utils.flop_counter's count (2 per multiply-accumulate); 0 for ops it does not count."""
    bytes_moved: int
    """Bytes of every input tensor read plus every output tensor written."""
    dtype: str
    """The compute dtype: the first floating-point input's (`float16`, `float32`, ...)."""
    channels_last: bool = False
    """Convolutions: the input is in channels-last format."""
    out_elements: int = 0
    """Elements of every output tensor: a compute kernel's output tiles (its waves over the SMs), a
    non-tensor kernel's work per SM. 0 for views."""


Part = Literal["first_micro", "next_micro", "update"]
PARTS: tuple[Part, ...] = get_args(Part)
OP_CLASSES: tuple[OpClass, ...] = get_args(OpClass)
DTYPES = ("float16", "bfloat16", "float32", "other")


@dataclass(frozen=True)
class OpTable:
    """Ops as columns (one entry per op, or per group of identical ops with `count`)."""

    op_class: np.ndarray
    """Index into `OP_CLASSES`."""
    dtype: np.ndarray
    """Index into `DTYPES`."""
    flops: np.ndarray
    bytes_moved: np.ndarray
    channels_last: np.ndarray
    count: np.ndarray
    """How many times each entry runs in the step."""
    out_elements: np.ndarray
    """Output elements of each entry (`OpRecord.out_elements`)."""

    @classmethod
    def of(cls, records: Iterable[OpRecord], count: float = 1.0) -> OpTable:
        rows = [(OP_CLASSES.index(r.op_class), DTYPES.index(r.dtype) if r.dtype in DTYPES else len(DTYPES) - 1,
                 r.flops, r.bytes_moved, r.channels_last, r.out_elements) for r in records]
        columns = list(zip(*rows)) if rows else [(), (), (), (), (), ()]
        return cls(np.array(columns[0], dtype=np.int8), np.array(columns[1], dtype=np.int8),
                   np.array(columns[2], dtype=np.float64), np.array(columns[3], dtype=np.float64),
                   np.array(columns[4], dtype=bool), np.full(len(rows), count),
                   np.array(columns[5], dtype=np.float64))

    @classmethod
    def concat(cls, tables: list[OpTable]) -> OpTable:
        return cls(*(np.concatenate([getattr(t, name) for t in tables]) for name in _COLUMNS))

    def scaled(self, count: float) -> OpTable:
        return replace(self, count=self.count * count)

    def grouped(self) -> OpTable:
        """Identical entries merged, their counts summed (the same step, fewer rows), in a fixed order."""
        keys = np.stack([self.op_class, self.dtype, self.flops, self.bytes_moved, self.channels_last,
                         self.out_elements], axis=1)
        unique, inverse = np.unique(keys, axis=0, return_inverse=True)
        counts = np.bincount(inverse.ravel(), weights=self.count, minlength=len(unique))
        return OpTable(unique[:, 0].astype(np.int8), unique[:, 1].astype(np.int8), unique[:, 2], unique[:, 3],
                       unique[:, 4].astype(bool), counts, unique[:, 5])


_COLUMNS = ("op_class", "dtype", "flops", "bytes_moved", "channels_last", "count", "out_elements")


@dataclass(frozen=True)
class StepOps:
    """The ops of one cell's step, by part (see the module docstring)."""

    parts: dict[Part, OpTable]
    micro_batch: int

    def to_json(self) -> dict:
        """The ops as JSON lists with their dtypes (the trace cache, `bench.memory.traces`); `from_json` reads them back exactly.

        >>> ops = StepOps({p: OpTable.of([]) for p in PARTS}, 8)
        >>> StepOps.from_json(ops.to_json()).micro_batch
        8
        """
        return {"micro_batch": self.micro_batch,
                "parts": {part: {name: [str(getattr(table, name).dtype), getattr(table, name).tolist()]
                                 for name in _COLUMNS} for part, table in self.parts.items()}}

    @classmethod
    def from_json(cls, data: dict) -> StepOps:
        """Raises KeyError, TypeError or ValueError for data of another layout."""
        parts = {part: OpTable(*(np.array(columns[name][1], dtype=columns[name][0]) for name in _COLUMNS))
                 for part, columns in data["parts"].items()}
        if set(parts) != set(PARTS):
            raise ValueError(f"parts {sorted(parts)}, not {PARTS}")
        return cls(parts, int(data["micro_batch"]))

    def at_micro_batch(self, other: StepOps, micro_batch: int) -> StepOps:
        """The ops at `micro_batch`, read off the line through this trace and `other` (another micro-batch).

        An op's FLOPs and bytes are a constant (weights) plus a part proportional to the micro-batch
        (activations), so two traces give every size. Raises ValueError when the two traces are not the
        same op sequence.

        >>> a = StepOps({p: OpTable.of([]) for p in PARTS}, 8)
        >>> a.at_micro_batch(StepOps(a.parts, 16), 32).micro_batch
        32
        """
        parts = {}
        for part in PARTS:
            low, high = self.parts[part], other.parts[part]
            if len(low.count) != len(high.count) or (low.op_class != high.op_class).any() or \
                    (low.dtype != high.dtype).any():
                raise ValueError(f"{part}: traces at micro-batches {self.micro_batch} and {other.micro_batch} "
                                 "differ in their ops")
            weight = (micro_batch - self.micro_batch) / (other.micro_batch - self.micro_batch)
            line = lambda a, b: np.maximum(a + weight * (b - a), 0)
            parts[part] = replace(low, flops=line(low.flops, high.flops),
                                  bytes_moved=line(low.bytes_moved, high.bytes_moved),
                                  out_elements=line(low.out_elements, high.out_elements))
        return StepOps(parts, micro_batch)

    def with_dtype(self, old: str, new: str) -> StepOps:
        """The same ops with dtype `old` read as `new` (fp16's step from bf16's trace: the same shapes)."""
        swap = lambda t: replace(t, dtype=np.where(t.dtype == DTYPES.index(old), DTYPES.index(new), t.dtype)
                                 .astype(np.int8))
        return StepOps({part: swap(table) for part, table in self.parts.items()}, self.micro_batch)

    def for_step(self, accum_steps: int) -> OpTable:
        """Every op of a step of `accum_steps` micro-batches."""
        if accum_steps > 1 and not len(self.parts["next_micro"].count):
            raise ValueError("traced with one micro-step: it answers accum_steps 1 only")
        return OpTable.concat([self.parts["first_micro"], self.parts["next_micro"].scaled(accum_steps - 1),
                               self.parts["update"]])
