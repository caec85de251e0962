"""The model options every command that names a model takes: `--model-kwargs`, `--input-size`, `--num-classes`.

Torch-free: the reference is checked here (`bench.grid.model_ref.model_problem`) before a handler loads torch;
`check_built` then runs the model's forward once, on the meta device, after torch has loaded.
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from bench.errors import OptionError
from bench.grid.cell import axes
from bench.grid.model_ref import (
    DEFAULT_NUM_CLASSES,
    HubDefaults,
    hub_defaults,
    model_problem,
    parse_model_kwargs,
)

MODEL_HELP = ("timm name, hf-hub:ORG/NAME (from the local Hugging Face cache), package.module:factory or "
              "path/to/file.py:factory (a function returning an nn.Module; it runs here)")


def add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-kwargs", type=_kwargs, default="{}", metavar="JSON",
                        help="keyword arguments of the model's factory (timm.create_model or yours), a JSON object, "
                             "e.g. '{\"drop_path_rate\": 0.1}'")
    parser.add_argument("--input-size", type=_input_size, metavar="C,H,W",
                        help="one sample's shape: channels, height, width (default 3,S,S with S the image size; "
                             "overrides --image-size)")
    parser.add_argument("--num-classes", type=_num_classes,
                        help=f"classifier outputs; labels are drawn from range(N) (default: an hf-hub model's "
                             f"config, else {DEFAULT_NUM_CLASSES}); a factory naming num_classes, in_chans or img_size "
                             "in its signature is given them")


def model_fields(args: argparse.Namespace, image_size: int | None, *,
                 default_image_size: int | None = None) -> dict[str, Any]:
    """The cell fields the options set: `image_size` (the height of --input-size, else the one given), `in_chans`,
    `image_width` (0 when square, so a square input keeps the id of a cell without the option), `num_classes`,
    `model_kwargs`. What an option leaves unsaid, an hf-hub model's cached config says (`model_sources` tells
    which won), else `default_image_size` and 1000 classes. `image_size` None and no default: no size given
    (plan's measured rows decide)."""
    return _resolved(args, image_size, default_image_size)[0]


def model_sources(args: argparse.Namespace, image_size: int | None, *,
                  default_image_size: int | None = None) -> str | None:
    """For an hf-hub model, where each of its input, classes and kwargs came from, in one line; None otherwise.

    >>> args = argparse.Namespace(model="resnet50", model_kwargs="{}", num_classes=None, input_size=None)
    >>> model_sources(args, 224) is None
    True
    """
    return _resolved(args, image_size, default_image_size)[1]


def model_config_source(args: argparse.Namespace, image_size: int | None, *,
                        default_image_size: int | None = None) -> str:
    """For an hf-hub model, the row's `model_config_source` (as a grid cell's, `bench.grid.spec.hub_config_default`,
    with the option in place of `grid`); empty otherwise."""
    return _resolved(args, image_size, default_image_size)[2]


def _resolved(args: argparse.Namespace, image_size: int | None,
              default_image_size: int | None) -> tuple[dict[str, Any], str | None, str]:
    hub = hub_defaults(getattr(args, "model", None) or "")
    said = hub or HubDefaults(None, None, {})
    num_classes = args.num_classes or said.num_classes or DEFAULT_NUM_CLASSES
    fields: dict[str, Any] = {"model_kwargs": args.model_kwargs, "num_classes": num_classes}
    won = {"num_classes": "--num-classes" if args.num_classes else "hub config" if said.num_classes else "default"}
    if args.input_size is not None:
        channels, height, width = args.input_size
        won["input"] = "--input-size"
    elif said.input_size is not None:
        channels, hub_height, hub_width = said.input_size
        height, width = (image_size, image_size) if image_size is not None else (hub_height, hub_width)
        won["input"] = "--image-size, hub config channels" if image_size is not None else "hub config"
    else:
        size = image_size if image_size is not None else default_image_size
        channels, height, width = 3, size, size
        won["input"] = "--image-size" if image_size is not None else "default"
    fields.update({"image_size": height, "in_chans": channels, "image_width": 0 if width == height else width})
    if height is None:  # no size anywhere: plan's rows decide, and the input keeps its defaults
        fields = {"model_kwargs": fields["model_kwargs"], "num_classes": num_classes, "image_size": None}
    if hub is None:
        return fields, None, ""
    own = json.loads(args.model_kwargs)
    kwargs = {**said.model_kwargs, **own}
    won["kwargs"] = ("the option's over the hub config's" if own and said.model_kwargs else
                     "--model-kwargs" if own else "hub config" if said.model_kwargs else "none")
    shape = f"{channels}x{height}x{width}" if height is not None else f"{channels} channels"
    channels_won = ("--input-size" if args.input_size is not None else
                    "hub config" if said.input_size is not None else "default")
    kwargs_won = {"the option's over the hub config's": "--model-kwargs over hub config"}.get(won["kwargs"],
                                                                                              won["kwargs"])
    source = f"num_classes {won['num_classes']}, in_chans {channels_won}, model_kwargs {kwargs_won}"
    return fields, (f"{args.model}: {num_classes} classes ({won['num_classes']}), input {shape} ({won['input']}), "
                    f"kwargs {json.dumps(kwargs, sort_keys=True)} ({won['kwargs']})"), source


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
    from bench.train.model_build import check_cell_classifier

    found = problem(cell)
    if found:
        axis, value, problem = found
        sized = "--input-size" if cell.image_width or cell.in_chans != 3 else "--image-size"
        option = {"checkpointing": "--checkpointing"}.get(axis, sized)
        raise OptionError(f"{option} {value}: not allowed for {cell.model}, {problem}")
    check_cell_classifier(cell)


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
