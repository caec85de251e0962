"""A deterministic set of JPEG files shaped like ImageNet-1k's training split.

Used when `bench run` gets no `--data-dir`: the loader then reads, decodes and augments files
whose pixel counts, JPEG settings and byte sizes are those of ImageNet, so its CPU cost per
sample is close to the real one. A set is made once per `GeneratedSetSpec` into the user's cache folder
(`bench.cache.cache_dir`, outside the repository) and reused; rows record its name, size and seed.

The ImageNet figures matched (`IMAGENET_TRAIN`), and where they come from:

* Mean image size 469 x 387 px: the figure widely cited for ImageNet (e.g. the OpenImagesV7-100
  dataset README cites "469x387px" to image-net.org/challenges/LSVRC/2014/). The primary page's
  text could not be retrieved here: a widely cited figure, not a verified one.
* Typical size long side 500 px (median 500 x 375), JPEG quality 96 without chroma subsampling
  (4:4:4): M. Ehrlich, "Compression in the ImageNet Dataset" (2021), a survey of every training
  JPEG (the most common size is around 500 px; the vast majority are colour, 4:4:4, quality 96).
* Bytes per file: ILSVRC2012_img_train.tar is 147,897,477,120 bytes (the size checked by
  CompVis/taming-transformers' `ImageNetTrain`, and listed in jkjung-avt/keras_imagenet's
  README) for 1,281,167 images: 115.4 KB per image, ~114.7 KB of JPEG once ~768 B of tar header
  and padding per file are taken off.

Not matched (assumptions): the spread of sizes beyond mean and mode (a mixture: 78 % at long
side 500, 18 % smaller, 4 % larger, 17 % portrait), the spread of file sizes (a log-normal
texture strength), ImageNet's ~2 % grayscale and 22 CMYK files, and the content: smooth colour
fields, blurred shapes and 1/f-like noise, which compress like a photo but are no photo.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from bench.cache import cache_dir as user_cache_dir

GENERATOR_VERSION = 1
"""Bumped whenever the drawing changes: a new version is a new cache folder, never a silent reuse."""
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class ImageNetTrainStats:
    """Published figures for ImageNet-1k (ILSVRC2012) train, each with its source (module docstring)."""

    images: int = 1_281_167
    train_tar_bytes: int = 147_897_477_120
    mean_width_px: float = 469.0
    mean_height_px: float = 387.0
    typical_long_side_px: int = 500
    jpeg_quality: int = 96
    chroma_subsampling: str = "4:4:4"
    sources: tuple[str, ...] = (
        "1,281,167 train images: ILSVRC2012 (Russakovsky et al., IJCV 2015)",
        "train tar 147,897,477,120 bytes: CompVis/taming-transformers ImageNetTrain; jkjung-avt/keras_imagenet README",
        "mean 469x387 px: widely cited (e.g. OpenImagesV7-100 README, citing image-net.org/challenges/LSVRC/2014/); "
        "unverified: the primary page was not retrieved",
        "typical long side 500 px, quality 96, 4:4:4: M. Ehrlich, 'Compression in the ImageNet Dataset' (2021)",
    )

    @property
    def mean_file_bytes(self) -> float:
        """Mean JPEG bytes per image: the tar's size per image less ~768 B of tar header and padding.

        >>> round(IMAGENET_TRAIN.mean_file_bytes / 1000, 1)
        114.7
        """
        return self.train_tar_bytes / self.images - 768


IMAGENET_TRAIN = ImageNetTrainStats()


@dataclass(frozen=True)
class GeneratedSetSpec:
    """What defines one generated set; the same spec always gives the same bytes, names and order."""

    images: int = 1024
    """Files in the set. The loader cycles through them (a new shuffle each pass), so the count sets
    variety, not the cost per sample; 1,024 files are ~117 MB."""
    classes: int = 128
    """Class folders (image i goes to class i % classes); at most the models' 1,000 outputs."""
    seed: int = 0
    quality: int = IMAGENET_TRAIN.jpeg_quality
    subsampling: str = IMAGENET_TRAIN.chroma_subsampling
    size_scale: float = 1.0
    """Scales every image's sides (1.0: ImageNet's sizes); tests use small images."""
    texture_median: float = 8.9
    """Median noise amplitude (grey levels); calibrated so the mean file is ~114.7 KB at scale 1."""
    texture_sigma: float = 0.35
    """Log-normal spread of the noise amplitude: it spreads the file sizes."""

    def __post_init__(self) -> None:
        if self.images < 1 or not 1 <= self.classes <= 1000 or self.size_scale <= 0:
            raise ValueError(f"generated set: images >= 1, classes 1..1000 and size_scale > 0; got {self}")

    @property
    def name(self) -> str:
        """Folder name: readable, plus a digest of everything that changes the files."""
        digest = hashlib.sha1(json.dumps({**asdict(self), "v": GENERATOR_VERSION},
                                         sort_keys=True).encode()).hexdigest()[:10]
        return f"imagenet_like-v{GENERATOR_VERSION}-{self.images}img-{self.classes}cls-seed{self.seed}-{digest}"


