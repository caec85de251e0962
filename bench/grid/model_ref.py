"""What a model reference names, checked without torch or timm: a timm name, `hf-hub:ORG/NAME`,
`package.module:factory` or `path/to/file.py:factory`.

A model reference is the text a user types (the `model` of a cell); `ModelSpec` adds what the model is built
for: the input (channels, height, width), the class count and the factory's keyword arguments (JSON). A command
refuses a bad reference (`model_problem`) before torch loads; `bench.train.model_build` builds the model.

A module path or a file is code: it runs when the model is built. The command line and the API take them; a
grid file takes them only when it says so (`experiment.runs_model_code = true`), and without it nothing of the
reference is looked up. A relative file path is read from the working directory; a module path is looked up
there after the installed packages.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import importlib.util
import json
import os
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from bench.errors import ModelRefError, shown
from bench.grid.cell import MODEL_CHARACTERS, MODEL_PATTERN

if TYPE_CHECKING:
    from bench.grid.cell import Cell

Kind = Literal["timm", "hf-hub", "module", "file"]
HF_PREFIX = "hf-hub:"
DEFAULT_NUM_CLASSES = 1000
_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"


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
        problem = timm_model_problem(name)
        return problem and problem + " (or name a factory: package.module:function or path/to/file.py:function)"
    target, factory = name.rsplit(":", 1)
    if not re.fullmatch(_IDENTIFIER, factory):
        return f"{name!r}: the factory must be a Python name, as in package.module:factory"
    if kind == "file":
        return None if Path(target).is_file() else f"{name!r}: no such file {target}"
    if not re.fullmatch(rf"{_IDENTIFIER}(\.{_IDENTIFIER})*", target):
        return f"{name!r}: {target!r} is not a module path (package.module)"
    cwd_importable()
    try:
        found = importlib.util.find_spec(target)
    except ImportError as exc:  # a parent package is missing or fails to import
        return f"{name!r}: cannot import {target}: {exc}"
    return None if found else f"{name!r}: no module {target} (on sys.path or under {Path.cwd()})"


def code_digest(name: str) -> str | None:
    """A digest of the file that defines a module or file reference's factory: what a cached trace of the model
    depends on beyond its name (None for timm and hf-hub models, whose code comes with the installed versions).
    Only that file: an edit to a module it imports is not seen.

    >>> code_digest("resnet50") is None
    True
    """
    if not runs_code(name):
        return None
    target = name.rsplit(":", 1)[0]
    try:
        if kind_of(name) == "file":
            path = Path(target)
        else:
            cwd_importable()
            found = importlib.util.find_spec(target)
            path = Path(found.origin) if found and found.origin else None
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path else "not found"
    except (ImportError, OSError, ValueError) as exc:  # the trace itself then says what is wrong
        return f"unreadable: {type(exc).__name__}"


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

    def cache_key(self) -> dict:
        """What a cached answer about this model depends on: its fields and, for a module or file model, its
        code (`code_digest`)."""
        return {**asdict(self), "model_code": code_digest(self.name)}

    def describe_input(self, batch: int) -> str:
        return "x".join(str(n) for n in (batch, *self.input_shape))

    def describe(self) -> str:
        """The model and its input in words: `resnet50 224px` for square RGB and 1000 classes, more otherwise.

        >>> ModelSpec("m.py:f", 32, in_chans=1, num_classes=10, model_kwargs='{"width":6}').describe()
        'm.py:f 1x32x32 input, 10 classes, kwargs {"width":6}'
        """
        channels, height, width = self.input_shape
        words = f"{self.name} {height}px" if channels == 3 and height == width else \
            f"{self.name} {channels}x{height}x{width} input"
        if self.num_classes != DEFAULT_NUM_CLASSES:
            words += f", {self.num_classes} classes"
        return words + (f", kwargs {self.model_kwargs}" if self.model_kwargs != "{}" else "")


def cwd_importable() -> None:
    """`package.module` is looked up in the working directory too, after everything installed: the reference
    the user opted into is found there, but a stray `timm.py` beside it never shadows the real one
    (`bench.isolation`)."""
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())


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


@dataclass(frozen=True)
class HubDefaults:
    """What an hf-hub model's cached config.json says it was trained with; None where it does not say."""

    num_classes: int | None
    input_size: tuple[int, int, int] | None
    """(channels, height, width): timm's `pretrained_cfg.input_size`."""
    model_kwargs: dict
    """timm's `model_args`: keyword arguments timm's `create_model` passes under the cell's own."""


