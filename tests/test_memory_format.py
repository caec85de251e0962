"""Channels-last against contiguous (docs/speed/memory_format.*): every committed pair is the ratio of two public
rows of timm's table, and the committed page is what the committed validation gives."""

from __future__ import annotations

import csv

from conftest import REPO

from bench.speed.memory_format import PAIR_COLUMNS, format_pairs


def _read(path):
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_the_committed_pairs_are_the_committed_validations():
    committed = _read(REPO / "docs/speed/memory_format.csv")
    current = format_pairs(_read(REPO / "docs/speed/validation.csv"))
    assert committed and list(committed[0]) == list(PAIR_COLUMNS)
    assert [{k: str(v) for k, v in line.items()} for line in current] == committed


def test_every_training_pair_is_the_ratio_of_timms_two_rows_of_the_model():
    public: dict[tuple, dict[str, float]] = {}
    for row in _read(REPO / "bench/data/reference/timm_rtx3090_train_amp.csv"):
        public.setdefault((row["model"], row["batch_size"]), {})[row["memory_format"]] = \
            float(row["train_samples_per_s"])
    train = [line for line in _read(REPO / "docs/speed/memory_format.csv") if line["source"] == "timm-train"]
    assert len(train) >= 60
    for line in train:
        rates = public[(line["model"], line["batch_size"])]
        assert float(line["measured_ratio"]) == round(rates["channels_last"] / rates["contiguous"], 3), line["model"]
