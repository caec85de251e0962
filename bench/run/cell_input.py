"""Where a cell's micro-batches come from, and what a loader cell measures about them.

    with open_input(task, device) as source:          # before warm-up
        train_step(model, optimizer, source.step(K), ...)   # every step
        source.start_measuring()                      # just before the timed steps
        source.measured()                             # after them

`synthetic` is the harness's original input: one random micro-batch made on the device, reused
for every micro-step. `loader` and `loader_gpu_decode` read JPEG files through the DataLoader of
`bench.train.data`, fetching each micro-batch as the training loop reaches it (the step holds one
at a time), pinned and copied without blocking on CUDA, and time how long each step waited.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from typing import Iterator, Protocol, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader
from torchvision.io import ImageReadMode, decode_jpeg

from bench.grid.cell import Cell
from bench.measure.cpu import cpu_model_name
from bench.measure.host import usable_cpus
from bench.measure.input_pipeline import (
    LoaderAlone,
    pinned_peak_bytes,
    process_cpu_s,
    process_memory,
)
from bench.results.rows import InputMeasurement
from bench.train.data import (
    Augment,
    CorruptImageError,
    ImageData,
    LoaderConfig,
    decode_rgb,
    device_transform,
    make_loader,
    normalize_batch,
    open_data,
)
from bench.train.setup import cell_batch

Batch = tuple[torch.Tensor, torch.Tensor]
LOADER_ALONE_SAMPLES = 384
"""Samples per timed repeat of the loader alone (at least `workers x prefetch + 2` micro-batches)."""
LOADER_ALONE_REPEATS = 3


class LoaderUnavailable(Exception):
    """The input cannot run on this machine (decoding on the GPU without one): a skipped row."""


class InputSource(Protocol):
    def step(self, accum_steps: int) -> Sequence[Batch]:
        """The micro-batches of the next optimizer step."""

    def start_measuring(self) -> None:
        """Forget what warm-up and tracing did."""

    def measured(self) -> InputMeasurement | None:
        """What this input measured over the timed steps; None where it measures nothing."""


class SyntheticInput:
    """One micro-batch made on the device, reused for every micro-step: no input cost at all."""

    def __init__(self, batch: Batch) -> None:
        self.batch = batch

    def step(self, accum_steps: int) -> Sequence[Batch]:
        return [self.batch] * accum_steps

    def start_measuring(self) -> None:
        pass

    def measured(self) -> None:
        return None


class MicroBatchFeeder:
    """Micro-batches for the training loop, fetched as a loop fetches them, each wait timed.

    A micro-batch's wait is the host time from asking the loader for it until it is on the device
    (the non-blocking copy enqueued on CUDA; decoded there for GPU decoding); a step's wait is the
    sum over its K micro-batches. On CUDA the host may run ahead of the device, so a short wait
    can hide behind queued kernels; a loader slower than the step shows as wait, one faster as none.
    """

    def __init__(self, loader: DataLoader, device: torch.device, *, channels_last: bool,
                 image_size: int, gpu_decode: bool = False) -> None:
        self.loader, self.device, self.channels_last = loader, device, channels_last
        self.gpu_decode = gpu_decode
        self._device_transform = Augment(device_transform(image_size)) if gpu_decode else None
        self._iterator: Iterator | None = None
        self.micro_wait_ms: list[float] = []
        self.step_wait_ms: list[float] = []

    def micro_batch(self) -> Batch:
        """The next micro-batch on the device, its wait recorded."""
        began = time.perf_counter()
        batch = self._on_device(self._next_raw())
        self.micro_wait_ms.append((time.perf_counter() - began) * 1e3)
        return batch

    def step(self, accum_steps: int) -> StepBatches:
        """One step's micro-batches, fetched one at a time as the step consumes them."""
        return StepBatches(self, accum_steps)

    def start_measuring(self) -> None:
        self.micro_wait_ms.clear()
        self.step_wait_ms.clear()

    def worker_pids(self) -> list[int]:
        workers = getattr(self._iterator, "_workers", None) or []
        return [worker.pid for worker in workers if worker.is_alive()]

    def close(self) -> None:
        """Stop the workers now (a killed cell's workers die with it instead: `DieWithParent`)."""
        shutdown = getattr(self._iterator, "_shutdown_workers", None)
        if shutdown:
            shutdown()
        self._iterator = None

    def _next_raw(self):
        if self._iterator is None:
            self._iterator = iter(self.loader)  # forks the workers, from this (the main) thread
        try:
            return next(self._iterator)
        except CorruptImageError as exc:
            raise CorruptImageError(_worker_message(exc)) from None

    def _on_device(self, raw) -> Batch:
        if self.gpu_decode:
            return self._decode_on_device(*raw)
        images, labels = raw
        non_blocking = self.device.type == "cuda"  # from pinned memory: the copy does not block the host
        images = images.to(self.device, non_blocking=non_blocking)
        if self.channels_last and not images.is_contiguous(memory_format=torch.channels_last):
            images = images.contiguous(memory_format=torch.channels_last)
        return images, labels.to(self.device, non_blocking=non_blocking)

    def _decode_on_device(self, encoded: list[torch.Tensor], labels: torch.Tensor, indices: torch.Tensor) -> Batch:
        """nvjpeg's batched decode of the micro-batch, the crop and flip per image, one normalise."""
        try:
            decoded = decode_jpeg(encoded, mode=ImageReadMode.RGB, device=self.device)
        except RuntimeError:  # one bad file fails the batch: decode one by one to name it
            decoded = [self._decode_one(data, int(index)) for data, index in zip(encoded, indices)]
        images = normalize_batch(torch.stack([self._device_transform(image) for image in decoded]))
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return images, labels.to(self.device, non_blocking=True)

    def _decode_one(self, data: torch.Tensor, index: int) -> torch.Tensor:
        try:
            return decode_jpeg(data, mode=ImageReadMode.RGB, device=self.device)
        except RuntimeError:  # not a JPEG inside (decoded on the CPU), or corrupt (the error names it)
            return decode_rgb(data, self.loader.dataset.data.path(index)).to(self.device)


