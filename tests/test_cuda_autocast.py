"""CUDA's autocast in the fake step, the attention kernel it assumes, and the RTX 3090 fit/OOM validation."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pandas as pd
import pytest
import torch
from timm.layers import Attention

from bench.grid.cell import Cell
from bench.memory.cuda_autocast import NOT_CAST_BY_PYTORCH_1_12, cuda_autocast_policy
from bench.memory.estimate import estimate_cell
from bench.memory.fake_models import FakeModels
from bench.memory.fit import DEFAULT_HEADROOM, memory_fit
from bench.memory.validate import (
    COLUMNS,
    PARAM_COUNTS,
    RTX3090_CAPABILITY,
    RTX3090_MEMORY_GIB,
    agreement,
    count_parameters,
    failed_batch,
    judged,
    observations,
    summary_markdown,
    validation_cell,
)
from bench.train.models import build_model


def _cell(precision: str, attention: str = "eager", micro_batch: int = 8) -> Cell:
    return Cell(experiment="t", profile="cuda", model="test_vit", image_size=32, micro_batch=micro_batch,
                accum_steps=1, precision=precision, checkpointing="off", optimizer="sgd", channels_last=False,
                warmup_steps=1, measured_steps=1, attention=attention)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_policy_casts_as_cuda_does_and_cpu_autocast_is_restored_after(dtype):
    x = torch.randn(4, 8)
    weight = torch.randn(8, 8, requires_grad=True)
    with cuda_autocast_policy(), torch.autocast("cpu", dtype=dtype):
        scores = x @ weight
        # CUDA: matmul in low precision; softmax, layer norm and the loss in fp32.
        assert scores.dtype == dtype
        assert torch.softmax(scores, -1).dtype == torch.float32
        assert torch.nn.functional.layer_norm(scores, (8,)).dtype == torch.float32
        assert torch.nn.functional.cross_entropy(scores, torch.tensor([0, 1, 2, 3])).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):  # CPU's own policy again: softmax stays bf16
        assert torch.softmax(x @ weight, -1).dtype == torch.bfloat16


def test_the_validation_upsamples_an_fp16_map_in_fp16_as_pytorch_1_12_did_and_today_in_fp32():
    """The public rows ran under 1.12, whose autocast listed no interpolation: HRNet's upsampled branches
    stayed fp16 there, twice as small as today's fp32 copies."""
    x = torch.randn(2, 4, 8, 8)
    conv = torch.nn.Conv2d(4, 4, 1)
    for uncast, expected in ((frozenset(), torch.float32), (NOT_CAST_BY_PYTORCH_1_12, torch.float16)):
        with cuda_autocast_policy(uncast), torch.autocast("cpu", dtype=torch.float16):
            feature = conv(x)
            assert feature.dtype == torch.float16
            assert torch.nn.functional.interpolate(feature, scale_factor=2, mode="nearest").dtype == expected


def test_a_weight_used_twice_is_cast_once_and_the_cache_ends_with_the_region():
    weight = torch.randn(8, 8, requires_grad=True)
    with cuda_autocast_policy() as policy:
        with torch.autocast("cpu", dtype=torch.float16):
            x = torch.randn(2, 8)
            y = (x @ weight) @ weight
            assert y.dtype == torch.float16 and len(policy.cache) == 1
        assert policy.cache == {}


def _saved_probability_dtypes(dtype: torch.dtype, cuda_policy: bool) -> set[torch.dtype]:
    """Dtypes of the (batch, heads, tokens, tokens) tensors an eager timm attention block saves for backward."""
    block = Attention(dim=32, num_heads=4)
    block.fused_attn = False
    x = torch.randn(2, 10, 32)
    saved: set[torch.dtype] = set()

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.numel() == 2 * 4 * 10 * 10:  # matmul saves its operands as (batch x heads, 10, 10) views
            saved.add(tensor.dtype)
        return tensor

    with (cuda_autocast_policy() if cuda_policy else contextlib.nullcontext()), torch.autocast("cpu", dtype=dtype), \
            torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        block(x)
    return saved


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_eager_attention_keeps_fp32_probabilities_under_cudas_policy(dtype):
    # softmax runs in fp32 on CUDA: its fp32 output is saved, and its low-precision copy for the next matmul.
    assert _saved_probability_dtypes(dtype, cuda_policy=True) == {torch.float32, dtype}
    assert _saved_probability_dtypes(dtype, cuda_policy=False) == {dtype}  # CPU autocast: no fp32 copy


