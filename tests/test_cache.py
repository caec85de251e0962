"""The disk cache of answers: a hit returns what was stored, a corrupt or foreign file is ignored with one
warning and recomputed, --no-cache reads and writes nothing; cached estimates equal fresh ones."""

from __future__ import annotations

import json

import pytest

from bench.cache import NO_CACHE_ENV, DiskCache
from bench.grid.cell import Cell
from bench.memory.estimate import estimate_cell
from bench.memory.estimate_grid import estimate_row, estimated_row


@pytest.fixture
def store(tmp_path):
    return DiskCache("test", sources=("cache.py",), root=tmp_path)


def test_a_stored_answer_comes_back_for_its_key_only(store):
    store.put({"model": "a"}, {"peak": 1})
    assert store.get({"model": "a"}) == {"peak": 1}
    assert store.get({"model": "b"}) is None


def test_a_corrupt_file_is_ignored_with_one_warning_and_rewritten(store, tmp_path, capsys):
    store.put({"model": "a"}, 5)
    (entry,) = (tmp_path / "test").glob("*.json")
    entry.write_text("{not json")
    assert store.get({"model": "a"}) is None
    assert capsys.readouterr().err.count("warning: ignoring cache file") == 1
    store.put({"model": "a"}, 6)
    assert store.get({"model": "a"}) == 6


def test_a_file_written_for_another_key_is_never_read_as_this_one(store, tmp_path, capsys):
    store.put({"model": "a"}, 5)
    (entry,) = (tmp_path / "test").glob("*.json")
    stored = json.loads(entry.read_text())
    stored["key"]["torch"] = "0.0.1"  # as if an older torch had written it under this name
    entry.write_text(json.dumps(stored))
    assert store.get({"model": "a"}) is None
    assert "another key" in capsys.readouterr().err


def test_no_cache_reads_and_writes_nothing(store, tmp_path, monkeypatch):
    store.put({"model": "a"}, 5)
    monkeypatch.setenv(NO_CACHE_ENV, "1")
    assert store.get({"model": "a"}) is None
    store.put({"model": "b"}, 6)
    monkeypatch.delenv(NO_CACHE_ENV)
    assert store.get({"model": "b"}) is None


def test_an_unwritable_cache_still_answers(tmp_path):
    (tmp_path / "file").write_text("")
    store = DiskCache("test", sources=(), root=tmp_path / "file")  # its folder cannot be made
    store.put({"k": 1}, 2)
    assert store.get({"k": 1}) is None


def _cell(**axes) -> Cell:
    values = dict(experiment="e", profile="cuda", model="test_vit", image_size=32, micro_batch=4, accum_steps=3,
                  precision="bf16", checkpointing="off", optimizer="adamw", channels_last=False, warmup_steps=1,
                  measured_steps=1) | axes
    return Cell(**values)


@pytest.mark.parametrize("axes, target", [
    ({}, "cuda"),
    ({"model": "test_resnet", "precision": "fp16", "checkpointing": "full"}, "cpu"),
    ({"optimizer": "sgd", "precision": "fp32"}, "cuda"),
])
@pytest.mark.slow
def test_an_estimate_from_two_micro_batches_equals_the_full_trace(axes, target, tmp_path, monkeypatch):
    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path))
    cell = _cell(**axes)
    full = estimate_row(cell, estimate_cell(cell, target))
    shortcut = estimated_row(cell, target)
    cached = estimated_row(cell, target)  # the second time from the disk cache
    for row in (shortcut, cached):
        assert {k: v for k, v in row.items() if k != "host_rss_bytes"} == \
               {k: v for k, v in full.items() if k != "host_rss_bytes"}
    assert len(list((tmp_path / "traces").iterdir())) == 1  # K = 3 is traced at K = 2, once


@pytest.mark.slow
def test_estimate_probe_and_predict_read_one_trace_of_a_configuration(tmp_path, monkeypatch):
    """`bench estimate`, `bench probe` and `bench predict` (and so `bench plan`) of one configuration trace it once:
    whatever its K above 1 or its experiment, the others read the first one's trace (`bench.memory.traces`)."""
    from dataclasses import replace

    from bench.memory.probe import estimated_peak_bytes
    from bench.speed.predict import predicted_rows

    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path))
    cell = _cell(accum_steps=4)
    row = estimated_row(cell, "cuda")
    peak, traced_now = estimated_peak_bytes(replace(cell, experiment="probe", accum_steps=2), "cuda")
    (predicted,) = predicted_rows(replace(cell, experiment="predict", accum_steps=8), ("A100-40GB",))
    assert not traced_now and peak == row["peak_reserved_bytes"] == predicted["peak_reserved_bytes"]
    assert predicted["status"] == "predicted" and predicted["samples_per_s"] > 0
    assert len(list((tmp_path / "traces").iterdir())) == 1


@pytest.mark.slow
def test_a_model_from_a_file_is_traced_again_once_the_file_changes(tmp_path, monkeypatch):
    """The trace cache keys a file model by its code too: an edited factory never gets the old file's answer."""
    from bench.memory.probe import estimated_peak_bytes

    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    factory = "import torch.nn as nn\n\ndef net(num_classes, in_chans):\n    return nn.Sequential(nn.Conv2d(in_chans, {w}, 3), " \
              "nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear({w}, num_classes))\n"
    (tmp_path / "net.py").write_text(factory.format(w=4))
    cell = _cell(model="net.py:net", precision="fp32", channels_last=False)
    narrow, traced_now = estimated_peak_bytes(cell, "cuda")
    assert traced_now and estimated_peak_bytes(cell, "cuda") == (narrow, False)
    (tmp_path / "net.py").write_text(factory.format(w=4096))
    assert estimated_peak_bytes(cell, "cuda")[1]  # traced again (this process keeps the module it imported first)
    (tmp_path / "net.py").write_text(factory.format(w=4))
    assert estimated_peak_bytes(cell, "cuda") == (narrow, False)  # the first file's trace, from the cache


def test_a_stored_trace_holds_every_field_of_an_estimate():
    """`bench.memory.traces` stores an `Estimate` without importing it (so a warm plan needs no torch): its list of
    the fields must stay the class's."""
    from dataclasses import fields

    from bench.memory.estimate import Estimate
    from bench.memory.traces import ESTIMATE_FIELDS

    assert set(ESTIMATE_FIELDS) == {f.name for f in fields(Estimate) if f.init}
