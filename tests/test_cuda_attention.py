"""Attention and dropout in the fake step as CUDA runs them, whatever the module; untraceable ops in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from timm.layers import Attention
from torch._subclasses.fake_tensor import FakeTensorMode

from bench.errors import ModelRefused
from bench.grid.cell import Cell
from bench.memory.cuda_attention import cuda_attention
from bench.memory.estimate import estimate_cell
from bench.memory.fake_models import FakeModels

_ENCODER = '''
import torch
from torch import nn


class Encoder(nn.Module):
    """Patches, then PyTorch's own transformer encoder with its default dropout of 0.1."""

    def __init__(self, num_classes=1000, img_size=32, in_chans=3, dim=64, heads=4, depth=4, patch=8):
        super().__init__()
        self.embed = nn.Conv2d(in_chans, dim, patch, patch)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(dim, heads, dim * 4, batch_first=True), depth)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        return self.head(self.encoder(self.embed(x).flatten(2).transpose(1, 2)).mean(1))


class Causal(Encoder):
    """A float causal mask: no flash kernel takes an explicit mask."""

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2)
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.head(self.encoder(x, mask=mask).mean(1))


class ValueDependent(Encoder):
    def forward(self, x):
        x = self.embed(x)
        return self.head(x[x > 0].reshape(x.shape[0], -1)[:, :64])
