"""Hopper and Blackwell in the throughput model: Lambda's BERT rows are fitted through a stand-in of BERT's shapes,
and the committed held-out figures (docs/speed/hopper_blackwell.*) are those of the committed validation."""

from __future__ import annotations

import csv
import json

import pytest
import timm
import torch
from conftest import REPO

from bench.speed.hopper_blackwell import ROW_COLUMNS, configurations
from bench.speed.params import load_model_file
from bench.speed.reference import STANDINS, lambda_rows, lambda_systems, reference_rows

BERT_ENCODER_PARAMETERS = {
    # Per layer: Q, K, V and output projections (4 x (d^2 + d)), the MLP (2 d m + m + d), two LayerNorms (4 d).
    "bert_base_squad": 12 * (4 * (768**2 + 768) + 2 * 768 * 3072 + 3072 + 768 + 4 * 768),
    "bert_large_squad": 24 * (4 * (1024**2 + 1024) + 2 * 1024 * 4096 + 4096 + 1024 + 4 * 1024),
}


def _read(name: str) -> list[dict]:
    with (REPO / "docs/speed" / name).open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_hopper_and_blackwell_rows_are_fitted_one_per_configuration_and_doubted_rows_are_not():
    rows, systems = lambda_rows(), lambda_systems()
    assert {row.gpu for row in rows} == {"H100-80GB", "H100-PCIe", "H200", "B200"}
    assert set(rows) <= set(reference_rows())
    assert {"H100-80GB", "H200", "B200"} <= set(load_model_file().training_gpus)
    # 38 H100 hosts ran the same four configurations: one fitted row each, their median.
    assert len(rows) == len({(s.gpu, s.model, s.precision, s.stack, s.batch_size) for s in systems}) < len(systems)


def test_a_doubt_flagged_row_is_left_out(monkeypatch):
    """A run cut short of the 100 steps Lambda's figure counts overstates it (8x B200 BERT-base: x3.33): left out,
    as is a scratch folder's row. In the file only multi-GPU and GH200 rows carry these flags, so plant one."""
    import bench.speed.reference as reference

    row = {"model": "bert_base_squad", "gpu": "H100-80GB", "gpus": "1", "precision": "fp16", "batch_per_gpu": "320",
           "throughput_per_gpu": "900", "container": "nv24.03", "notes": "mean of 3 runs"}
    flagged = [{**row, "notes": f"[{doubt}] mean of 3 runs", "throughput_per_gpu": "3000"}
               for doubt in reference.LAMBDA_DOUBTS]
    monkeypatch.setattr(reference, "_read", lambda name: [row, *flagged])
    assert [system.samples_per_s for system in reference.lambda_systems()] == [900.0]


@pytest.mark.parametrize("name", sorted(STANDINS))
def test_the_stand_in_has_the_shapes_of_berts_encoder(name):
    standin = STANDINS[name]
    with torch.device("meta"):
        model = timm.create_model(standin.timm_model, num_classes=standin.num_classes,
                                  **json.loads(standin.model_kwargs))
    assert model.patch_embed.num_patches == standin.sequence == 384
    assert sum(p.numel() for p in model.blocks.parameters()) == BERT_ENCODER_PARAMETERS[name]


def test_the_committed_hopper_blackwell_table_is_the_committed_validations():
    committed = _read("hopper_blackwell.csv")
    current = configurations(_read("validation.csv"))
    assert committed and list(committed[0]) == list(ROW_COLUMNS)
    assert [{k: str(v) for k, v in row.items()} for row in current] == committed
    # Every system of every Lambda configuration is counted once.
    assert sum(line["systems"] for line in current) == len(lambda_systems())
