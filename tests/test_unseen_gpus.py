"""The throughput model's check on GPUs its fit never saw (Lambda's H100, H200 and B200 BERT rows): the rows are held
out, the stand-in is BERT's shape, and the committed figures are the shipped model's."""

from __future__ import annotations

import csv
import json

import pytest
import timm
import torch
from conftest import REPO

from bench.speed.params import load_model_file
from bench.speed.reference import STANDINS, lambda_rows, reference_rows
from bench.speed.unseen_gpus import ROW_COLUMNS, unseen_gpu_check

BERT_ENCODER_PARAMETERS = {
    # Per layer: Q, K, V and output projections (4 x (d^2 + d)), the MLP (2 d m + m + d), two LayerNorms (4 d).
    "bert_base_squad": 12 * (4 * (768**2 + 768) + 2 * 768 * 3072 + 3072 + 768 + 4 * 768),
    "bert_large_squad": 24 * (4 * (1024**2 + 1024) + 2 * 1024 * 4096 + 4096 + 1024 + 4 * 1024),
}


def test_the_checked_rows_are_held_out_of_the_fit():
    checked = lambda_rows()
    assert {row.gpu for row in checked} == {"H100-80GB", "H100-PCIe", "H200", "B200"}
    assert not {row.source for row in reference_rows()} & {row.source for row in checked}
    assert not {row.gpu for row in checked} & set(load_model_file().training_gpus)
    # Rows Lambda's compiler doubted (a run cut short of the steps its figure counts) are not judged.
    assert all(row.samples_per_s < 1500 for row in checked)


@pytest.mark.parametrize("name", sorted(STANDINS))
def test_the_stand_in_has_the_shapes_of_bert_encoder(name):
    standin = STANDINS[name]
    with torch.device("meta"):
        model = timm.create_model(standin.timm_model, num_classes=standin.num_classes,
                                  **json.loads(standin.model_kwargs))
    assert model.patch_embed.num_patches == standin.sequence == 384
    assert sum(p.numel() for p in model.blocks.parameters()) == BERT_ENCODER_PARAMETERS[name]


@pytest.mark.slow  # about 7 s: builds the op features of 172 rows
def test_the_committed_check_is_the_shipped_models():
    with (REPO / "docs/speed/unseen_gpus.csv").open(newline="") as handle:
        committed = list(csv.DictReader(handle))
    current = unseen_gpu_check().rows
    assert [list(row) for row in committed] == [list(ROW_COLUMNS)] * len(current)
    assert [{k: str(v) for k, v in row.items()} for row in current] == committed