@pytest.mark.slow
def test_the_weight_cast_cache_is_its_own_category_of_one_low_precision_copy_per_weight():
    estimate = estimate_cell(_cell("fp16", micro_batch=64), "cuda")  # large enough to peak in backward
    model = build_model("test_vit", 32, device="meta")
    # Every weight of a linear or convolution layer is cast once (biases too), 2 bytes per element, and
    # held at a peak in backward; the trace is within 2 % of that count.
    layers = [m for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))]
    cast_elements = sum(p.numel() for m in layers for p in m.parameters(recurse=False))
    assert estimate.autocast_cache_bytes == pytest.approx(2 * cast_elements, rel=0.02)
    assert estimate_cell(_cell("fp32", micro_batch=64), "cuda").autocast_cache_bytes == 0


@pytest.mark.slow
def test_sdpa_on_cuda_is_flash_or_efficient_and_saves_less_than_eager_or_math():
    models = FakeModels()
    flash = estimate_cell(_cell("fp16", "sdpa"), "cuda", models)
    math = estimate_cell(_cell("fp16", "sdpa"), "cuda", models, capability=(3, 7))
    eager = estimate_cell(_cell("fp16", "eager"), "cuda", models)
    assert (flash.attention, math.attention, eager.attention) == ("flash", "math", "eager")
    assert flash.traced.activations_saved_bytes < math.traced.activations_saved_bytes
    assert flash.traced.activations_saved_bytes < eager.traced.activations_saved_bytes
    fp32 = estimate_cell(_cell("fp32", "sdpa"), "cuda", models, capability=RTX3090_CAPABILITY)
    assert fp32.attention == "efficient"


def test_every_reference_row_below_512_has_the_oom_side_timm_tried_before_it():
    found = observations()
    fits = [o for o in found if o.side == "fit"]
    ooms = {(o.model, o.memory_format): o.batch_size for o in found if o.side == "oom"}
    assert len(ooms) == sum(o.batch_size < 512 for o in fits)
    assert ooms[("vit_large_patch14_224", "contiguous")] == 64
    assert ooms[("vit_base_patch16_384", "contiguous")] == 48
    assert failed_batch(3) == 4 and failed_batch(6) == 8


@pytest.mark.parametrize("model, image_size, batch_size", [
    ("vit_large_patch14_224", 224, 64),  # timm ran 48 after 64 ran out of memory
    ("vit_base_patch16_384", 384, 48),  # timm ran 32 after 48 did
])
@pytest.mark.slow
def test_the_issues_two_vit_oom_batches_do_not_fit_a_24_gb_card(model, image_size, batch_size):
    cell = validation_cell(model, image_size, batch_size, channels_last=False)
    estimate = estimate_cell(cell, "cuda", capability=RTX3090_CAPABILITY)
    assert not memory_fit(estimate.peak_reserved_bytes, DEFAULT_HEADROOM, RTX3090_MEMORY_GIB).fits


