"""Attention and dropout as CUDA runs them, on the estimator's fake "cpu" tensors.

`F.scaled_dot_product_attention` picks its kernel by device: on CPU the trace would run the CPU's
flash kernel (no dropout: "No available kernel" once math is ruled out) or its math fallback,
neither of which saves for backward what a GPU's kernel saves. Inside `cuda_attention`, every
SDPA call (timm's fused attention, `nn.MultiheadAttention`, `nn.TransformerEncoderLayer`, a
user's own) runs the CUDA kernel that torch would pick for its arguments on a GPU of the given
compute capability (`cuda_sdpa_kernel`, after aten/src/ATen/native/transformers/cuda/sdp_utils.cpp),
called as aten's `scaled_dot_product_attention` calls it (attention.cpp). The CUDA ops
(`_scaled_dot_product_flash_attention`, `_scaled_dot_product_efficient_attention`) have meta
kernels that run on fake tensors of any device and CUDA's own autograd formulas, so what backward
keeps is CUDA's: flash and memory-efficient keep the inputs, the output, a per-row log-sum-exp and
the dropout RNG state (no mask, no probabilities); math keeps the fp32 probabilities and, with
dropout, a one-byte mask.

Dropout (`aten::dropout`, which nn.Dropout and the math kernel call) takes CUDA's fused path,
`native_dropout`, whose backward keeps a bool mask; the CPU's path keeps a mask of the input's
dtype (2 or 4 bytes an element).

`nn.TransformerEncoder`/`Decoder` compare a mask with a causal one to pass `is_causal` on
(`_detect_is_causal_mask`), which reads values fake tensors do not have; inside
`masks_without_values` a mask counts as causal only when the caller says so, and is otherwise kept
as a mask (the memory-efficient kernel with a bias, which keeps what flash keeps, plus the mask).
"""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from typing import Iterator, Literal

import torch
import torch.nn.functional as F
from torch.nn.modules import transformer

from bench.memory.cuda_autocast import _quiet_overrides

CudaKernel = Literal["flash", "efficient", "math"]
aten = torch.ops.aten

_FLASH_MAX_HEAD_DIM = 256  # check_head_dim_size_flash
_MEM_EFFICIENT_BIAS_ALIGNMENT = 16  # attention.cpp preprocess_mask: mem_eff_alignment


def cuda_sdpa_kernel(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None,
                     dropout_p: float, is_causal: bool, capability: tuple[int, int], *,
                     enable_gqa: bool = False) -> CudaKernel:
    """The kernel CUDA's SDPA picks for these arguments on a GPU of `capability`: flash, then
    memory-efficient, then math (sdp_utils.cpp's order and its dense-input checks; cuDNN attention,
    which saves what flash saves, is counted as flash).

    Flash: compute capability 8.0 or later, fp16/bf16, no explicit mask, head dim up to 256 (on
    8.6/8.9/12.x, training with a head dim in (192, 224], or over 224 with dropout, is refused), a
    causal mask only on square attention. Memory-efficient: 5.0 or later, fp32/fp16 (bf16 from
    8.0), equal query/key head dims aligned to the GEMM's minimum (8 elements for 16-bit on tensor
    cores, 4 from 8.0, else 1), any mask. Both take dropout.

    >>> q = torch.empty(2, 4, 16, 64, dtype=torch.bfloat16, requires_grad=True)
    >>> cuda_sdpa_kernel(q, q, q, None, 0.1, False, (8, 9)), cuda_sdpa_kernel(q, q, q, torch.ones(16, 16), 0.1,
    ...                                                                        False, (8, 9))
    ('flash', 'efficient')
    >>> cuda_sdpa_kernel(q, q, q, None, 0.1, False, (7, 5)), cuda_sdpa_kernel(q.float(), q.float(), q.float(), None,
    ...                                                                       0.0, False, (3, 7))
    ('math', 'math')
    """
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return "math"  # check_tensor_shapes: the fused kernels take (batch, heads, tokens, head dim) only
    if enable_gqa and query.size(1) != key.size(1):
        return "math"  # grouped-query heads: not modelled for the fused kernels
    dtype, head_dim = query.dtype, query.size(-1)
    same_dtype = key.dtype == dtype and value.dtype == dtype
    requires_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    if _flash_ok(query, key, value, attn_mask, dropout_p, is_causal, capability, same_dtype, requires_grad):
        return "flash"
    efficient_dtypes = (torch.float32, torch.float16) + ((torch.bfloat16,) if capability >= (8, 0) else ())
    half = dtype in (torch.float16, torch.bfloat16)
    alignment = 8 if half and capability >= (8, 0) else 4 if capability >= (8, 0) else 1
    if (capability >= (5, 0) and same_dtype and dtype in efficient_dtypes and key.size(-1) == head_dim
            and head_dim % alignment == 0 and value.size(-1) % alignment == 0):
        return "efficient"
    return "math"


def _flash_ok(query, key, value, attn_mask, dropout_p, is_causal, capability, same_dtype, requires_grad) -> bool:
    head_dim = query.size(-1)
    if not ((8, 0) <= capability < (13, 0) and same_dtype and query.dtype in (torch.float16, torch.bfloat16)):
        return False
    if attn_mask is not None or head_dim != key.size(-1) or head_dim != value.size(-1):
        return False
    if head_dim > _FLASH_MAX_HEAD_DIM or (is_causal and query.size(-2) != key.size(-2)):
        return False
    consumer = capability in ((8, 6), (8, 9), (12, 0), (12, 1))
    refused_in_training = 192 < head_dim <= 224 or (head_dim > 224 and dropout_p > 0)
    return not (requires_grad and consumer and refused_in_training)