_SUBSAMPLING = {"4:4:4": 0, "4:2:2": 1, "4:2:0": 2}
# The size mixture (module docstring): fitted so the set's mean is ~469 x 387.
_P_SMALL, _P_LARGE, _P_PORTRAIT = 0.18, 0.04, 0.17
_LARGE_LOG_MEAN, _LARGE_LOG_SIGMA = float(np.log(900)), 0.35


def draw_size(rng: np.random.Generator, scale: float = 1.0) -> tuple[int, int]:
    """(width, height): mostly long side 500 at 4:3 or 3:2, some smaller, a few large, some portrait."""
    u = rng.random()
    if u < _P_SMALL:
        long_side = int(rng.integers(200, 500))
    elif u < _P_SMALL + _P_LARGE:
        long_side = int(np.clip(np.exp(rng.normal(_LARGE_LOG_MEAN, _LARGE_LOG_SIGMA)), 501, 2500))
    else:
        long_side = IMAGENET_TRAIN.typical_long_side_px
    k = rng.random()
    aspect = 4 / 3 if k < 0.6 else 3 / 2 if k < 0.85 else 1.0 if k < 0.93 else rng.uniform(1.05, 2.0)
    long_side = max(8, round(long_side * scale))
    short_side = max(8, round(long_side / aspect))
    return (short_side, long_side) if rng.random() < _P_PORTRAIT else (long_side, short_side)


