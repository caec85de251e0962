"""Where a model comes from: a timm name, `hf-hub:ORG/NAME`, `package.module:factory` or `path/to/file.py:factory`.

A model reference is the text a user types (the `model` of a cell); `ModelSpec` adds what the model is built
for: the input (channels, height, width), the class count and the factory's keyword arguments (JSON). Checking a
reference (`model_problem`) needs neither torch nor timm, so a command refuses a bad one before they load;
`create` builds the module, and `check_classifier` runs its forward once on the meta device, so a model that is
not an image classifier is refused in one line, not a traceback.

A module path or a file is code: it runs when the model is built. The command line and the API take them; a
grid file takes them only when it says so (`experiment.runs_model_code = true`).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from bench.errors import BadInput

if TYPE_CHECKING:
    import torch

    from bench.grid.cell import Cell

Kind = Literal["timm", "hf-hub", "module", "file"]
HF_PREFIX = "hf-hub:"
DEFAULT_NUM_CLASSES = 1000
FACTORY_OPTIONS = ("num_classes", "in_chans", "img_size")
"""What a factory is given, when its signature names them (timm's names): the class count, channels, input size."""
_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_CHECK_BATCH = 2  # BatchNorm in training mode needs more than one sample


class ModelRefError(BadInput):
    """A model reference cannot be resolved, or its model cannot train on the input asked for."""


def kind_of(name: str) -> Kind:
    """Which source a reference names.

    >>> [kind_of(n) for n in ("resnet50", "hf-hub:timm/resnet18.a1_in1k", "mypkg.nets:tiny", "nets/tiny.py:make")]
    ['timm', 'hf-hub', 'module', 'file']
    """
    if name.startswith(HF_PREFIX):
        return "hf-hub"
    if ":" in name:
        return "file" if name.rsplit(":", 1)[0].endswith(".py") else "module"
    return "timm"


def runs_code(name: str) -> bool:
    """Whether building the model runs code the reference names (a module path or a Python file)."""
    return kind_of(name) in ("module", "file")


def model_problem(name: str) -> str | None:
    """None when `name` can be resolved here; otherwise what is wrong, in one line. Imports neither torch nor timm
    (a module path's parent packages are imported to find it).

    >>> model_problem("nets/missing.py:make")
    "'nets/missing.py:make': no such file nets/missing.py"
    >>> model_problem("mypkg.nets:2fast")
    "'mypkg.nets:2fast': the factory must be a Python name, as in package.module:factory"
    """
    kind = kind_of(name)
    if kind == "hf-hub":
        return _hub_problem(name)
    if kind == "timm":
        from bench.grid.spec import timm_model_problem

        problem = timm_model_problem(name)
        return problem and problem + " (or name a factory: package.module:function or path/to/file.py:function)"
    target, factory = name.rsplit(":", 1)
    if not re.fullmatch(_IDENTIFIER, factory):
        return f"{name!r}: the factory must be a Python name, as in package.module:factory"
    if kind == "file":
        return None if Path(target).is_file() else f"{name!r}: no such file {target}"
    if not re.fullmatch(rf"{_IDENTIFIER}(\.{_IDENTIFIER})*", target):
        return f"{name!r}: {target!r} is not a module path (package.module)"
    _cwd_importable()
    try:
        found = importlib.util.find_spec(target)
    except ImportError as exc:  # a parent package is missing or fails to import
        return f"{name!r}: cannot import {target}: {exc}"
    return None if found else f"{name!r}: no module {target} (on sys.path or under {Path.cwd()})"


def parse_model_kwargs(text: str) -> str:
    """`--model-kwargs`: a JSON object, returned in one canonical spelling (the same arguments give the same
    cell id); ValueError saying what is wrong otherwise.

    >>> parse_model_kwargs('{"drop_rate": 0.1, "depth": 2}')
    '{"depth":2,"drop_rate":0.1}'
    """
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at character {exc.pos}): {text!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"must be a JSON object of keyword arguments, as '{{\"depth\": 2}}'; got {text!r}")
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class ModelSpec:
    """A model reference and what it is built for.

    >>> ModelSpec("test_resnet", 32, image_width=48, in_chans=1).input_shape
    (1, 32, 48)
    """

    name: str
    """timm name, hf-hub:ORG/NAME, package.module:factory or path/to/file.py:factory."""
    image_size: int
    """Input height in pixels (and width, unless `image_width` says otherwise)."""
    image_width: int = 0
    """Input width in pixels; 0: square, `image_size`."""
    in_chans: int = 3
    """Input channels."""
    num_classes: int = DEFAULT_NUM_CLASSES
    """Outputs of the classifier: the labels are drawn from range(num_classes)."""
    model_kwargs: str = "{}"
    """Keyword arguments of the factory (timm's `create_model` or the named function), JSON."""

    @classmethod
    def of(cls, cell: Cell) -> ModelSpec:
        return cls(cell.model, cell.image_size, cell.image_width, cell.in_chans, cell.num_classes, cell.model_kwargs)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """One sample's shape: (channels, height, width)."""
        return self.in_chans, self.image_size, self.image_width or self.image_size

    def describe_input(self, batch: int) -> str:
        return "x".join(str(n) for n in (batch, *self.input_shape))