def hub_defaults(name: str) -> HubDefaults | None:
    """The cached config of an hf-hub reference (None for another kind, or when it is not cached), read as timm
    reads it (`timm.models._hub._parse_model_cfg`: a legacy config is one flat dict; a top-level `num_classes`,
    and `model_args`' in_chans and img_size, override `pretrained_cfg`); never the network. A value of the wrong
    type counts as not said.

    >>> hub_defaults("resnet50") is None
    True
    """
    if kind_of(name) != "hf-hub":
        return None
    path = _hub_config(name)
    try:
        config = json.loads(Path(path).read_text()) if path else None
    except (OSError, ValueError):
        config = None
    if not isinstance(config, dict):
        return None
    pretrained = config.get("pretrained_cfg", config)
    pretrained = pretrained if isinstance(pretrained, dict) else {}
    kwargs = config.get("model_args") if isinstance(config.get("model_args"), dict) else {}
    classes = kwargs.get("num_classes", config.get("num_classes", pretrained.get("num_classes")))
    size = pretrained.get("input_size")
    size = list(size) if isinstance(size, list) and len(size) == 3 else None
    if size and isinstance(kwargs.get("in_chans"), int):
        size[0] = kwargs["in_chans"]
    img_size = kwargs.get("img_size")
    if size and isinstance(img_size, int):
        size[1:] = [img_size, img_size]
    elif size and isinstance(img_size, list) and len(img_size) == 2:
        size[1:] = img_size
    whole = size is not None and all(isinstance(n, int) and n > 0 for n in size)
    return HubDefaults(num_classes=classes if isinstance(classes, int) and classes > 0 else None,
                       input_size=tuple(size) if whole else None, model_kwargs=kwargs)


def hub_local_dir(name: str) -> str:
    """timm's `local-dir:` reference to the cached snapshot: the same config, read without the network."""
    config = _hub_config(name)
    if config is None:
        raise ModelRefError(_hub_problem(name) or f"{name}: not cached")
    return "local-dir:" + str(Path(config).parent)


def timm_model_problem(name: str) -> str | None:
    """None when timm knows `name` (a pretrained tag after the dot allowed, as `timm.is_model` does);
    otherwise what is wrong, with the closest names.

    Example:
        >>> timm_model_problem("resnet50") is None
        True
        >>> timm_model_problem("resnet-50")
        "'resnet-50' is not a timm model; did you mean resnet50, resnet50t, resnet50s?"
    """
    if not re.fullmatch(MODEL_PATTERN, name):  # a name a cell id cannot hold is refused before timm is asked
        return f"{shown(name)} is not a model name; allowed: {MODEL_CHARACTERS}"
    if name.endswith("."):  # timm reads `test_vit.` as test_vit with an empty tag: the same model under two names
        return f"{shown(name)} ends with a dot and no pretrained tag after it; name the model without the dot"
    if "/" in name:  # timm takes it for a hub repo or a folder and refuses it, once it has been imported
        return (f"{shown(name)} is not a timm model: a timm name holds no /; a model from the Hugging Face Hub is "
                "hf-hub:ORG/NAME")
    names = timm_model_names()
    if name.split(".", 1)[0] in names:
        return None
    current = timm_deprecated_names().get(name)
    if current:  # timm maps it to another name, sometimes another network (ig_resnext101_32x16d -> 32x8d)
        return (f"{name!r} is a name timm has deprecated: it now builds {current}; name the architecture, "
                f"{current.split('.', 1)[0]} (weights are never loaded here)")
    close = difflib.get_close_matches(name, sorted(names), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}?" if close else "see timm.list_models()"
    return f"{name!r} is not a timm model; {hint}"


SHIPPED_TIMM_NAMES = Path(__file__).resolve().parents[1] / "data" / "timm_models.json"
"""timm.list_models() and its deprecated names of the pinned timm, with its version (scripts/timm_model_names.py)."""


def shipped_timm_names() -> frozenset[str] | None:
    """The shipped list, when the installed timm is the version it was taken from (None otherwise)."""
    document = _shipped_timm_document()
    return None if document is None else frozenset(document["names"])


def timm_deprecated_names() -> dict[str, str]:
    """timm's deprecated names and what it builds for each (`timm.models.get_deprecated_models`): read live when timm
    is imported, else shipped for the pinned timm; empty for another timm not yet imported."""
    if "timm" in sys.modules:
        return dict(sys.modules["timm"].models.get_deprecated_models())
    document = _shipped_timm_document()
    return {} if document is None else dict(document["deprecated"])


@functools.cache  # read once a process: a name check asks it for the names and the deprecated ones
def _shipped_timm_document() -> dict | None:
    from importlib import metadata

    try:
        document = json.loads(SHIPPED_TIMM_NAMES.read_text(encoding="utf-8"))
        installed = metadata.version("timm")
    except (OSError, ValueError, metadata.PackageNotFoundError):
        return None
    return document if document.get("timm") == installed else None


def timm_model_names() -> frozenset[str]:
    """timm's registered architectures, so a command validates its model names without importing timm (and torch):
    the list shipped for the pinned timm (`SHIPPED_TIMM_NAMES`) when that version is installed, else the cache's
    for the installed version; read live when timm is already imported, which also sees models registered in this
    process."""
    from bench.cache import DiskCache

    if "timm" in sys.modules:
        return frozenset(sys.modules["timm"].list_models())
    shipped = shipped_timm_names()
    if shipped is not None:
        return shipped
    store = DiskCache("timm-models", sources=(), check=lambda names: None if isinstance(names, list) and all(
        isinstance(name, str) for name in names) else "not a list of model names")
    cached = store.get({})
    if cached is not None:
        return frozenset(cached)
    import timm  # slow: only when the cache cannot answer

    names = timm.list_models()
    store.put({}, names)
    return frozenset(names)