def render(rng: np.random.Generator, width: int, height: int, texture: float) -> Image.Image:
    """A photo-like RGB image: smooth colour field, a few soft-edged shapes, 1/f-like noise."""
    grid = rng.integers(0, 256, (int(rng.integers(3, 7)), int(rng.integers(3, 7)), 3), dtype=np.uint8)
    image = Image.fromarray(grid).resize((width, height), Image.BICUBIC)
    canvas = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(3, 9))):
        cx, cy = rng.integers(0, width), rng.integers(0, height)
        rx, ry = rng.integers(width // 10 + 1, width // 2 + 2), rng.integers(height // 10 + 1, height // 2 + 2)
        canvas.ellipse([cx - rx, cy - ry, cx + rx, cy + ry], fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
    pixels = np.asarray(image.filter(ImageFilter.GaussianBlur(1.5)), dtype=np.float32)
    pixels += texture * _octave_noise(rng, width, height)[..., None]
    pixels += 0.3 * texture * rng.standard_normal((height, width, 3), dtype=np.float32)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def _octave_noise(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """Luminance texture: noise at scales 1, 2, 4, 8 px, coarser octaves stronger (roughly 1/f)."""
    total = np.zeros((height, width), dtype=np.float32)
    for scale, weight in ((1, 0.35), (2, 0.5), (4, 0.7), (8, 1.0)):
        small = rng.standard_normal((height // scale + 1, width // scale + 1), dtype=np.float32)
        total += weight * np.asarray(Image.fromarray(small, mode="F").resize((width, height), Image.BILINEAR))
    return total / 1.3


def relative_path(spec: GeneratedSetSpec, index: int) -> str:
    """ImageFolder layout, ImageNet-style names: n<class>/n<class>_<index>.JPEG (class = index % classes)."""
    synset = f"n{index % spec.classes:08d}"
    return f"{synset}/{synset}_{index:07d}.JPEG"


def encode(spec: GeneratedSetSpec, index: int) -> bytes:
    """The JPEG bytes of image `index`: a pure function of (spec, index), whichever process draws it."""
    rng = np.random.default_rng([spec.seed, index])
    width, height = draw_size(rng, spec.size_scale)
    texture = float(spec.texture_median * np.exp(rng.normal(0.0, spec.texture_sigma)))
    buffer = io.BytesIO()
    render(rng, width, height, texture).save(buffer, "JPEG", quality=spec.quality,
                                             subsampling=_SUBSAMPLING[spec.subsampling])
    return buffer.getvalue()


def _write_chunk(spec: GeneratedSetSpec, root: str, indices: range) -> list[tuple[str, int]]:
    written = []
    for index in indices:
        path = relative_path(spec, index)
        data = encode(spec, index)
        (Path(root) / path).write_bytes(data)
        written.append((path, len(data)))
    return written


def generate(spec: GeneratedSetSpec, root: Path, processes: int = 1) -> dict:
    """Write the set's files under `root` (which must not exist yet) and its manifest; returns the manifest."""
    root.mkdir(parents=True)
    for synset in sorted({relative_path(spec, i).split("/")[0] for i in range(min(spec.images, spec.classes))}):
        (root / synset).mkdir()
    chunks = [range(start, min(start + 64, spec.images)) for start in range(0, spec.images, 64)]
    began = time.perf_counter()
    if processes > 1 and len(chunks) > 1:
        with ProcessPoolExecutor(min(processes, len(chunks))) as pool:
            parts = list(pool.map(_write_chunk, [spec] * len(chunks), [str(root)] * len(chunks), chunks))
    else:
        parts = [_write_chunk(spec, str(root), chunk) for chunk in chunks]
    files = sorted(f for part in parts for f in part)  # ImageFolder's order: class folder, then file name
    manifest = {"generator_version": GENERATOR_VERSION, "name": spec.name, "spec": asdict(spec),
                "files": files, "total_bytes": sum(size for _, size in files),
                "generation_s": round(time.perf_counter() - began, 2)}
    (root / MANIFEST).write_text(json.dumps(manifest))
    return manifest


def generated_set_root(spec: GeneratedSetSpec, cache_dir: Path | None = None) -> Path:
    """Where `spec`'s set lives (or will) under the cache folder."""
    return (Path(cache_dir) if cache_dir else user_cache_dir()) / spec.name


def ensure_generated_set(spec: GeneratedSetSpec = GeneratedSetSpec(), cache_dir: Path | None = None,
                         processes: int = 1) -> Path:
    """The folder of `spec`'s set, generated on first use and reused after.

    Safe against concurrent callers (a file lock) and against a run killed mid-generation (files
    are written to a temporary folder and renamed into place only when complete).
    """
    final = generated_set_root(spec, cache_dir)
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{spec.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (final / MANIFEST).exists():
            partial = final.parent / f".{spec.name}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            generate(spec, partial, processes)
            shutil.rmtree(final, ignore_errors=True)
            partial.rename(final)
    return final


def read_manifest(root: Path) -> dict | None:
    """The manifest of a generated set at `root`; None for any other folder."""
    path = Path(root) / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and "spec" in manifest else None


def set_statistics(root: Path) -> dict:
    """Width, height (px) and file size (bytes) over a folder's JPEGs: mean, median, p10, p90 (headers only)."""
    paths = sorted(Path(root).glob("*/*.JPEG"))
    dims = np.array([Image.open(p).size for p in paths], dtype=float)
    sizes = np.array([p.stat().st_size for p in paths], dtype=float)

    def summary(values: np.ndarray) -> dict:
        p10, p50, p90 = np.percentile(values, [10, 50, 90])
        return {"mean": round(float(values.mean()), 1), "median": float(p50), "p10": float(p10), "p90": float(p90)}

    return {"images": len(paths), "width_px": summary(dims[:, 0]), "height_px": summary(dims[:, 1]),
            "file_bytes": summary(sizes), "total_bytes": int(sizes.sum())}