class StepBatches:
    """One step's micro-batches, fetched lazily: iterated once, one micro-batch held at a time."""

    def __init__(self, feeder: MicroBatchFeeder, accum_steps: int) -> None:
        self.feeder, self.accum_steps = feeder, accum_steps
        self.samples = accum_steps * feeder.loader.batch_size
        self._used = False

    def __len__(self) -> int:
        return self.accum_steps

    def __iter__(self) -> Iterator[Batch]:
        if self._used:
            raise RuntimeError("a step's micro-batches can be iterated once")
        self._used = True
        first = len(self.feeder.micro_wait_ms)
        for _ in range(self.accum_steps):
            yield self.feeder.micro_batch()
        self.feeder.step_wait_ms.append(sum(self.feeder.micro_wait_ms[first:]))


def _worker_message(exc: BaseException) -> str:
    # DataLoader re-raises a worker's exception as "Caught X in DataLoader worker process N.\n
    # Original Traceback ...\nmodule.X: <message>"; the row wants the original one-line message.
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    if not lines or not lines[0].startswith("Caught "):
        return lines[0] if lines else repr(exc)
    return lines[-1].split(": ", 1)[-1]


def loader_alone(feeder: MicroBatchFeeder, *, samples: int = LOADER_ALONE_SAMPLES,
                 repeats: int = LOADER_ALONE_REPEATS) -> LoaderAlone:
    """The loader alone, same workers, micro-batches fetched onto the device, no training.

    First drains what the workers already prefetched (workers x prefetch micro-batches), which
    would otherwise arrive for free and inflate the rate.
    """
    loader = feeder.loader
    ready = max(loader.num_workers, 1) * (loader.prefetch_factor or 1) + 2
    batches = max(math.ceil(samples / loader.batch_size), ready)
    for _ in range(ready):
        feeder._on_device(feeder._next_raw())
    pids = [os.getpid(), *feeder.worker_pids()]
    rates, cpu_ms = [], []
    for _ in range(repeats):
        cpu_before = sum(process_cpu_s(pid) for pid in pids)
        began = time.perf_counter()
        for _ in range(batches):
            images, _ = feeder._on_device(feeder._next_raw())
        if images.device.type == "cuda":
            torch.cuda.synchronize(images.device)
        done = batches * loader.batch_size
        rates.append(done / (time.perf_counter() - began))
        cpu_ms.append((sum(process_cpu_s(pid) for pid in pids) - cpu_before) * 1e3 / done)
    return LoaderAlone(float(np.median(rates)), float(min(rates)), float(max(rates)), float(np.median(cpu_ms)),
                       repeats, batches)


class LoaderInput:
    """JPEG files through a DataLoader: records the input wait, the loader alone, host memory."""

    def __init__(self, feeder: MicroBatchFeeder, data: ImageData) -> None:
        self.feeder, self.data = feeder, data

    def step(self, accum_steps: int) -> Sequence[Batch]:
        return self.feeder.step(accum_steps)

    def start_measuring(self) -> None:
        self.feeder.start_measuring()

    def measured(self) -> InputMeasurement:
        """Wait and memory of the timed steps, then the loader alone (after training, so the two
        never compete for the cores)."""
        main = process_memory(os.getpid())  # while the workers still hold a training-time prefetch
        workers = [process_memory(pid) for pid in self.feeder.worker_pids()]
        return InputMeasurement(step_wait_ms=list(self.feeder.step_wait_ms), loader=loader_alone(self.feeder),
                                main=main, workers=workers, pinned_peak_bytes=pinned_peak_bytes(self.feeder.device),
                                host_cpu_model=cpu_model_name(), host_cpus=usable_cpus(), data=self.data.columns)

    def close(self) -> None:
        self.feeder.close()


@contextlib.contextmanager
def open_input(cell: Cell, device: torch.device, data: ImageData | None = None) -> Iterator[InputSource]:
    """The cell's input source, its workers stopped on the way out. `data`: the runner's resolved data
    set (`bench.train.data.open_data`); without one, the default generated set."""
    if cell.input == "synthetic":
        yield SyntheticInput(cell_batch(cell, device))
        return
    gpu_decode = cell.input == "loader_gpu_decode"
    if gpu_decode and device.type != "cuda":
        raise LoaderUnavailable(f"input {cell.input}: decoding on the GPU needs CUDA (nvjpeg); this cell runs on "
                                f"{device.type}")
    data = data if data is not None else open_data(None)
    if device.type == "cpu" and cell.loader_workers:
        # Workers and the training process share the cores: oversubscribed OpenMP threads spin at
        # their barriers (a 30x slower step, measured on 2 cores), so the step gives up a thread each.
        torch.set_num_threads(max(1, torch.get_num_threads() - cell.loader_workers))
    config = LoaderConfig(image_size=cell.image_size, micro_batch=cell.micro_batch, workers=cell.loader_workers,
                          seed=cell.seed, channels_last=cell.channels_last, decode="gpu" if gpu_decode else "cpu",
                          pin_memory=device.type == "cuda")
    feeder = MicroBatchFeeder(make_loader(data, config), device, channels_last=cell.channels_last,
                              image_size=cell.image_size, gpu_decode=gpu_decode)
    source = LoaderInput(feeder, data)
    try:
        yield source
    finally:
        source.close()
