"""The catalog a user can refresh: `bench catalog` (dates, stale prices), `bench catalog import` (SkyPilot
vms.csv files into the project's catalog format, merged with superseding), and the stale flag in answers."""

from __future__ import annotations

import shutil
from dataclasses import replace
from datetime import date
from pathlib import Path

import pytest
from conftest import bench_in_process, read_rows

from bench.cli import main
from bench.cost.catalog import (
    COLUMNS,
    Instance,
    load_catalog,
    merge,
    months_before,
    stale,
    stale_note,
    write_catalog,
)
from bench.cost.outputs import markdown, summary
from bench.planner.ranking import PlanRequest, make_plan
from bench.planner.render import plan_text
from bench.cost.price import Assumptions, MeasuredRow, Workload, price_rows
from bench.cost.skypilot import (
    GCP_MACHINE_GPUS,
    GPU_KEYS,
    PROVIDER_GPU_KEYS,
    read_skypilot,
)
from bench.measure.hardware import gpu_keys, gpu_spec
from bench.results.store import RunsFile
from bench.units import GIB

SAMPLES = Path(__file__).parent / "data" / "skypilot"
TODAY = date(2026, 12, 1)


def _fixture(cloud: str) -> Path:
    (path,) = SAMPLES.glob(f"{cloud}_vms_*_excerpt.csv")
    return path


def _import(cloud: str, **options):
    return read_skypilot(_fixture(cloud), observed="2026-11", provider=cloud, **options)


def _price(imported, instance: str, region: str) -> Instance:
    (found,) = [i for i in imported.instances if (i.instance, i.region) == (instance, region)]
    return found


# --- what each SkyPilot file imports to ------------------------------------------------------

@pytest.mark.parametrize("cloud, instance, region, gpu, count, usd, spot, vcpus", [
    # spot = the cheapest zone (use1-az2 0.787 of 0.7945 / 0.787 / 0.8396 / 1.2079)
    ("aws", "g6e.xlarge", "us-east-1", "L40S", 1, 1.861, 0.787, 4),
    ("aws", "g6e.48xlarge", "us-east-1", "L40S", 8, 30.13118, 6.5237, 192),
    ("aws", "p5.48xlarge", "us-east-1", "H100-80GB", 8, 98.32, 20.9934, 192),
    ("aws", "p4d.24xlarge", "us-east-1", "A100-40GB", 8, 32.7726, 6.7915, 96),
    ("aws", "p3.2xlarge", "us-east-1", "V100-16GB", 1, 3.06, 0.5197, 8),  # one zone has no spot price
    # two rows for one zone that differ only in GpuInfo: one price
    ("aws", "p4de.24xlarge", "us-east-1", "A100-80GB", 8, 40.96575, 5.8394, 96),
    # GCP: the machine row plus the accelerator row of its GPUs
    ("gcp", "a2-highgpu-8g", "us-central1", "A100-40GB", 8, 29.38708, 11.54364, 96),
    ("gcp", "a3-highgpu-8g", "us-east4", "H100-80GB", 8, 87.83247, 15.80912, 208),
    ("gcp", "a3-highgpu-1g", "us-east4", "H100-80GB", 1, 10.97906, 1.97614, 26),
    ("gcp", "a3-ultragpu-8g", "us-central1", "H200", 8, 86.75992, 32.61871, 224),
    ("azure", "Standard_ND96asr_v4", "eastus", "A100-40GB", 8, 27.197, 2.99167, 96),
    ("azure", "Standard_NV36ads_A10_v5", "eastus", "A10", 1, 3.2, 0.8, 36),
    ("lambda", "gpu_1x_h100_pcie", "us-east-1", "H100-PCIe", 1, 2.49, None, 26),
    ("lambda", "gpu_1x_h100_sxm5", "us-east-1", "H100-80GB", 1, 3.29, None, 26),
    ("runpod", "1x_H100-SXM_SECURE", "US", "H100-80GB", 1, 2.99, 2.69, 20),
    ("runpod", "1x_A100-80GB_SECURE", "US", "A100-80GB-PCIe", 1, 1.64, 1.19, 8),
    ("runpod", "1x_H100_SECURE", "US", "H100-PCIe", 1, 2.39, None, 16),
])
def test_each_skypilot_layout_imports_to_the_expected_prices(cloud, instance, region, gpu, count, usd, spot, vcpus):
    row = _price(_import(cloud, source="test fixture"), instance, region)
    assert (row.gpu, row.gpu_count, row.vcpus, row.provider, row.observed) == (gpu, count, vcpus, cloud, "2026-11")
    assert row.usd_per_hour == pytest.approx(usd) and row.spot_usd_per_hour == (pytest.approx(spot) if spot else None)
    assert row.gpu_memory_gb == gpu_spec(gpu).memory_gib and row.current
    assert str(_fixture(cloud)) in row.source and "test fixture" in row.source


