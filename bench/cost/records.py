"""One priced line as one row: the columns of cost.csv (`COLUMNS`), the row (`record`), the same in `bench cost`'s
and `bench plan`'s JSON and in `CostTable.to_frame()`; and the cores the line's instance needs to feed its GPUs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bench.cost.feeding import Feeding, LoaderCost, feeding, loader_cost_for
from bench.units import GIB

if TYPE_CHECKING:
    from bench.cost.price import CostLine

# The header of cost.csv comes from this list. Units are in the names.
COLUMNS: dict[str, str] = {
    "experiment": "", "cell_id": "the measured row", "model": "", "image_size": "pixels, as measured",
    "strategy": "micro_batch x accum_steps, precision, checkpointing, optimizer; then axis=value for any other axis "
                "the priced rows differ in (channels_last=True ...)",
    "micro_batch": "per GPU", "accum_steps_per_gpu": "micro-steps each GPU runs per optimizer step on this line",
    "effective_batch_per_gpu": "micro_batch x accum_steps_per_gpu",
    "measured_accum_steps": "the row's accumulation, as measured (differs from accum_steps_per_gpu where a plan "
                            "re-splits the effective batch over the instance's GPUs)",
    "precision": "", "checkpointing": "", "optimizer": "",
    "profile": "cuda or cpu (a CPU-profile row was measured at reduced size on a CPU)",
    "measured_device": "device_name of the row",
    "provider": "", "instance": "", "region": "", "gpu": "", "gpu_count": "",
    "global_batch": "effective_batch_per_gpu x gpu_count: samples per optimizer step across the instance",
    "status": "priced | does_not_fit | no_peak (no datasheet peak for the precision) | no_mfu",
    "basis": "measured | projected_by_model (measured x the model's ratio between the GPUs) | projected_from_gpu "
             "(measured MFU carried over) | projected_from_cpu_profile | predicted (the throughput model)",
    "note": "how the speed is known and what it assumes, or why the line is not priced",
    "samples_per_s_per_gpu": "measured; measured x the model's predicted ratio of this GPU to the measuring one; "
                             "MFU x the GPU's peak / model FLOPs per sample; or predicted",
    "samples_per_s_per_gpu_low": "the p10-p90 range of a predicted or projected speed's validated cross-GPU error "
                                 "(docs/speed/validation.md), or a measured speed's 95 % interval of its median "
                                 "step; empty where neither is known (a CPU-profile projection)",
    "samples_per_s_per_gpu_high": "",
    "samples_per_s_instance": "per GPU x GPUs x scaling efficiency (GPUs > 1)",
    "scaling_efficiency": "the efficiency used on a multi-GPU instance; empty on one GPU",
    "scaling_basis": "measured with N processes on a device (a DDP row of the configuration) | assumed",
    "memory_basis": "which peak the fit uses",
    "peak_memory_gib": "that peak, GiB (2**30 bytes)",
    "required_memory_gib": "peak x (1 + headroom)",
    "gpu_memory_gib": "the GPU's nominal memory",
    "samples_per_run": "dataset_size x epochs",
    "hours_per_run": "", "usd_per_hour": "on-demand, whole instance", "usd_per_run": "on-demand",
    "usd_per_run_low": "on-demand at samples_per_s_per_gpu_high",
    "usd_per_run_high": "on-demand at samples_per_s_per_gpu_low",
    "spot_usd_per_hour": "empty if unknown", "spot_usd_per_run": "empty if unknown",
    "price_observed": "when the price was seen", "price_valid_until": "empty: the current price",
    "price_source": "",
    "loader_cpu_ms_per_sample": "the loader's CPU time per sample used for feeding (loader rows); empty without them",
    "cores_to_feed_per_gpu": "samples_per_s_per_gpu x loader_cpu_ms_per_sample / 1000: cores decoding for one GPU",
    "vcpus_needed": "gpu_count x (cores_to_feed_per_gpu + 1 for the training process), rounded up",
    "instance_vcpus": "the catalog's vCPUs of the instance; empty if unknown",
    "vcpus_feed_gpus": "true when instance_vcpus >= vcpus_needed; empty when either is unknown",
    "feeding_basis": "how the loader's CPU cost was measured (rows, workers, image size, host CPU)",
}


def line_feeding(line: CostLine, costs: list[LoaderCost]) -> tuple[Feeding, LoaderCost, str] | None:
    """The cores `line`'s instance needs to feed its GPUs at the line's speed; None without a speed or loader rows."""
    found = loader_cost_for(costs, line.row.image_size)
    if found is None or line.samples_per_s_per_gpu is None:
        return None
    cost, note = found
    return feeding(line.samples_per_s_per_gpu, line.instance.gpu_count, line.instance.vcpus, cost), cost, note


def record(line: CostLine, samples_per_run: float, loader_costs: list[LoaderCost] | None = None, *,
           strategy: str) -> dict[str, object]:
    """One cost.csv row; `strategy` is the row's label in its table (`CostTable.strategy`)."""
    row, instance, cost = line.row, line.instance, line.cost
    peak_bytes, _ = row.memory_peak()
    fed = line_feeding(line, loader_costs or [])
    return {
        "experiment": row.experiment, "cell_id": row.cell_id, "model": row.model, "image_size": row.image_size,
        "strategy": strategy, "micro_batch": row.micro_batch, "accum_steps_per_gpu": line.accum_steps,
        "effective_batch_per_gpu": row.micro_batch * line.accum_steps, "measured_accum_steps": row.accum_steps,
        "precision": row.precision, "checkpointing": row.checkpointing,
        "optimizer": row.optimizer, "profile": row.profile, "measured_device": row.device_name,
        "provider": instance.provider, "instance": instance.instance, "region": instance.region,
        "gpu": instance.gpu, "gpu_count": instance.gpu_count, "global_batch": line.global_batch,
        "status": line.status, "basis": line.basis, "note": line.note,
        "samples_per_s_per_gpu": line.samples_per_s_per_gpu,
        "samples_per_s_per_gpu_low": line.speed_interval[0] if line.speed_interval else None,
        "samples_per_s_per_gpu_high": line.speed_interval[1] if line.speed_interval else None,
        "samples_per_s_instance": cost.samples_per_s if cost else None,
        "scaling_efficiency": line.scaling.efficiency if line.scaling else None,
        "scaling_basis": line.scaling.basis if line.scaling else None,
        "memory_basis": line.memory_basis, "peak_memory_gib": peak_bytes / GIB,
        "required_memory_gib": line.memory.required_bytes / GIB, "gpu_memory_gib": line.memory.capacity_bytes / GIB,
        "samples_per_run": samples_per_run, "hours_per_run": cost.hours_per_run if cost else None,
        "usd_per_hour": instance.usd_per_hour, "usd_per_run": cost.usd_per_run if cost else None,
        **_usd_range(line),
        "spot_usd_per_hour": instance.spot_usd_per_hour, "spot_usd_per_run": cost.spot_usd_per_run if cost else None,
        "price_observed": instance.observed, "price_valid_until": instance.valid_until,
        "price_source": instance.source,
        "loader_cpu_ms_per_sample": fed[1].cpu_ms_per_sample if fed else None,
        "cores_to_feed_per_gpu": fed[0].cores_per_gpu if fed else None,
        "vcpus_needed": fed[0].vcpus_needed if fed else None, "instance_vcpus": instance.vcpus,
        "vcpus_feed_gpus": fed[0].feeds if fed else None,
        "feeding_basis": fed[1].describe() + fed[2] if fed else None,
    }


def _usd_range(line: CostLine) -> dict[str, float | None]:
    """The run's on-demand dollars at the ends of the line's speed interval."""
    usd = line.over_speed_range(line.cost.usd_per_run) if line.cost else None
    return {"usd_per_run_low": usd[0] if usd else None, "usd_per_run_high": usd[1] if usd else None}
