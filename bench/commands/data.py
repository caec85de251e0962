"""`bench data make`: the generated ImageNet-like JPEG set, made once into the cache folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.commands.common import positive_int
from bench.commands.formats import add_format_option
from bench.units import mb


def register(commands: argparse._SubParsersAction) -> None:
    data = commands.add_parser("data", help="the JPEG data sets the loader inputs read")
    actions = data.add_subparsers(required=True, metavar="ACTION")
    make = actions.add_parser("make", help="generate the ImageNet-like set once (reused after) and print its figures "
                                           "against ImageNet's")
    make.set_defaults(handler=make_set)
    add_format_option(make, text_only=True)
    make.add_argument("--images", type=positive_int, help="files in the set (default 1024)")
    make.add_argument("--classes", type=positive_int, help="class folders, at most 1000 (default 128)")
    make.add_argument("--seed", type=int, help="seed of the drawing (default 0)")
    make.add_argument("--cache-dir", type=Path,
                      help="where generated sets live (default: $BENCH_CACHE_DIR, else ~/.cache/bench)")


def make_set(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from bench.errors import OptionError
    from bench.measure.host import usable_cpus
    from bench.train.imagenet_like import (
        IMAGENET_TRAIN,
        GeneratedSetSpec,
        ensure_generated_set,
        set_statistics,
    )

    chosen = {name: value for name, value in (("images", args.images), ("classes", args.classes),
                                              ("seed", args.seed)) if value is not None}
    try:
        spec = replace(GeneratedSetSpec(), **chosen)
    except ValueError:
        raise OptionError(f"--classes {args.classes}: at most 1000 (the models' outputs)") from None
    announce_generation(spec, args.cache_dir)
    root = ensure_generated_set(spec, args.cache_dir, processes=usable_cpus())
    stats = set_statistics(root)
    print(f"{root}: {stats['images']:,} images, {mb(stats['total_bytes'])}, seed {spec.seed}")
    imagenet = {"width_px": IMAGENET_TRAIN.mean_width_px, "height_px": IMAGENET_TRAIN.mean_height_px,
                "file_bytes": IMAGENET_TRAIN.mean_file_bytes}
    print(f"  {'':<10} {'mean':>10} {'median':>10} {'p10':>10} {'p90':>10}   ImageNet mean")
    for key, label in (("width_px", "width px"), ("height_px", "height px"), ("file_bytes", "file bytes")):
        s = stats[key]
        print(f"  {label:<10} {s['mean']:>10,.1f} {s['median']:>10,.0f} {s['p10']:>10,.0f} {s['p90']:>10,.0f}"
              f"   {imagenet[key]:,.1f}")
    print(f"  JPEG quality {spec.quality}, {spec.subsampling} (ImageNet: {IMAGENET_TRAIN.jpeg_quality}, "
          f"{IMAGENET_TRAIN.chroma_subsampling})")
    print("  sources: " + "; ".join(IMAGENET_TRAIN.sources))
    return 0


def announce_generation(spec=None, cache_dir: Path | None = None) -> None:
    """Say so when the set is about to be generated (it takes a while, once)."""
    from bench.train.imagenet_like import MANIFEST, GeneratedSetSpec, generated_set_root

    spec = spec or GeneratedSetSpec()
    root = generated_set_root(spec, cache_dir)
    if not (root / MANIFEST).exists():
        print(f"data: generating the ImageNet-like set ({spec.images:,} JPEGs, seed {spec.seed}) into {root}, once",
              flush=True)