def test_import_counts_every_instance_of_each_file():
    counts = {cloud: len(_import(cloud).instances) for cloud in ("aws", "gcp", "azure", "lambda", "runpod")}
    assert counts == {"aws": 12, "gcp": 5, "azure": 6, "lambda": 6, "runpod": 10}


def test_gcp_price_is_the_machine_plus_its_gpus_and_the_source_says_so():
    row = _price(_import("gcp"), "a2-highgpu-8g", "us-central1")
    assert "GCP machine 5.91582 + 8x A100 23.47126" in row.source and "spot 2.36604 + 9.1776" in row.source


def test_rows_left_out_are_reported_one_line_per_reason_and_name():
    left_out = {cloud: _import(cloud).left_out for cloud in ("aws", "gcp", "azure", "lambda", "runpod")}
    assert left_out["aws"] == (
        "1 row(s): no accelerator (CPU-only instance types)",
        "1 row(s): accelerator V100-32GB not mapped to a bench GPU: no bench GPU row for it (bench/data/gpus.csv): "
        "p3dn.24xlarge",
        "1 row(s): no on-demand price (Price empty): p5e.48xlarge")  # sold only as capacity blocks: never a 0
    assert "2 row(s): TPU, not a GPU: tpu-v6e-1 (2)" in left_out["gcp"]
    assert any(line.startswith("1 row(s): GCP machine row without the accelerator row") and "a2-highgpu-1g" in line
               for line in left_out["gcp"])
    assert any(line.startswith("4 row(s): GCP accelerator row matching no machine row") and "8x B200" in line
               for line in left_out["gcp"])
    azure_h100 = [line for line in left_out["azure"] if "accelerator H100" in line]
    assert len(azure_h100) == 1 and "Standard_ND96isr_H100_v5" in azure_h100[0] and azure_h100[0].startswith("2 row")
    unmapped = {cloud: [line for line in lines if "not mapped" in line] for cloud, lines in left_out.items()}
    assert [line.split()[3] for line in unmapped["lambda"]] == ["GH200", "RTX6000"]  # RTX6000: the Quadro, 24 GB
    assert [line.split()[3] for line in unmapped["runpod"]] == ["A40", "RTX4000-Ada"] and \
        unmapped["runpod"] == list(left_out["runpod"])


def test_doubtful_prices_are_flagged():
    runpod = _import("runpod")
    assert _price(runpod, "1x_L40S_SECURE", "US").spot_usd_per_hour is None  # 0.86 spot over 0.43 on-demand
    assert runpod.flags == ("1x_L40S_SECURE US: spot 0.86 is not below on-demand 0.43; spot left empty",)
    gcp = _import("gcp")
    assert any(flag.startswith("a3-highgpu-8g: on-demand 43.06615 in us-central1 but 87.83247 in us-east4")
               for flag in gcp.flags)


def test_regions_filter_and_one_price_for_regions_priced_alike(tmp_path):
    assert {i.region for i in _import("aws", regions=("ap-south-1",)).instances} == {"ap-south-1"}
    header = "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,Region,GpuInfo,SpotPrice"
    path = tmp_path / "lambda" / "vms.csv"
    path.parent.mkdir()
    path.write_text("\n".join([header, "gpu_1x_a10,A10,1.0,30.0,200.0,0.75,us-east-1,,",
                               "gpu_1x_a10,A10,1.0,30.0,200.0,0.75,us-west-1,,",
                               "gpu_1x_h100_pcie,H100,1.0,26.0,200.0,2.49,us-east-1,,",
                               "gpu_1x_h100_pcie,H100,1.0,26.0,200.0,2.99,us-west-1,,"]) + "\n")
    imported = read_skypilot(path, observed="2026-11")
    assert imported.provider == "lambda"  # from the path
    assert [(i.instance, i.region) for i in imported.instances] == \
        [("gpu_1x_a10", "all"), ("gpu_1x_h100_pcie", "us-east-1"), ("gpu_1x_h100_pcie", "us-west-1")]
    assert "same price in all 2 regions of the file (us-east-1, us-west-1)" in imported.instances[0].source


