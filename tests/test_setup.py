"""One setup (`bench.train.setup`): the runner and the memory estimator train the same model on the same input."""

from __future__ import annotations

import pytest

from bench.grid.cell import Cell
from bench.memory.estimate import fake_step
from bench.train.setup import cell_batch, cell_training


def _cell(**changes) -> Cell:
    fields = dict(experiment="e", profile="cpu", model="test_resnet", image_size=32, micro_batch=2, accum_steps=2,
                  precision="fp16", checkpointing="last-1", optimizer="adamw", channels_last=True, warmup_steps=1,
                  measured_steps=1, seed=3)
    return Cell(**{**fields, **changes})


@pytest.mark.parametrize("cell", [_cell(), _cell(model="test_vit", precision="bf16", optimizer="sgd",
                                                  channels_last=False, attention="eager", in_chans=1, num_classes=7)],
                         ids=["resnet-fp16-channels-last", "vit-bf16-eager-1-channel"])
def test_the_estimator_traces_the_model_optimizer_and_batch_the_runner_trains(cell):
    runner = cell_training(cell, "cpu")
    images, labels = cell_batch(cell, "cpu")
    with fake_step(cell, "cpu") as estimated:
        assert [(name, p.shape) for name, p in estimated.model.named_parameters()] == \
               [(name, p.shape) for name, p in runner.model.named_parameters()]
        assert type(estimated.optimizer) is type(runner.optimizer)
        assert estimated.batch[0].shape == images.shape and estimated.batch[0].stride() == images.stride()
        assert estimated.batch[1].shape == labels.shape
    assert int(labels.max()) < cell.num_classes
    assert (runner.scaler is not None) == (cell.precision == "fp16")


def test_the_same_cell_trains_from_the_same_weights_and_input_and_another_seed_does_not():
    first, again, other = (cell_training(cell, "cpu").model.state_dict() for cell in (_cell(), _cell(), _cell(seed=4)))
    assert all(first[key].equal(again[key]) for key in first)
    assert not all(first[key].equal(other[key]) for key in first)
    assert all(a.equal(b) for a, b in zip(cell_batch(_cell(), "cpu"), cell_batch(_cell(), "cpu")))
