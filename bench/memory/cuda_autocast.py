"""CUDA's autocast policy, applied to the estimator's fake "cpu" tensors.

The fake step runs on "cpu" (a fake "cuda" backward fails here: the autograd engine asks the
CUDA driver for the device's primary context), so `torch.autocast("cpu")` is what its step
enters, and CPU and CUDA autocast cast different ops (CUDA runs softmax, layer norm and the
losses in fp32, CPU does not). Inside `cuda_autocast_policy`, every op that either device's
autocast handles is re-registered at the `AutocastCPU` dispatch key:

- ops that CUDA's autocast does not list fall through (no cast, as on CUDA);
- ops it lists are cast as CUDA's own kernel casts them. The policy is not retyped: the op is
  called once on fake "cuda" twins of its arguments under `AutocastCUDA` (forward only, which
  works on fake CUDA tensors), and the dtype CUDA's kernel produced is the dtype its inputs are
  cast to here (cached per op and input dtypes). Ops with a `dtype` argument that CUDA runs in
  fp32 get `dtype=torch.float32`, as CUDA's `fp32_set_opt_dtype` policy passes it.

The casts go through autograd (this key is above it), so what backward saves is the cast copy,
as on CUDA. Casts of fp32 leaf tensors that require grad (the weights) are cached until the
outermost autocast region exits, as `cached_cast` does (aten/src/ATen/autocast_mode.cpp); those
copies are labelled `AutocastCache` for MemTracker, a category of their own.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker, _RefType
from torch.utils._python_dispatch import _disable_current_modes, _get_current_dispatch_mode_stack
from torch.utils._pytree import tree_flatten, tree_map_only

LOW_PRECISION = (torch.float16, torch.bfloat16)
NOT_CAST_BY_PYTORCH_1_12 = frozenset({
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
    "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
    "upsample_bicubic2d", "upsample_trilinear3d", "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa"})
"""Ops today's CUDA autocast runs in fp32 that PyTorch 1.12's ran uncast: its fp32 list (the 1.12 docs' "CUDA Ops
that can autocast to float32") names no interpolation, so an fp16 feature map was upsampled in fp16. The public
fit/OOM rows the estimator is checked against ran under 1.12 (`bench.memory.validate`)."""


class AutocastRefType(_RefType):
    """MemTracker's reference type for the autocast weight-cast cache."""

    CACHE = "AutocastCache"


class _Policy:
    """The cast cache of one `cuda_autocast_policy` region."""

    def __init__(self) -> None:
        self.cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def cast(self, tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if not _eligible(tensor) or tensor.dtype == dtype:
            return tensor
        cacheable = (torch.is_autocast_cache_enabled() and tensor.is_leaf and tensor.requires_grad
                     and tensor.dtype == torch.float32 and dtype in LOW_PRECISION)
        if not cacheable:
            return tensor.to(dtype)
        hit = self.cache.get(id(tensor))
        if hit is not None and hit[0] is tensor:
            return hit[1]
        copy = tensor.to(dtype)
        self.cache[id(tensor)] = (tensor, copy)
        for mode in _get_current_dispatch_mode_stack():
            if isinstance(mode, MemTracker):  # its device snapshot starts with MemTracker's own types only
                mode._curr_mem_snap.setdefault(copy.device, {}).setdefault(AutocastRefType.CACHE, 0)
                mode._update_and_maybe_create_winfos(copy, AutocastRefType.CACHE)
        return copy


def _eligible(tensor: torch.Tensor) -> bool:
    # autocast_mode.h is_eligible: floating point, not double.
    return tensor.is_floating_point() and tensor.dtype != torch.float64


_PROBED: dict[tuple, torch.dtype | None] = {}
"""CUDA's result dtype per (op, autocast dtype, argument dtypes): the policy depends on nothing else."""


def _probe(op: torch._ops.OpOverload, args: tuple, kwargs: dict, dtype: torch.dtype) -> torch.dtype | None:
    """Run CUDA's autocast kernel of `op` on fake "cuda" twins of the arguments; its result's dtype."""
    leaves, _ = tree_flatten((args, kwargs))
    signature = (op, dtype, tuple(leaf.dtype if isinstance(leaf, torch.Tensor) else type(leaf) for leaf in leaves))
    if signature in _PROBED:
        return _PROBED[signature]
    was_enabled, was_dtype = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    was_cached = torch.is_autocast_cache_enabled()
    # CUDA's SDPA warns, on fake twins, that no GPU can run its fused kernels: only the dtype is asked here.
    with (_disable_current_modes(), FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad(),
          warnings.catch_warnings()):
        warnings.simplefilter("ignore", UserWarning)
        twins = tree_map_only(torch.Tensor, lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype,
                                                                          device="cuda"), (args, kwargs))
        torch.set_autocast_enabled("cuda", True)
        torch.set_autocast_dtype("cuda", dtype)
        torch.set_autocast_cache_enabled(False)
        try:
            out = op(*twins[0], **twins[1])
        finally:
            torch.set_autocast_enabled("cuda", was_enabled)
            torch.set_autocast_dtype("cuda", was_dtype)
            torch.set_autocast_cache_enabled(was_cached)
    floats = [leaf for leaf in tree_flatten(out)[0] if isinstance(leaf, torch.Tensor) and leaf.is_floating_point()]
    _PROBED[signature] = floats[0].dtype if floats else None
    return _PROBED[signature]


_EXCLUDE_CPU_AUTOCAST = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)