def test_zones_that_disagree_and_counts_that_contradict_the_name(tmp_path):
    header = "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Region,SpotPrice,Price," \
             "AvailabilityZone"
    path = tmp_path / "runpod.csv"
    path.write_text("\n".join([header, "1x_L4_SECURE,L4,1.0,4.0,24.0,L4,US,,0.44,US-CA-1",
                               "1x_L4_SECURE,L4,1.0,4.0,24.0,L4,US,0.2,0.48,US-TX-1",
                               "8x_H100-SXM_SECURE,H100-SXM,4.0,160.0,640.0,H100-SXM,US,,23.92,US-CA-1"]) + "\n")
    imported = read_skypilot(path, observed="2026-11", provider="runpod")
    (l4,) = imported.instances
    assert (l4.usd_per_hour, l4.spot_usd_per_hour) == (0.44, 0.2)  # the lowest on-demand, as SkyPilot takes it
    assert imported.flags == ("1x_L4_SECURE US: on-demand differs across zones (0.44, 0.48); used the lowest, "
                              "as SkyPilot does",)
    assert "1 row(s): GPU count contradicts the instance name: 8x_H100-SXM_SECURE says 8, the file 4" \
        in imported.left_out


def test_every_mapped_name_is_a_bench_gpu():
    targets = set(GPU_KEYS.values()) | {v for m in PROVIDER_GPU_KEYS.values() for v in m.values()}
    assert targets <= set(gpu_keys())
    assert {name.upper() for name, _ in GCP_MACHINE_GPUS.values()} <= {name.upper() for name in GPU_KEYS}


# --- merging: one current price per (provider, instance, region) ---------------------------------

def _instance(usd: float, observed: str, region: str = "us-east-1", **changes) -> Instance:
    fields = dict(provider="aws", instance="p5.48xlarge", gpu="H100-80GB", gpu_count=8, gpu_memory_gb=80,
                  usd_per_hour=usd, region=region, observed=observed, source="made up")
    return Instance(**{**fields, **changes})


def test_merge_supersedes_keeps_newer_and_skips_unchanged():
    old, other = _instance(98.32, "2024-09"), _instance(1.0, "2024-09", instance="g6.xlarge", gpu="L4",
                                                         gpu_count=1, gpu_memory_gb=24)
    merged = merge([old, other], [_instance(55.04, "2025-08"), _instance(1.0, "2024-09", instance="g6.xlarge",
                                                                         gpu="L4", gpu_count=1, gpu_memory_gb=24)])
    assert [(i.instance, i.usd_per_hour, i.valid_until) for i in merged.instances] == \
        [("p5.48xlarge", 98.32, "2025-08"), ("g6.xlarge", 1.0, None), ("p5.48xlarge", 55.04, None)]
    assert (len(merged.added), len(merged.superseded), len(merged.unchanged)) == (1, 1, 1)
    newer = merge(merged.instances, [_instance(90.0, "2025-01")])
    assert newer.kept_newer and newer.instances == merged.instances


def test_merged_catalog_is_written_and_loads(tmp_path):
    merged = merge(load_catalog().instances, _import("aws", source="test").instances)
    write_catalog(merged.instances, tmp_path / "merged.csv")
    loaded = load_catalog(tmp_path / "merged.csv")
    assert loaded.instances == merged.instances
    assert (tmp_path / "merged.csv").read_text().splitlines()[0] == ",".join(COLUMNS)


# --- how old a price is --------------------------------------------------------------------------

def test_stale_means_observed_more_than_six_months_before_today():
    june, may_31, day = _instance(1.0, "2026-06"), _instance(1.0, "2026-05-31"), _instance(1.0, "2026-06-01")
    assert months_before(TODAY, 6) == date(2026, 6, 1)
    assert stale([june, may_31, day, june], TODAY) == (may_31,)  # a month alone counts from its first day
    assert stale([june], date(2026, 12, 2)) == (june,)
    assert stale([may_31], TODAY, months=7) == ()
    note = stale_note([june, may_31], TODAY)
    assert note.startswith("STALE PRICES: 1 of 2 prices used are older than 6 months (observed before 2026-06-01")
    assert "oldest 2026-05-31" in note and stale_note([june], TODAY) is None


def _row(**changes) -> MeasuredRow:
    fields = dict(cell_id="128x1", experiment="resnet50", profile="cuda", model="resnet50", image_size=224,
                  micro_batch=128, accum_steps=1, precision="bf16", checkpointing="off", optimizer="adamw",
                  device_type="cuda", device_name="NVIDIA A100-SXM4-40GB", samples_per_s=2000.0, mfu_pct=40.0,
                  model_flops_per_sample=24.6e9, peak_memory_bytes=20 * GIB, memory_source="cuda_allocator")
    return MeasuredRow({"status": "ok", **fields, **changes})