def create(spec: ModelSpec) -> torch.nn.Module:
    """Build the model (random weights, on the current default device); ModelRefError when it cannot be."""
    import torch

    kwargs = json.loads(spec.model_kwargs)
    if kind_of(spec.name) in ("timm", "hf-hub"):
        model = _timm_model(spec, kwargs)
    else:
        factory = _factory(spec.name)
        model = factory(**{**_factory_options(factory, spec), **kwargs})
    if not isinstance(model, torch.nn.Module):
        raise ModelRefError(f"model {spec.name}: the factory returned {type(model).__name__}, not a torch.nn.Module")
    return model


def check_classifier(spec: ModelSpec) -> None:
    """Build the model and run one forward on the meta device (no weights, no compute): ModelRefError naming the
    model, the input tried and the exception when it fails, or when the output is not one logit per class.
    Costs what building the model costs, for a model of any size."""
    import torch

    from bench.measure.failure import first_line

    tried = f"a synthetic {spec.describe_input(_CHECK_BATCH)} float32 batch"
    try:
        with torch.device("meta"):
            model = create(spec)
            output = model.train()(torch.empty(_CHECK_BATCH, *spec.input_shape))
    except BadInput:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of user code is reported in one line
        raise ModelRefError(f"model {spec.name}: forward on {tried} failed: {type(exc).__name__}: "
                            f"{first_line(exc)}") from None
    shape = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
    if shape != (_CHECK_BATCH, spec.num_classes):
        raise ModelRefError(f"model {spec.name}: not an image classifier for this input: {tried} gave {shape}, "
                            f"expected ({_CHECK_BATCH}, {spec.num_classes}) logits (--num-classes)")


def _timm_model(spec: ModelSpec, kwargs: dict[str, Any]) -> torch.nn.Module:
    import timm

    name = _hub_local_dir(spec.name) if kind_of(spec.name) == "hf-hub" else spec.name
    options = {"num_classes": spec.num_classes, **({"in_chans": spec.in_chans} if spec.in_chans != 3 else {}),
               **kwargs}
    _, height, width = spec.input_shape
    # Transformers fix their position embeddings to one image size; CNNs take any size and reject the keyword.
    try:
        return timm.create_model(name, pretrained=False, img_size=height if height == width else (height, width),
                                 **options)
    except TypeError as exc:
        if "img_size" not in str(exc):
            raise
        return timm.create_model(name, pretrained=False, **options)


def _factory_options(factory: Any, spec: ModelSpec) -> dict[str, Any]:
    """timm's keyword options the factory names in its signature (a factory taking **kwargs gets none)."""
    _, height, width = spec.input_shape
    offered = {"num_classes": spec.num_classes, "in_chans": spec.in_chans,
               "img_size": height if height == width else (height, width)}
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin or C extension: no signature to read
        return {}
    return {name: value for name, value in offered.items() if name in parameters}


def _factory(name: str) -> Any:
    target, attribute = name.rsplit(":", 1)
    module = _file_module(str(Path(target).resolve())) if kind_of(name) == "file" else _imported(target)
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise ModelRefError(f"model {name}: {target} has no function {attribute}")
    return factory


def _imported(module: str) -> Any:
    _cwd_importable()
    try:
        return importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - user code: one line, not its traceback
        raise ModelRefError(f"model {module}: importing it failed: {type(exc).__name__}: {exc}") from None


@cache  # one execution per file and process: every cell built from it shares its classes
def _file_module(path: str) -> Any:
    module_name = "bench_model_file_" + hashlib.sha1(path.encode()).hexdigest()[:10]
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise ModelRefError(f"model file {path}: not a Python file")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module  # dataclasses and pickling look classes up here
    try:
        loader_spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - user code: one line, not its traceback
        del sys.modules[module_name]
        raise ModelRefError(f"model file {path}: running it failed: {type(exc).__name__}: {exc}") from None
    return module


def _cwd_importable() -> None:
    """`package.module` is looked up in the working directory too, as `python -m` does (the `bench` script's
    sys.path holds only its own directory)."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())


def _hub_repo(name: str) -> tuple[str, str | None]:
    """`hf-hub:ORG/NAME[@REVISION]` -> (ORG/NAME, REVISION)."""
    repo, _, revision = name.removeprefix(HF_PREFIX).partition("@")
    return repo, revision or None


def _hub_config(name: str) -> str | None:
    """The cached config.json of an hf-hub reference, or None; never the network."""
    from huggingface_hub import try_to_load_from_cache

    repo, revision = _hub_repo(name)
    found = try_to_load_from_cache(repo, "config.json", revision=revision)
    return found if isinstance(found, str) else None


def _hub_problem(name: str) -> str | None:
    repo, _ = _hub_repo(name)
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo):
        return f"{name!r}: name a Hugging Face model as hf-hub:ORG/NAME, as hf-hub:timm/resnet18.a1_in1k"
    if _hub_config(name):
        return None
    from huggingface_hub.constants import HF_HUB_CACHE

    return (f"{name!r}: its config.json is not in the local Hugging Face cache ({HF_HUB_CACHE}); fetch it where "
            f"there is a network with `hf download {repo} config.json` (or set HF_HUB_CACHE to a cache that has it)")


def _hub_local_dir(name: str) -> str:
    """timm's `local-dir:` reference to the cached snapshot: the same config, read without the network."""
    config = _hub_config(name)
    if config is None:
        raise ModelRefError(_hub_problem(name) or f"{name}: not cached")
    return "local-dir:" + str(Path(config).parent)