def test_a_row_is_right_only_when_both_its_sides_are(tmp_path: Path):
    gib = 2**30
    sides = [  # (model, side, batch, predicted GiB): the rule allows 24 / 1.1 = 21.8 GiB
        ("a", "fit", 32, 20.0), ("a", "oom", 48, 23.0),  # both right
        ("b", "fit", 32, 20.0), ("b", "oom", 48, 21.0),  # OOM predicted to fit: wrong
        ("c", "fit", 512, 22.5),  # at the start: fit side only, and it is wrong
        ("d", "fit", 512, 3.0),  # fit side only, right
    ]
    path = tmp_path / "rows.csv"
    lines = [",".join(COLUMNS)]
    for model, side, batch, predicted in sides:
        row = dict.fromkeys(COLUMNS, "")
        row.update(model=model, memory_format="contiguous", image_size=224, side=side, batch_size=batch,
                   observed="fits" if side == "fit" else "oom", status="estimated",
                   predicted_reserved_bytes=int(predicted * gib))
        lines.append(",".join(str(row[c]) for c in COLUMNS))
    path.write_text("\n".join(lines) + "\n")
    rows = judged(path).set_index("model")
    assert rows.both_right.to_dict() == {"a": True, "b": False, "c": False, "d": True}
    # A workspace held at the peak (1 GiB more on every side) puts b's OOM over the line; a's fit still fits.
    held = judged(path, extra_bytes=gib).set_index("model")
    assert held.both_right.to_dict() == {"a": True, "b": True, "c": False, "d": True}
    summary = summary_markdown(path)
    assert "| contiguous | 4 | 50% | 50% of 2 |" in summary and "| 1024 MiB | 2 of 2 | 3 of 4 | 75.0% |" in summary


def test_a_name_timm_now_builds_as_another_model_is_not_judged(tmp_path: Path):
    """timm maps some deprecated names to other architectures (ig_resnext101_32x48d, 828 M parameters in the
    reference row, builds an 89 M one today): estimating that name says nothing about the row's model."""
    gib = 2**30
    path = tmp_path / "rows.csv"
    lines = [",".join(COLUMNS)]
    for model, side, predicted in (("resnet50", "fit", 20.0), ("resnet50", "oom", 23.0),
                                   ("ig_resnext101_32x48d", "fit", 3.0), ("ig_resnext101_32x48d", "oom", 4.0)):
        row = dict.fromkeys(COLUMNS, "") | {"model": model, "memory_format": "contiguous", "image_size": 224,
                                            "side": side, "batch_size": 16, "observed": side, "status": "estimated",
                                            "predicted_reserved_bytes": int(predicted * gib)}
        lines.append(",".join(str(row[c]) for c in COLUMNS))
    path.write_text("\n".join(lines) + "\n")
    assert set(judged(path).model) == {"resnet50", "ig_resnext101_32x48d"}  # no counts beside the rows: all judged
    reference = tmp_path / "reference.csv"  # the counts timm's table publishes beside each row
    reference.write_text("model,param_count_m\nresnet50,25.56\nig_resnext101_32x48d,828.41\n")
    assert len(count_parameters(path, reference)) == 2 and count_parameters(path, reference) == []  # each once
    assert set(pd.read_csv(tmp_path / PARAM_COUNTS).model) == {"resnet50", "ig_resnext101_32x48d"}
    assert set(judged(path).model) == {"resnet50"}
    assert agreement(rows_file=path).rows == 1
    summary = summary_markdown(path)
    assert "Not judged: 1 rows of 1 models that today's timm builds as another model" in summary
    assert "ig_resnext101_32x48d (88.79 M parameters today, 828.41 M in the row)" in summary


def test_every_answer_quotes_its_models_family_or_says_it_has_no_public_row(tmp_path: Path):
    gib = 2**30
    path = tmp_path / "rows.csv"
    lines = [",".join(COLUMNS)]
    for model, side, predicted in (("resnet50", "fit", 20.0), ("resnet50", "oom", 23.0),  # right
                                   ("resnet101", "fit", 20.0), ("resnet101", "oom", 21.0),  # OOM missed
                                   ("vit_small", "fit", 3.0)):
        row = dict.fromkeys(COLUMNS, "") | {"model": model, "memory_format": "contiguous", "image_size": 224,
                                            "side": side, "batch_size": 32, "observed": side, "status": "estimated",
                                            "predicted_reserved_bytes": int(predicted * gib)}
        lines.append(",".join(str(row[c]) for c in COLUMNS))
    path.write_text("\n".join(lines) + "\n")
    resnet = agreement(rows_file=path, model="resnet152d")
    assert (resnet.family, resnet.family_rows, resnet.family_both_right_pct) == ("resnet", 2, 50.0)
    assert "family 'resnet': both sides right on 50.0 % of 2 rows" in resnet.describe()
    own = agreement(rows_file=path, model="mine.py:build")  # a model of the user's own: no family among the rows
    assert own.family_rows == 0 and "no public row" in own.describe()