def test_cost_and_plan_answers_flag_stale_prices():
    this_month = date.today().strftime("%Y-%m")
    old = _instance(1.29, "2019-01", provider="lambda", instance="gpu_1x_a100", gpu="A100-40GB", gpu_count=1,
                    gpu_memory_gb=40)
    fresh = _instance(1.5, this_month, provider="lambda", instance="gpu_1x_a100b", gpu="A100-40GB", gpu_count=1,
                      gpu_memory_gb=40)
    table = price_rows([_row()], (old, fresh), Workload(), Assumptions())
    flag = "STALE PRICES: 1 of 2 prices used are older than 6 months"
    assert flag in summary(table, "test catalog") and flag in markdown(table, "t", "test catalog")
    plan = make_plan([_row()], (old, fresh), PlanRequest(model="resnet50", effective_batch=128), Assumptions())
    assert flag in plan_text(replace(plan, catalog="test catalog"), top=3)
    current = price_rows([_row()], (fresh,), Workload(), Assumptions())
    assert "STALE" not in summary(current, "test catalog")


# --- the command line, in process ----------------------------------------------------------------

def test_bench_catalog_lists_gpus_and_instances_with_dates_and_flags(capsys):
    assert main(["catalog", "--today", "2026-12-01"]) == 0
    out = capsys.readouterr().out
    assert "GPUs: bench/data/gpus.csv" in out and "instances: bench/data/instances.csv" in out
    (b200,) = [line for line in out.splitlines() if line.startswith("B200 ")]
    assert "180" in b200 and "2250" in b200 and "2026-12-01" in b200
    (p4d,) = [line for line in out.splitlines() if line.startswith("aws       p4d.24xlarge")]
    assert "2024-09" in p4d and "STALE" in p4d and "32.7726" in p4d
    (p5en,) = [line for line in out.splitlines() if "p5en.48xlarge" in line]
    assert "2026-08" in p5en and "STALE" not in p5en
    assert "STALE PRICES: " in out and "observed before 2026-06-01, today 2026-12-01" in out
    assert main(["catalog", "--gpus"]) == 0
    assert "instances:" not in capsys.readouterr().out
    assert main(["catalog", "--instances", "--include-superseded", "--full", "--today", "2026-12-01"]) == 0
    out = capsys.readouterr().out
    p5 = [line for line in out.splitlines() if line.startswith("aws       p5.48xlarge ")]
    assert "GPUs:" not in out and "superseded by AWS's June 2025 price cut" in out
    assert len(p5) == 2 and "2025-06" in p5[0] and "STALE" not in p5[0]  # superseded: its valid_until says so


def _vms(tmp_path: Path, cloud: str) -> Path:
    path = tmp_path / "catalogs" / "v7" / cloud / "vms.csv"
    path.parent.mkdir(parents=True)
    shutil.copy(_fixture(cloud), path)
    return path


def test_import_writes_a_merged_catalog_beside_the_file_that_supersedes_old_prices(tmp_path, capsys):
    vms = _vms(tmp_path, "aws")
    assert main(["catalog", "import", str(vms), "--observed", "2026-11-30", "--source", "commit 001367d",
                 "--today", "2026-12-01"]) == 0
    out = capsys.readouterr().out
    written = vms.parent / "instances-aws-2026-11-30.csv"
    assert f"wrote {written}" in out and f"bench cost RESULTS_DIR --catalog {written}" in out
    assert "left out: 1 row(s): no on-demand price (Price empty): p5e.48xlarge" in out
    # the built-in p5.48xlarge price (55.04, 2025-08) is superseded by the file's 98.32: pointed out
    assert "check: aws p5.48xlarge us-east-1: on-demand 98.32 (observed 2026-11-30) supersedes 55.04" in out
    catalog = load_catalog(written)
    p5 = [(i.usd_per_hour, i.observed, i.valid_until) for i in catalog.instances if i.instance == "p5.48xlarge"]
    assert p5 == [(98.32, "2024-09", "2025-06"), (55.04, "2025-08", "2026-11-30"), (98.32, "2026-11-30", None)]
    (current,) = [i for i in catalog.select() if i.instance == "p5.48xlarge"]
    assert "commit 001367d" in current.source and current.spot_usd_per_hour == 20.9934
    assert len(catalog.instances) == len(load_catalog().instances) + 12
    gcp = _vms(tmp_path, "gcp")  # the built-in a3 prices are dated 2026-12, after this file's date
    assert main(["catalog", "import", str(gcp), "--observed", "2026-11-30", "--today", "2026-12-01", "--dry-run"]) == 0
    assert "not added: 3 price(s) older than the catalog's current one: a3-highgpu-1g us-east4, " \
           "a3-highgpu-8g us-east4, a3-ultragpu-8g us-central1" in capsys.readouterr().out
    # the written file prices answers as `bench cost --catalog FILE` would
    table = price_rows([_row()], catalog.select(providers=("aws",)), Workload(), Assumptions())
    assert any(line.instance == current for line in table.priced)


