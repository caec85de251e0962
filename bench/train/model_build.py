"""Building the model a reference names (`bench.grid.model_ref`): timm's `create_model` for timm and hf-hub names,
the named function for a module path or a file; and one forward on the meta device, so a model that is not an
image classifier for its input is refused in one line, not a traceback. A model that passed is kept in the disk
cache (keyed by its spec and, for a module or file model, its code): torch and timm load only to build one.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import sys
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.cache import DiskCache
from bench.errors import BadInput, ModelRefError
from bench.grid.model_ref import ModelSpec, cwd_importable, hub_local_dir, kind_of

if TYPE_CHECKING:
    import torch

    from bench.grid.cell import Cell

_CHECK_BATCH = 2  # BatchNorm in training mode needs more than one sample


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
    Costs what building the model costs, for a model of any size, once: a model that passed is not checked again.
    """
    key = spec.cache_key()
    if _PASSED.get(key):
        return
    _check_on_meta(spec)
    _PASSED.put(key, True)


def check_cell_classifier(cell: Cell) -> None:
    """`check_classifier` of the cell's model and input (module-level: a child process can run it)."""
    check_classifier(ModelSpec.of(cell))


def _check_on_meta(spec: ModelSpec) -> None:
    import torch

    tried = f"a synthetic {spec.describe_input(_CHECK_BATCH)} float32 batch"
    try:
        with torch.device("meta"):
            model = create(spec)
            output = model.train()(torch.empty(_CHECK_BATCH, *spec.input_shape))
    except BadInput:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of user code is reported in one line
        raise ModelRefError(f"model {spec.name}: forward on {tried} failed: {type(exc).__name__}: "
                            f"{_first_line(exc)}") from None
    shape = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
    if shape != (_CHECK_BATCH, spec.num_classes):
        raise ModelRefError(f"model {spec.name}: not an image classifier for this input: {tried} gave {shape}, "
                            f"expected ({_CHECK_BATCH}, {spec.num_classes}) logits (--num-classes)")


def _timm_model(spec: ModelSpec, kwargs: dict[str, Any]) -> torch.nn.Module:
    import timm

    hub = kind_of(spec.name) == "hf-hub"
    name = hub_local_dir(spec.name) if hub else spec.name
    # A hub config's model_args come under these (timm's create_model): the cell's input wins, 3 channels too.
    options = {"num_classes": spec.num_classes, **({"in_chans": spec.in_chans} if hub or spec.in_chans != 3 else {}),
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
    cwd_importable()
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


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else repr(exc))[:300]


_PASSED = DiskCache("model-checks", sources=("train/model_build.py", "train/models.py", "grid/model_ref.py"),
                    check=lambda value: None if value is True else "not a passed check")
