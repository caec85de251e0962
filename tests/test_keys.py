"""One configuration key: two rows that differ in any single axis are never merged.

For every axis of `Cell` in turn, a plain row and its twin that differs in that axis alone go
through the plan, the throughput model's accumulation table and the report's tables; each keeps
them apart (or leaves the twin out, saying so), never folds them into one line.
"""

from __future__ import annotations


import pandas as pd
import pytest

from bench.cost.catalog import load_catalog
from bench.planner.ranking import PlanRequest, make_plan
from bench.cost.outputs import markdown
from bench.cost.price import STRATEGY, Assumptions, MeasuredRow, Workload, price_rows
from bench.grid.cell import Cell, axes, choices
from bench.report.tables import accumulation_cost, cell_table
from bench.results.keys import SPLIT, configuration_key, key_columns, variant
from bench.speed.predict import accumulation_loss

PLAIN = Cell(experiment="e", profile="cuda", model="resnet50", image_size=224, micro_batch=16, accum_steps=1,
             precision="bf16", checkpointing="off", optimizer="adamw", channels_last=False, warmup_steps=1,
             measured_steps=3)
OTHER_TEXT = {"model": "vit_base_patch16_224", "checkpointing": "full", "model_kwargs": '{"drop_rate":0.1}'}


def _other(name: str) -> object:
    """A valid value of axis `name` other than the plain cell's."""
    value = getattr(PLAIN, name)
    options = choices(name)
    if options:
        return next(option for option in options if option != value)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    return OTHER_TEXT[name]


AXES = list(axes())


def _config(cell_changes: dict, micro_batch: int, accum_steps: int) -> dict:
    row = {**PLAIN.to_dict(), **cell_changes, "micro_batch": micro_batch, "accum_steps": accum_steps}
    row["effective_batch"] = micro_batch * accum_steps
    return row


def _pair(name: str) -> tuple[dict, dict]:
    return {}, {name: _other(name)}


def test_every_axis_and_the_split_make_up_the_key():
    assert set(key_columns()) == set(AXES) | set(SPLIT)
    assert configuration_key(PLAIN.to_dict()) == configuration_key({**PLAIN.to_dict(), "experiment": "other"})


@pytest.mark.parametrize("name", AXES)
def test_rows_apart_in_one_axis_have_apart_keys(name):
    plain, twin = _pair(name)
    assert configuration_key(_config(plain, 16, 1), ignore=SPLIT) != configuration_key(_config(twin, 16, 1),
                                                                                      ignore=SPLIT)


# --- bench plan ---------------------------------------------------------------------------------

def _measured(changes: dict, samples_per_s: float) -> MeasuredRow:
    row = {**_config(changes, 16, 1), "status": "ok", "cell_id": f"c-{samples_per_s}", "device_type": "cuda",
           "device_name": "NVIDIA L4", "samples_per_s": samples_per_s, "mfu_pct": None,
           "model_flops_per_sample": None, "peak_memory_bytes": 2**31, "peak_reserved_bytes": None,
           "memory_source": "cuda_allocator", "scaling_efficiency": None, "speed_basis": ""}
    return MeasuredRow(row)


# The plan answers for one model at one image size, and prices single-process synthetic-input rows:
# a twin apart in one of these is left out (and counted), the others must come out as options of their own.
PLAN_FILTERS = {"model", "image_size", "world_size", "input"}


@pytest.mark.parametrize("name", AXES)
def test_plan_keeps_rows_apart_in_one_axis_and_names_the_variant(name):
    plain, twin = _pair(name)
    g6 = tuple(i for i in load_catalog().select() if i.instance == "g6.xlarge")
    request = PlanRequest(model="resnet50", effective_batch=32, image_size=224)
    plan = make_plan([_measured(plain, 100.0), _measured(twin, 90.0)], g6, request, Assumptions())
    if name in PLAN_FILTERS:
        assert len(plan.options) == 1 and plan.options[0].line.row.samples_per_s == 100.0
        assert name in ("model", "image_size") or sum(plan.left_out.values()) == 1  # the request picks those
        return
    assert sorted(option.line.row.samples_per_s for option in plan.options) == [90.0, 100.0]
    labels = {option.configuration for option in plan.options}
    assert len(labels) == 2, labels  # each option says which variant it is


def test_plan_names_a_channels_last_variant_only_where_options_differ_in_it():
    g6 = tuple(i for i in load_catalog().select() if i.instance == "g6.xlarge")
    plan = make_plan([_measured({}, 100.0), _measured({"channels_last": True}, 120.0)], g6,
                     PlanRequest(model="resnet50", effective_batch=32), Assumptions())
    alone = make_plan([_measured({"channels_last": True}, 120.0)], g6, PlanRequest(model="resnet50", effective_batch=32),
                      Assumptions())
    assert [option.configuration for option in alone.options] == ["16x2 per GPU bf16 ckpt-off adamw"]
    assert [option.configuration for option in plan.options] == [
        "16x2 per GPU bf16 ckpt-off adamw channels_last=True", "16x2 per GPU bf16 ckpt-off adamw channels_last=False"]