_UNPROBED: set[str] = set()
"""Ops whose CUDA kernel could not run on fake "cuda" twins (warned once each): they run uncast."""


def _kernel(policy: _Policy, op: torch._ops.OpOverload):
    names = [argument.name for argument in op._schema.arguments]
    dtype_at = names.index("dtype") if "dtype" in names else None

    def cast_as_cuda(*args: Any, **kwargs: Any) -> Any:
        dtype = torch.get_autocast_dtype("cpu")
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE_CPU_AUTOCAST):
            try:
                target = _probe(op, args, kwargs, dtype)
            except Exception as exc:  # noqa: BLE001 - a kernel fake "cuda" cannot run: said once, run uncast
                if op.name() not in _UNPROBED:
                    _UNPROBED.add(op.name())
                    warnings.warn(f"estimate: {op.name()} runs uncast (CUDA's autocast kernel failed on fake "
                                  f"tensors: {type(exc).__name__})", stacklevel=2)
                target = None
            if target is None:
                return op(*args, **kwargs)
            inputs = [leaf for leaf in tree_flatten((args, kwargs))[0]
                      if isinstance(leaf, torch.Tensor) and _eligible(leaf)]
            if target == torch.float32 and dtype_at is not None and any(t.dtype in LOW_PRECISION for t in inputs):
                # fp32_set_opt_dtype: CUDA passes dtype=float32 where none was given, casting no input
                if dtype_at < len(args) and args[dtype_at] is None:
                    return op(*args[:dtype_at], torch.float32, *args[dtype_at + 1:], **kwargs)
                if dtype_at >= len(args) and kwargs.get("dtype") is None:
                    return op(*args, **{**kwargs, "dtype": torch.float32})
            args, kwargs = tree_map_only(torch.Tensor, lambda t: policy.cast(t, target), (args, kwargs))
            return op(*args, **kwargs)

    return cast_as_cuda


def _overload(name: str) -> torch._ops.OpOverload:
    namespace, _, rest = name.partition("::")
    packet, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload or "default")


@contextlib.contextmanager
def cuda_autocast_policy(uncast: frozenset[str] = frozenset()) -> Iterator[_Policy]:
    """Within: `torch.autocast("cpu")` casts as `torch.autocast("cuda")` would (see the module's docstring), except
    the ops named in `uncast` (aten names without overload, e.g. `NOT_CAST_BY_PYTORCH_1_12`), which run uncast.

    Example: CUDA runs softmax in fp32 (CPU autocast leaves it in bf16 here):
        >>> x = torch.randn(2, 4)
        >>> with cuda_autocast_policy(), torch.autocast("cpu", dtype=torch.bfloat16):
        ...     (x @ x.T).dtype, torch.softmax(x @ x.T, -1).dtype
        (torch.bfloat16, torch.float32)
    """
    policy = _Policy()
    cuda_ops = set(torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCUDA"))
    cpu_ops = set(torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCPU"))
    library = torch.library.Library("aten", "IMPL")
    clear = torch.clear_autocast_cache

    def clear_both() -> None:  # torch.autocast's __exit__ calls this when the outermost region ends
        policy.cache.clear()
        clear()

    try:
        with _quiet_overrides():
            for name in sorted(cuda_ops | cpu_ops):
                if not name.startswith("aten::"):
                    continue
                unqualified = name.removeprefix("aten::")
                if name in cuda_ops and unqualified.partition(".")[0] not in uncast:
                    library.impl(unqualified, _kernel(policy, _overload(name)), "AutocastCPU")
                else:
                    library.impl(unqualified, torch.library.fallthrough_kernel, "AutocastCPU")
        torch.clear_autocast_cache = clear_both
        yield policy
    finally:
        torch.clear_autocast_cache = clear
        policy.cache.clear()
        library._destroy()


@contextlib.contextmanager
def _quiet_overrides() -> Iterator[None]:
    """Replacing CPU autocast's kernels is the point: silence the dispatcher's override warnings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield
