"""JPEG files through a torchvision DataLoader, as ImageNet training reads them.

In the order a loader cell uses them:

* `open_data`: an ImageFolder tree (`bench run --data-dir`; a real ImageNet train split works
  unchanged) or the generated ImageNet-like set (`bench.train.imagenet_like`), discovered once with
  torchvision's ImageFolder helpers (`find_classes`, `make_dataset`) into an `ImageData`, or a
  one-line `DataDirError` saying what is wrong with the folder.
* `JpegFiles`: the dataset. Reads a file's bytes, decodes them with `torchvision.io.decode_jpeg`
  and applies `train_transform` (torchvision's reference recipe with `transforms.v2`). With
  `decode=False` it returns the bytes, for decoding on the GPU (`device_transform`).
* `make_loader`: the DataLoader: shuffled, whole micro-batches, pinned memory on CUDA,
  persistent workers that die with the cell (`DieWithParent`).

A corrupt file met mid-run fails the cell with `CorruptImageError` naming the file (the policy:
a benchmark measures a fixed workload, and skipping files would change it silently). A valid
image that is not a JPEG inside (ImageNet's train split has one PNG named .JPEG) is decoded by
`decode_image` instead, so a real ImageNet runs through.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler, get_worker_info
from torchvision.datasets.folder import find_classes, make_dataset
from torchvision.io import ImageReadMode, decode_image, decode_jpeg
from torchvision.transforms import v2

from bench.errors import DataDirError
from bench.train.imagenet_like import (
    GeneratedSetSpec,
    ensure_generated_set,
    read_manifest,
)
from bench.train.models import NUM_CLASSES

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
JPEG_EXTENSIONS = (".jpg", ".jpeg")
"""What ImageFolder's helpers match, case-insensitively (ImageNet's .JPEG too)."""
PREFETCH_FACTOR = 2
"""Micro-batches each worker keeps ready (DataLoader's default)."""
PASSES_AHEAD = 1 << 40
"""Samples the sampler is asked for: one endless epoch, reshuffled at every pass over the files, so
a small set never pays an epoch boundary's refill (ImageNet's epoch is 10,000 micro-batches long)."""

Batch = tuple[torch.Tensor, torch.Tensor]


class CorruptImageError(RuntimeError):
    """A file of the data set could not be read or decoded; the message names the file."""


@dataclass(frozen=True)
class ImageData:
    """An ImageFolder tree's JPEG samples in ImageFolder's order, and what every row records about them.

    Paths are one numpy bytes array, not a list of str: forked workers touching a list's objects
    would copy its pages one by one (copy-on-write through reference counts).
    """

    root: Path
    paths: np.ndarray = field(repr=False)
    """Relative paths (bytes), class folder then file name."""
    labels: np.ndarray = field(repr=False)
    classes: int
    columns: dict
    """`data_source`, `data_set`, `data_images`, `data_bytes`, `data_seed` (bench.results.schema)."""

    def __len__(self) -> int:
        return len(self.labels)

    def path(self, index: int) -> str:
        return os.path.join(self.root, self.paths[index].decode())


def open_data(data_dir: Path | None, *, spec: GeneratedSetSpec = GeneratedSetSpec(),
              cache_dir: Path | None = None, processes: int = 1) -> ImageData:
    """`data_dir`'s samples, or without one the generated ImageNet-like set for `spec` (made on
    first use into `cache_dir`, reused after). Raises `DataDirError` for a folder it cannot use."""
    if data_dir is None:
        return discover(ensure_generated_set(spec, cache_dir, processes))
    return discover(data_dir)


def discover(data_dir: Path) -> ImageData:
    """The JPEG samples of an ImageFolder tree, or a `DataDirError` saying what is wrong with it."""
    root = Path(data_dir).expanduser()
    where = f"--data-dir {root}"
    if not root.exists():
        raise DataDirError(f"{where}: does not exist; expected an ImageFolder tree ({root}/<class>/<image>.JPEG)")
    if not root.is_dir():
        raise DataDirError(f"{where}: is not a directory; expected an ImageFolder tree")
    if not any(root.iterdir()):
        raise DataDirError(f"{where}: is empty; expected an ImageFolder tree ({root}/<class>/<image>.JPEG)")
    try:
        classes, class_to_idx = find_classes(str(root))
    except FileNotFoundError:
        raise DataDirError(f"{where}: not an ImageFolder tree: no class folders "
                           f"(expected {root}/<class>/<image>.JPEG)") from None
    # ImageFolder walks class folders recursively: given imagenet/ instead of imagenet/train it
    # would find two "classes", train and val. A real tree's class folders hold files only.
    nested = [c for c in classes[:50] if any(child.is_dir() for child in (root / c).iterdir())]
    if nested:
        raise DataDirError(f"{where}: not an ImageFolder tree: class folder {nested[0]} holds folders; "
                           f"pass the split itself (e.g. {root / nested[0]})")
    if len(classes) > NUM_CLASSES:
        raise DataDirError(f"{where}: {len(classes)} class folders; the models have {NUM_CLASSES} outputs")
    samples = make_dataset(str(root), class_to_idx, extensions=JPEG_EXTENSIONS, allow_empty=True)
    found = {Path(path).relative_to(root).parts[0] for path, _ in samples}
    empty = [c for c in classes if c not in found]
    if empty:
        raise DataDirError(f"{where}: not an ImageFolder tree: {len(empty)} of {len(classes)} class folders "
                           f"hold no .jpg/.jpeg file (first: {empty[0]})")
    paths = np.array([os.path.relpath(path, root).encode() for path, _ in samples], dtype=np.bytes_)
    labels = np.array([label for _, label in samples], dtype=np.int64)
    return ImageData(root, paths, labels, len(classes), _columns(root, paths))


def _columns(root: Path, paths: np.ndarray) -> dict:
    manifest = read_manifest(root)
    if manifest is not None and len(manifest["files"]) == len(paths):
        return {"data_source": "generated", "data_set": manifest["name"], "data_images": len(paths),
                "data_bytes": manifest["total_bytes"], "data_seed": manifest["spec"]["seed"]}
    # One stat per file: a few seconds over ImageNet's 1.28 M files, done once per `bench run`.
    total = sum(os.stat(os.path.join(root, p.decode())).st_size for p in paths)
    return {"data_source": "dir", "data_set": str(root), "data_images": len(paths), "data_bytes": total,
            "data_seed": None}


# --------------------------------------------------------------------------- decoding


def read_bytes(path: str) -> torch.Tensor:
    """A file's bytes as a uint8 tensor."""
    try:
        with open(path, "rb") as handle:
            return torch.frombuffer(bytearray(handle.read()), dtype=torch.uint8)
    except OSError as exc:
        raise CorruptImageError(f"unreadable image {path}: {exc.strerror}") from None


def decode_rgb(data: torch.Tensor, path: str) -> torch.Tensor:
    """(3, H, W) uint8: a JPEG by `decode_jpeg`, any other image format by `decode_image`."""
    is_jpeg = data.numel() >= 2 and int(data[0]) == 0xFF and int(data[1]) == 0xD8
    try:
        return (decode_jpeg if is_jpeg else decode_image)(data, mode=ImageReadMode.RGB)
    except RuntimeError as exc:
        raise CorruptImageError(f"corrupt image {path}: {_decoder_reason(exc)}") from None


def _decoder_reason(exc: BaseException) -> str:
    # torchvision prefixes "decode_jpeg, <source file>:<line>, "; keep the reason after it.
    return str(exc).strip().splitlines()[0].split(", ")[-1][:200]


def train_transform(image_size: int) -> v2.Compose:
    """ImageNet training augmentation, uint8 (3, H, W) -> float32 (3, S, S), normalised.

    torchvision's reference recipe (references/classification/presets.py, ClassificationPresetTrain):
    RandomResizedCrop (scale 0.08-1, ratio 3/4-4/3, bilinear, antialias), horizontal flip, to float
    in [0, 1], normalise with ImageNet's mean and std.
    """
    return v2.Compose([
        v2.RandomResizedCrop(image_size, antialias=True),
        v2.RandomHorizontalFlip(),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])


def device_transform(image_size: int) -> v2.Compose:
    """The same crop and flip for one image decoded on the GPU (float first: CUDA resizes floats);
    `normalize_batch` then normalises the stacked micro-batch in one op."""
    return v2.Compose([
        v2.ToDtype(torch.float32, scale=True),
        v2.RandomResizedCrop(image_size, antialias=True),
        v2.RandomHorizontalFlip(),
    ])


class Augment:
    """A `v2.Compose`'s transforms applied in order through their own `forward`.

    v2 transforms are `nn.Module`s; the runner's memory trace (MemTracker) refuses a top-level
    module called twice in one step, which every image of a micro-batch decoded in the training
    process would be. `forward` is the transform itself, without `nn.Module`'s hooks.
    """

    def __init__(self, compose: v2.Compose) -> None:
        self.transforms = list(compose.transforms)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        for transform in self.transforms:
            image = transform.forward(image)
        return image


def normalize_batch(images: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(IMAGENET_MEAN, device=images.device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=images.device).view(1, 3, 1, 1)
    return (images - mean) / std


class JpegFiles(Dataset):
    """Samples of an `ImageData`: (image, label), or with `decode=False` (bytes, label, index)."""

    def __init__(self, data: ImageData, image_size: int, *, decode: bool = True) -> None:
        self.data, self.decode = data, decode
        self.transform = Augment(train_transform(image_size))

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int):
        path = self.data.path(index)
        encoded = read_bytes(path)
        if not self.decode:
            return encoded, int(self.data.labels[index]), index
        return self.transform(decode_rgb(encoded, path)), int(self.data.labels[index])


class CollateImages:
    """Stacks a micro-batch in one copy, into shared memory when in a worker (as `default_collate`
    does) and channels-last when the cell asks: the format change costs the workers, not the loop."""

    def __init__(self, channels_last: bool) -> None:
        self.channels_last = channels_last

    def __call__(self, samples: list[tuple[torch.Tensor, int]]) -> Batch:
        images = [image for image, _ in samples]
        labels = torch.tensor([label for _, label in samples], dtype=torch.int64)
        channels, height, width = images[0].shape
        shape = (len(images), height, width, channels) if self.channels_last else (len(images), channels, height, width)
        out = _shared_empty(shape, images[0].dtype) if get_worker_info() else torch.empty(shape, dtype=images[0].dtype)
        if self.channels_last:
            torch.stack([image.permute(1, 2, 0) for image in images], out=out)
            return out.permute(0, 3, 1, 2), labels  # NCHW with channels-last strides
        torch.stack(images, out=out)
        return out, labels


def _shared_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    numel = int(np.prod(shape))
    storage = torch.UntypedStorage._new_shared(numel * torch.empty((), dtype=dtype).element_size())
    return torch.empty(0, dtype=dtype).set_(storage).view(shape)


def collate_encoded(samples: list[tuple[torch.Tensor, int, int]]) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """For decoding on the GPU: the encoded files as a list, their labels and their indices."""
    return ([encoded for encoded, _, _ in samples], torch.tensor([label for _, label, _ in samples]),
            torch.tensor([index for _, _, index in samples]))


# --------------------------------------------------------------------------- the DataLoader

_PR_SET_PDEATHSIG = 1


class DieWithParent:
    """worker_init_fn: the worker ends as soon as the process that forked it (the cell) dies.

    DataLoader's own watchdog ends an orphaned worker only when it next looks (each pass of its
    loop, at least every 5 s when idle). With PR_SET_PDEATHSIG the kernel sends SIGTERM the
    moment the cell dies, and the handler leaves with `os._exit`. Python runs the handler between
    bytecodes, so a worker never dies inside a C call such as the shared-memory allocation of a
    batch: SIGKILL there would leave a batch-sized torch_* file in /dev/shm until reboot.
    Linux only (elsewhere the watchdog stays the only guard). PDEATHSIG follows the *thread* that
    forked the worker, so the loader's iterator is created on the cell's main thread.
    """

    def __init__(self) -> None:
        self.parent_pid = os.getpid()

    def __call__(self, worker_id: int) -> None:
        if not sys.platform.startswith("linux"):
            return
        signal.signal(signal.SIGTERM, _exit_now)
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != self.parent_pid:  # the cell died before prctl took effect
            os._exit(1)


def _exit_now(signum: int, frame: object) -> None:
    """SIGTERM in a worker: the cell is gone; leave now, without Python's clean-up."""
    os._exit(128 + signum)


LoaderDecode = Literal["cpu", "gpu"]


@dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    """How a cell's DataLoader is built."""

    image_size: int
    micro_batch: int
    workers: int = 0
    """Worker processes; 0 decodes in the training process itself."""
    seed: int = 0
    """Shuffling order and the workers' augmentation seeds."""
    channels_last: bool = False
    decode: LoaderDecode = "cpu"
    """cpu: workers decode and augment; gpu: workers only read the files (`device_transform` follows)."""
    pin_memory: bool = False
    """Page-locked batches, for non-blocking copies to a GPU."""


def make_loader(data: ImageData, config: LoaderConfig) -> DataLoader:
    """The DataLoader a cell trains from: shuffled (seeded), whole micro-batches, one endless epoch."""
    if len(data) < config.micro_batch:
        raise DataDirError(f"--data-dir {data.root}: {len(data)} images, fewer than one micro-batch of "
                           f"{config.micro_batch}")
    generator = torch.Generator().manual_seed(config.seed)
    workers = config.workers
    collate: Callable = collate_encoded if config.decode == "gpu" else CollateImages(config.channels_last)
    return DataLoader(
        JpegFiles(data, config.image_size, decode=config.decode == "cpu"),
        batch_size=config.micro_batch, drop_last=True,
        sampler=RandomSampler(range(len(data)), num_samples=PASSES_AHEAD, generator=generator),
        generator=generator, num_workers=workers, collate_fn=collate, pin_memory=config.pin_memory,
        persistent_workers=workers > 0, prefetch_factor=PREFETCH_FACTOR if workers > 0 else None,
        worker_init_fn=DieWithParent() if workers > 0 else None,
        # Forked from the cell, so the workers are its children (DieWithParent).
        multiprocessing_context="fork" if workers > 0 and sys.platform.startswith("linux") else None,
    )