# --- bench cost ------------------------------------------------------------------------------------

# Priced rows are single-process synthetic-input rows: a twin apart in one of these is refused, not priced.
COST_REFUSALS = {"world_size", "input"}


@pytest.mark.parametrize("name", AXES)
def test_cost_labels_two_rows_apart_in_one_axis_apart_and_name_the_axis(name):
    plain, twin = _pair(name)
    g6 = tuple(i for i in load_catalog().select() if i.instance == "g6.xlarge")
    table = price_rows([_measured(plain, 100.0), _measured(twin, 90.0)], g6, Workload(), Assumptions())
    if name in COST_REFUSALS:
        assert len(table.refused) == 1 and table.variant_axes == ()
        return
    labels = {table.strategy(line.row) for line in table.lines}
    assert len(labels) == 2, labels
    assert all((f" {name}=" in label) == (name not in STRATEGY) for label in labels), labels  # the label's own, or named
    written = markdown(table, "t", "catalog")
    assert all(f"| {label} |" in written for label in labels)
    assert {row["strategy"] for row in table.frame_rows()} == labels  # cost.csv's rows


def test_cost_labels_name_no_variant_where_rows_differ_only_in_the_strategy():
    g6 = tuple(i for i in load_catalog().select() if i.instance == "g6.xlarge")
    table = price_rows([_measured({}, 100.0), _measured({"precision": "fp32"}, 50.0)], g6, Workload(), Assumptions())
    assert sorted(table.strategy(line.row) for line in table.lines) == ["16x1 bf16 ckpt-off adamw",
                                                                        "16x1 fp32 ckpt-off adamw"]


# --- the throughput model's accumulation table, the report's accumulation table ---------------------

def _speeds(changes: dict, accumulated_samples_per_s: float) -> list[dict]:
    """A configuration at its large-batch end (16x1, 100 samples/s) and its accumulated end (2x8)."""
    return [{**_config(changes, 16, 1), "samples_per_s": 100.0, "cell_id": f"{changes}-16x1"},
            {**_config(changes, 2, 8), "samples_per_s": accumulated_samples_per_s, "cell_id": f"{changes}-2x8"}]


@pytest.mark.parametrize("name", AXES)
def test_predicted_accumulation_table_keeps_rows_apart_in_one_axis(name):
    plain, twin = _pair(name)
    rows = [{**row, "status": "predicted", "gpu": "L4", "predicted_bound": "compute"}
            for row in _speeds(plain, 80.0) + _speeds(twin, 50.0)]
    table = accumulation_loss(rows)
    assert sorted(line["throughput_lost_pct"] for line in table) == [20.0, 50.0]  # never 2x8 of one vs 16x1 of another
    identity = [tuple(value for column, value in line.items() if not column.endswith(("_split", "_per_s", "_pct")))
                for line in table]
    assert len(set(identity)) == 2, identity  # and the two lines say which is which


# The report compares at checkpointing off with the reference optimizer: a twin apart in either is not compared.
REPORT_FILTERS = {"checkpointing", "optimizer"}


def _measured_frame(rows: list[dict]) -> pd.DataFrame:
    extra = {"status": "ok", "peak_memory_bytes": 2**30, "mfu_pct": 1.0, "step_times_ms": "", "peak_reserved_bytes": None,
             "activations_saved_bytes": None, "optimizer_state_bytes": None, "step_time_median_ms": 10.0,
             "step_time_ci95_rel": None, "noisy": None, "remeasured": None, "hfu_pct": 1.0, "load_avg_1m": 0.0}
    return pd.DataFrame([{**extra, **row} for row in rows])


@pytest.mark.parametrize("name", AXES)
def test_report_accumulation_table_keeps_rows_apart_in_one_axis(name):
    plain, twin = _pair(name)
    frame = _measured_frame(_speeds(plain, 80.0) + _speeds(twin, 50.0))
    table = accumulation_cost(frame)
    lost = sorted(table["throughput lost (%)"])
    assert lost == ([20.0] if name in REPORT_FILTERS else [20.0, 50.0])
    if name not in REPORT_FILTERS:
        identity = table.drop(columns=[c for c in table if "(" in c or c in ("large batch", "accumulated")])
        assert len(identity.drop_duplicates()) == 2, identity  # a column says how the two differ


@pytest.mark.parametrize("name", AXES)
def test_report_cell_table_tells_rows_apart_in_one_axis(name):
    plain, twin = _pair(name)
    frame = _measured_frame(_speeds(plain, 80.0)[:1] + _speeds(twin, 50.0)[:1])
    identity = cell_table(frame).loc[:, "model":"status"]
    assert len(identity.drop_duplicates()) == 2, identity


def test_variant_words():
    assert variant({**PLAIN.to_dict(), "attention": "eager", "channels_last": True}) == "channels_last attention=eager"
    assert variant(PLAIN.to_dict()) == ""