def test_the_summary_counts_the_misses_where_the_two_memory_formats_fit_different_batches(tmp_path: Path):
    """The estimate gives both memory formats one peak, so a model whose reference formats fit different batches
    is missed in one of them: the summary says how many of the misses that explains."""
    gib = 2**30
    path = tmp_path / "rows.csv"
    lines = [",".join(COLUMNS)]
    sides = (("split", "contiguous", "fit", 256, 16.0), ("split", "contiguous", "oom", 384, 20.0),  # OOM missed
             ("split", "channels_last", "fit", 384, 20.0), ("split", "channels_last", "oom", 512, 26.0),
             ("same", "contiguous", "fit", 128, 10.0), ("same", "contiguous", "oom", 192, 23.0),
             ("same", "channels_last", "fit", 128, 10.0), ("same", "channels_last", "oom", 192, 23.0),
             ("near", "contiguous", "fit", 128, 20.0), ("near", "contiguous", "oom", 192, 21.5),  # OOM at 0.985
             ("far", "contiguous", "fit", 128, 10.0), ("far", "contiguous", "oom", 192, 15.0))  # OOM at 0.69
    for model, memory_format, side, batch, predicted in sides:
        row = dict.fromkeys(COLUMNS, "") | {"model": model, "memory_format": memory_format, "image_size": 224,
                                            "side": side, "batch_size": batch, "observed": side,
                                            "status": "estimated", "predicted_reserved_bytes": int(predicted * gib)}
        lines.append(",".join(str(row[c]) for c in COLUMNS))
    path.write_text("\n".join(lines) + "\n")
    summary = summary_markdown(path)
    assert ("In 1 of the 2 models the table holds in both memory formats, the two fit different largest batches "
            "(contiguous the smaller in 1, channels_last in 0)") in summary
    assert "within 1 % in 3 of the 3 batches estimated in both" in summary
    assert "so it can be right on one of the two at most: 1 of the 3 rows missed are theirs." in summary
    # contiguous's OOM batch (384) is the channels-last fit batch: one side of the two is missed whatever the peak
    assert ("In 1 of those models the smaller format's OOM batch is at or below the other format's fit batch"
            in summary and "can reach at most 83.3%" in summary)
    assert "Of the 2 misses of the other models, 1 lie within 3% of the line: 0 fit sides" in summary
    assert "1 OOM sides at most 3% under" in summary

def test_a_family_timm_now_builds_with_other_layers_is_not_judged_and_its_score_is_said(tmp_path: Path):
    """The table's TResNets ran with Inplace-ABN; today's timm builds BatchNorm and LeakyReLU: their rows measured
    another implementation, so they are left out, and the summary says how they would have scored."""
    gib = 2**30
    path = tmp_path / "rows.csv"
    lines = [",".join(COLUMNS)]
    for model, side, predicted in (("resnet50", "fit", 20.0), ("resnet50", "oom", 23.0),  # right
                                   ("tresnet_m", "fit", 23.0), ("tresnet_m", "oom", 25.0)):  # fit side missed
        row = dict.fromkeys(COLUMNS, "") | {"model": model, "memory_format": "contiguous", "image_size": 224,
                                            "side": side, "batch_size": 16, "observed": side, "status": "estimated",
                                            "predicted_reserved_bytes": int(predicted * gib)}
        lines.append(",".join(str(row[c]) for c in COLUMNS))
    path.write_text("\n".join(lines) + "\n")
    assert set(judged(path).model) == {"resnet50"}
    assert set(judged(path, rebuilt=True).model) == {"resnet50", "tresnet_m"}
    assert agreement(rows_file=path).both_right_pct == 100.0
    summary = summary_markdown(path)
    assert "Not judged: 1 rows of 1 models whose layers today's timm builds otherwise" in summary
    assert "Judged anyway, 0 of 1 would be right on both sides (50.0% of all 2 rows)" in summary
    tresnet = agreement(rows_file=path, model="tresnet_l")
    assert "family 'tresnet': its public rows measured other layers" in tresnet.describe()