def test_import_never_overwrites_a_file_it_was_not_asked_to_merge_into(tmp_path, capsys):
    vms = _vms(tmp_path, "runpod")
    args = ["catalog", "import", str(vms), "--observed", "2026-11", "--today", "2026-12-01"]
    assert main(args) == 0
    written = vms.parent / "instances-runpod-2026-11.csv"
    before = written.read_text()
    assert main(args) == 2 and written.read_text() == before
    assert "exists and is not the catalog merged into" in capsys.readouterr().err
    # merged into itself on purpose: the same prices again change nothing
    assert main(args + ["--catalog", str(written), "--out", str(written)]) == 0
    assert "0 price(s) added (0 superseding" in capsys.readouterr().out and written.read_text() == before
    assert main(args + ["--dry-run", "--out", str(tmp_path / "dry.csv")]) == 0
    assert not (tmp_path / "dry.csv").exists()


@pytest.mark.parametrize("make, extra, message", [
    (lambda d: d / "missing" / "vms.csv", ["--observed", "2026-11"], "cannot read it (No such file or directory)"),
    (lambda d: d, ["--observed", "2026-11", "--provider", "aws"], "is a directory"),
    (lambda d: _write(d / "x" / "vms.csv", "provider,instance\naws,p5\n"), ["--observed", "2026-11"],
     "not a SkyPilot vms.csv: missing column(s) InstanceType"),
    (lambda d: _write(d / "aws" / "vms.csv", b"InstanceType,AcceleratorName\n\xff,\n"), ["--observed", "2026-11"],
     "not UTF-8 text"),
    (lambda d: _vms(d, "aws"), ["--observed", "2026-13"], "--observed 2026-13: not a date YYYY-MM or YYYY-MM-DD"),
    (lambda d: _vms(d, "aws"), ["--observed", "2027-01"], "--observed 2027-01: after today (2026-12-01)"),
    (lambda d: _vms(d, "aws"), [], "--observed: needed: a SkyPilot vms.csv carries no date"),
    (lambda d: _write(d / "aws.csv", _fixture("aws").read_text()), ["--observed", "2026-11"], "--provider: needed"),
    (lambda d: _vms(d, "aws"), ["--observed", "2026-11", "--catalog", "nowhere.csv"], "nowhere.csv: cannot read"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, make, extra, message):
    path = make(tmp_path)
    files_before = sorted(tmp_path.rglob("*"))
    assert main(["catalog", "import", str(path), "--today", "2026-12-01", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("bench")
    assert sorted(tmp_path.rglob("*")) == files_before


def _write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


# --- as a user runs it ---------------------------------------------------------------------------

@pytest.mark.slow  # 1.4-3.5 s (a catalog import and a cost run), no longer a process
def test_imported_catalog_prices_a_results_folder_with_bench_cost(tmp_path, capfd):
    vms = _vms(tmp_path, "gcp")
    imported = bench_in_process(capfd, "catalog", "import", str(vms), "--observed", "2026-11-30")
    assert imported.returncode == 0, imported.stderr
    written = vms.parent / "instances-gcp-2026-11-30.csv"
    folder = tmp_path / "results" / "resnet50" / "nvidia-a100-sxm4-40gb"
    runs = RunsFile(folder / "runs.csv")
    row = _row()
    runs.write({**{name: getattr(row, name) for name in (
        "cell_id", "experiment", "profile", "model", "image_size", "micro_batch", "accum_steps", "precision",
        "checkpointing", "optimizer", "device_type", "device_name", "samples_per_s", "mfu_pct",
        "model_flops_per_sample", "peak_memory_bytes", "memory_source")},
        "effective_batch": row.effective_batch, "status": "ok"})
    result = bench_in_process(capfd, "cost", str(folder), "--catalog", str(written), "--provider", "gcp")
    assert result.returncode == 0, result.stderr
    lines = read_rows(folder / "cost" / "cost.csv")
    (a2,) = [r for r in lines if r["instance"] == "a2-highgpu-8g" and r["price_observed"] == "2026-11-30"]
    assert float(a2["usd_per_hour"]) == pytest.approx(29.38708) and a2["status"] == "priced"
    assert "STALE PRICES" in result.stdout  # the built-in GCP prices of 2024-09 stay current beside the import