'''


def _cell(model: str, image_size: int = 32, micro_batch: int = 2, model_kwargs: dict | None = None,
          attention: str = "sdpa") -> Cell:
    return Cell(experiment="t", profile="cuda", model=model, image_size=image_size, micro_batch=micro_batch,
                accum_steps=1, precision="bf16", checkpointing="off", optimizer="sgd", channels_last=False,
                warmup_steps=1, measured_steps=1, model_kwargs=json.dumps(model_kwargs or {}), attention=attention)


@pytest.fixture
def models_file(tmp_path: Path) -> str:
    path = tmp_path / "mymodel.py"
    path.write_text(_ENCODER)
    return str(path)


def test_a_transformer_encoder_with_dropout_estimates_and_flash_saves_less_than_math_by_the_probabilities(
        models_file):
    # 64 px in patches of 4: 256 tokens, 4 heads of 16 dimensions, 4 layers, 2 samples.
    batch, heads, tokens, layers = 2, 4, 256, 4
    cell = _cell(f"{models_file}:Encoder", image_size=64, micro_batch=batch, model_kwargs={"patch": 4})
    models = FakeModels()
    flash = estimate_cell(cell, "cuda", models, capability=(8, 9))  # an RTX 4090: flash, dropout and all
    math = estimate_cell(cell, "cuda", models, capability=(7, 0))  # bf16 before 8.0: neither fused kernel
    assert (flash.attention, math.attention) == ("flash", "math")
    # Per layer and head, math keeps the fp32 probabilities (softmax's output), the fp32 dropped-out
    # probabilities (the second matmul's input) and a 1-byte dropout mask: 9 bytes a score. Flash keeps a
    # log-sum-exp per row and the RNG state instead.
    by_hand = layers * batch * heads * tokens**2 * (4 + 4 + 1)
    assert by_hand == 18_874_368
    saved_more = math.traced.activations_saved_bytes - flash.traced.activations_saved_bytes
    # The rest (seen: 4 %): math's fp32 copies of query, key and value of tokens x head dim, less flash's output.
    assert by_hand <= saved_more <= 1.05 * by_hand
    assert math.peak_bytes - flash.peak_bytes >= by_hand


def test_an_encoder_with_a_causal_mask_estimates_and_its_row_names_the_kernel_the_trace_picked(models_file):
    assert estimate_cell(_cell(f"{models_file}:Causal"), "cuda", capability=(8, 0)).attention == "efficient"


def test_a_timm_vit_with_attention_dropout_estimates_in_both_attention_modes():
    models = FakeModels()
    dropout = {"attn_drop_rate": 0.1}
    fused = estimate_cell(_cell("test_vit", micro_batch=16, model_kwargs=dropout), "cuda", models)
    eager = estimate_cell(_cell("test_vit", micro_batch=16, model_kwargs=dropout, attention="eager"), "cuda", models)
    assert fused.attention == "flash"
    assert fused.traced.activations_saved_bytes < eager.traced.activations_saved_bytes


def _saved_types(output: torch.Tensor) -> set[str]:
    """The backward nodes of `output`'s graph."""
    seen, stack = set(), [output.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and node not in seen:
            seen.add(node)
            stack.extend(child for child, _ in node.next_functions)
    return {type(node).__name__ for node in seen}


def test_every_attention_module_takes_the_kernel_cuda_picks_with_dropout_and_masks():
    # bf16 as autocast leaves it; on an 8.0 GPU: flash without a mask, memory-efficient with one, and the
    # explicit softmax (with CUDA's fused dropout: a bool mask) where the module asks for the weights.
    dim, tokens = 32, 16
    padding = torch.zeros(2, tokens, dtype=torch.bool)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(tokens)
    mha = torch.nn.MultiheadAttention(dim, 4, dropout=0.1, batch_first=True, dtype=torch.bfloat16)
    layer = torch.nn.TransformerEncoderLayer(dim, 4, 64, batch_first=True, dtype=torch.bfloat16)
    timm_fused = Attention(dim, 4, attn_drop=0.1).to(torch.bfloat16)
    timm_eager = Attention(dim, 4, attn_drop=0.1).to(torch.bfloat16)
    timm_eager.fused_attn = False
    with FakeTensorMode(allow_non_fake_inputs=True), cuda_attention((8, 0)) as kernels:
        x = torch.empty(2, tokens, dim, dtype=torch.bfloat16, requires_grad=True)
        q = torch.empty(2, 4, tokens, 8, dtype=torch.bfloat16, requires_grad=True)
        graphs = {
            "sdpa": F.scaled_dot_product_attention(q, q, q, dropout_p=0.1),
            "sdpa causal": F.scaled_dot_product_attention(q, q, q, dropout_p=0.1, is_causal=True),
            "sdpa bool mask": F.scaled_dot_product_attention(q, q, q, torch.ones(tokens, tokens, dtype=torch.bool),
                                                             dropout_p=0.1),
            "mha": mha(x, x, x, need_weights=False)[0],
            "mha padding": mha(x, x, x, key_padding_mask=padding, need_weights=False)[0],
            "mha weights": mha(x, x, x)[0],
            "layer causal": layer(x, src_mask=causal.to(torch.bfloat16), is_causal=True),  # SDPA's is_causal
            "layer padding": layer(x, src_key_padding_mask=padding),
            "timm fused": timm_fused(x),
            "timm eager": timm_eager(x),
        }
        for output in graphs.values():
            output.float().sum().backward()
    kept = {name: _saved_types(output) for name, output in graphs.items()}
    flash, efficient = "ScaledDotProductFlashAttentionBackward0", "ScaledDotProductEfficientAttentionBackward0"
    for name in ("sdpa", "sdpa causal", "mha", "layer causal", "timm fused"):
        assert flash in kept[name], name
    for name in ("sdpa bool mask", "mha padding", "layer padding"):
        assert efficient in kept[name], name
    for name in ("mha weights", "timm eager"):  # explicit softmax on CUDA too, dropout fused
        assert "NativeDropoutBackward0" in kept[name] and not {flash, efficient} & kept[name], name
    assert kernels == {"flash": 5, "efficient": 3}


def test_an_untraceable_op_is_one_line_naming_it_and_what_to_try(models_file):
    with pytest.raises(ModelRefused) as refused:
        estimate_cell(_cell(f"{models_file}:ValueDependent"), "cuda")
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"{models_file}:ValueDependent: the estimator cannot trace aten.nonzero.default "
                              "(at mymodel.py:")
    assert "in forward" in message and "bench probe --device cuda" in message