class _CudaSdpa:
    """`aten::scaled_dot_product_attention` as attention.cpp runs it on CUDA, counting the kernels picked."""

    def __init__(self, capability: tuple[int, int]) -> None:
        self.capability = capability
        self.kernels: Counter[CudaKernel] = Counter()

    def __call__(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
                 enable_gqa=False):
        kernel = cuda_sdpa_kernel(query, key, value, attn_mask, dropout_p, is_causal, self.capability,
                                  enable_gqa=enable_gqa)
        self.kernels[kernel] += 1
        if attn_mask is not None and attn_mask.dtype == torch.bool:  # convert_boolean_attn_mask: an additive mask
            attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill_(attn_mask.logical_not(),
                                                                                    -math.inf)
        if kernel == "flash":
            return _flash(query, key, value, dropout_p, is_causal, scale)
        if kernel == "efficient":
            if attn_mask is not None:
                attn_mask = _mem_efficient_bias(attn_mask, query, key)
            compute_log_sumexp = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
            return aten._scaled_dot_product_efficient_attention(query, key, value, attn_mask, compute_log_sumexp,
                                                                dropout_p, is_causal, scale=scale)[0]
        return aten._scaled_dot_product_attention_math(query, key, value, attn_mask, dropout_p, is_causal,
                                                       scale=scale, enable_gqa=enable_gqa)[0]


def _flash(query, key, value, dropout_p, is_causal, scale) -> torch.Tensor:
    """attention.cpp's flash case: head dims padded to a multiple of 8, the scale of the unpadded one."""
    head_dim = query.size(-1)
    scale = scale if scale is not None else 1 / math.sqrt(head_dim)
    pad = -head_dim % 8
    if pad:
        query, key, value = (F.pad(t, (0, pad)) for t in (query, key, value))
    out = aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False, scale=scale)[0]
    return out[..., :head_dim] if pad else out


def _mem_efficient_bias(bias: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """attention.cpp's preprocess_mask: expanded to 4-D, its last dim padded to a multiple of 16 (then sliced)."""
    bias = bias.expand(query.size(0), query.size(1), query.size(2), key.size(2))
    tokens = bias.size(-1)
    if tokens % _MEM_EFFICIENT_BIAS_ALIGNMENT:
        return F.pad(bias, (0, _MEM_EFFICIENT_BIAS_ALIGNMENT - tokens % _MEM_EFFICIENT_BIAS_ALIGNMENT))[..., :tokens]
    if any(stride % _MEM_EFFICIENT_BIAS_ALIGNMENT for stride in bias.stride()[:3]):
        return bias.contiguous()
    return bias


def _cuda_dropout(input: torch.Tensor, p: float, train: bool) -> torch.Tensor:
    """dropout.cpp on CUDA: the fused `native_dropout` (a bool mask kept) whenever 0 < p < 1 in training."""
    if train and 0 < p < 1 and input.numel() > 0:
        return aten.native_dropout(input, p, train)[0]
    return aten.dropout.default.decompose(input, p, train)


@contextlib.contextmanager
def cuda_attention(capability: tuple[int, int]) -> Iterator[Counter[CudaKernel]]:
    """Within: SDPA and dropout on "cpu" tensors run as on a CUDA GPU of `capability` (the module's docstring);
    yields the count of SDPA calls per kernel picked.

    Registered at AutogradCPU, where a kernel of its own wins over aten's CompositeImplicitAutograd one, so
    both run under autograd and autocast as the originals did.

    Example: dropout in attention, which the CPU's fused kernels refuse, takes CUDA's flash kernel:
        >>> from torch._subclasses.fake_tensor import FakeTensorMode
        >>> with FakeTensorMode(), cuda_attention((8, 0)) as kernels:
        ...     q = torch.empty(2, 4, 16, 64, dtype=torch.bfloat16, requires_grad=True)
        ...     out = F.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
        >>> type(out.grad_fn).__name__, dict(kernels)
        ('ScaledDotProductFlashAttentionBackward0', {'flash': 1})
    """
    sdpa = _CudaSdpa(capability)
    library = torch.library.Library("aten", "IMPL")
    try:
        with _quiet_overrides():
            library.impl("scaled_dot_product_attention", sdpa, "AutogradCPU")
            library.impl("dropout", _cuda_dropout, "AutogradCPU")
        yield sdpa.kernels
    finally:
        library._destroy()


@contextlib.contextmanager
def masks_without_values() -> Iterator[None]:
    """Within: `nn.Transformer*`'s causal-mask detection trusts the `is_causal` it is given instead of reading
    the mask's values (see the module's docstring)."""
    original = transformer._detect_is_causal_mask

    def detect(mask: torch.Tensor | None, is_causal: bool | None = None, size: int | None = None) -> bool:
        return is_causal is True

    transformer._detect_is_causal_mask = detect
    try:
        yield
    finally:
        transformer._detect_is_causal_mask = original
