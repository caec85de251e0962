"""The model options every command that names a model takes: `--model-kwargs`, `--input-size`, `--num-classes`.

Torch-free: the reference is checked here (`bench.grid.model_ref.model_problem`) before a handler loads torch;
`check_built` then runs the model's forward once, on the meta device, after torch has loaded.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from bench.errors import OptionError
from bench.grid.cell import axes
from bench.grid.model_ref import DEFAULT_NUM_CLASSES, ModelSpec, model_problem, parse_model_kwargs

MODEL_HELP = ("timm name, hf-hub:ORG/NAME (from the local Hugging Face cache), package.module:factory or "
              "path/to/file.py:factory (a function returning an nn.Module; it runs here)")


def add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-kwargs", type=_kwargs, default="{}", metavar="JSON",
                        help="keyword arguments of the model's factory (timm.create_model or yours), a JSON object, "
                             "e.g. '{\"drop_path_rate\": 0.1}'")
    parser.add_argument("--input-size", type=_input_size, metavar="C,H,W",
                        help="one sample's shape: channels, height, width (default 3,S,S with S the image size; "
                             "overrides --image-size)")
    parser.add_argument("--num-classes", type=_num_classes, default=DEFAULT_NUM_CLASSES,
                        help=f"classifier outputs; labels are drawn from range(N) (default {DEFAULT_NUM_CLASSES}); "
                             "a factory naming num_classes, in_chans or img_size in its signature is given them")


def model_fields(args: argparse.Namespace, image_size: int | None) -> dict[str, Any]:
    """The cell fields the options set: `image_size` (the height of --input-size, else the one given), `in_chans`,
    `image_width` (0 when square, so a square input keeps the id of a cell without the option), `num_classes`,
    `model_kwargs`. `image_size` None: no size given (plan's measured rows decide)."""
    fields: dict[str, Any] = {"model_kwargs": args.model_kwargs, "num_classes": args.num_classes}
    if args.input_size is None:
        return {**fields, "image_size": image_size}
    channels, height, width = args.input_size
    return {**fields, "image_size": height, "in_chans": channels, "image_width": 0 if width == height else width}


def model_extras(fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` without image_size, and without the values a plain timm cell has (so its id stays as it was)."""
    defaults = {"model_kwargs": "{}", "num_classes": DEFAULT_NUM_CLASSES, "in_chans": 3, "image_width": 0}
    return {name: value for name, value in fields.items() if name in defaults and value != defaults[name]}


def check_reference(model: str, where: str = "MODEL") -> None:
    """OptionError when the reference cannot be resolved (torch-free)."""
    problem = model_problem(model)
    if problem:
        raise OptionError(f"{where}: {problem}")


def check_built(cell: Any) -> None:
    """The model of `cell` (a `Cell`) checked against its bounds (`bench.grid.bounds`: OptionError naming the option
    and what is allowed), then built and run once on the meta device: one line (ModelRefError) when it is not an
    image classifier for its input. Loads torch."""
    from bench.train.model_bounds import problem
    from bench.train.model_build import check_classifier

    found = problem(cell)
    if found:
        axis, value, problem = found
        sized = "--input-size" if cell.image_width or cell.in_chans != 3 else "--image-size"
        option = {"checkpointing": "--checkpointing"}.get(axis, sized)
        raise OptionError(f"{option} {value}: not allowed for {cell.model}, {problem}")
    check_classifier(ModelSpec.of(cell))


def _kwargs(text: str) -> str:
    try:
        return parse_model_kwargs(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _input_size(text: str) -> tuple[int, int, int]:
    if not re.fullmatch(r"\d+,\d+,\d+", text.replace(" ", "")):
        raise argparse.ArgumentTypeError(f"{text!r}: give channels,height,width as three whole numbers, e.g. 3,224,224")
    channels, height, width = (int(part) for part in text.replace(" ", "").split(","))
    for name, value in (("channels", channels), ("height", height), ("width", width)):
        spec = axes()["in_chans" if name == "channels" else "image_size"]
        if not spec.minimum <= value <= spec.maximum:
            raise argparse.ArgumentTypeError(f"{text!r}: {name} must be {spec.minimum}..{spec.maximum}")
    return channels, height, width


def _num_classes(text: str) -> int:
    spec = axes()["num_classes"]
    if not text.isdigit() or not spec.minimum <= int(text) <= spec.maximum:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number {spec.minimum}..{spec.maximum}")
    return int(text)
