"""From a plan to a rented GPU: a SkyPilot task (YAML) that measures the chosen option at its real size.

`bench plan ... --launch-spec FILE` writes three files: FILE, the task; beside it `<stem>.toml`, the grid of the
chosen option (its micro-batch x accumulation, precision, checkpointing and optimizer, at the plan's image size);
and `<stem>.src.tar.gz`, this repository at the current commit (`git archive`: committed files only, results/
left out). The task asks for the instance's accelerator, count and cloud; its setup unpacks and installs the
archive (with the constraints file); its run is `bench run` of the grid, on every GPU of the instance, into a
results folder that stays on the cluster to be copied back (docs/cloud.md walks the round trip).
"""

from __future__ import annotations

import json
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bench.cost.plan import Option, Plan
from bench.errors import OptionError

REPO = Path(__file__).resolve().parents[2]
REMOTE_DIR = "~/bench-launch"
"""Where the task's files are mounted and the repository unpacked, on the cluster."""
REMOTE_GRID = "grid.toml"
REMOTE_SOURCE = "src.tar.gz"
"""The names of the grid and the archive on the cluster, whatever they are called here."""
SKYPILOT_ACCELERATORS = {
    "A100-40GB": "A100", "A100-80GB": "A100-80GB", "H100-80GB": "H100", "H100-NVL": "H100-NVL", "H200": "H200",
    "B200": "B200", "L4": "L4", "L40S": "L40S", "L40": "L40", "A10G": "A10G", "A10": "A10", "T4": "T4",
    "V100-16GB": "V100", "RTX-3090": "RTX3090", "RTX-4090": "RTX4090", "A100-80GB-PCIe": "A100-80GB",
    "H100-PCIe": "H100",
}
"""bench's GPU key -> SkyPilot's accelerator name (the inverse of `bench.cost.skypilot.GPU_KEYS`; RunPod's
PCIe cards go by the SXM names there)."""
SKYPILOT_CLOUDS = ("aws", "gcp", "azure", "lambda", "runpod", "oci", "paperspace", "fluidstack", "cudo", "vast",
                   "nebius", "do", "hyperbolic", "kubernetes")
"""Catalog providers SkyPilot launches on; another provider's option gets a task without `cloud`."""


@dataclass(frozen=True)
class LaunchFiles:
    task: Path
    grid: Path
    source: Path
    commit: str


def write_launch_spec(plan: Plan, path: Path, model_fields: dict[str, object] | None = None) -> LaunchFiles:
    """Write the task, its grid and the source archive for the plan's first (cheapest) option.
    `model_fields`: the cells' model options away from their defaults (model_kwargs, in_chans, ...)."""
    if not plan.options:
        raise OptionError("--launch-spec: the plan has no option to launch")
    option = plan.options[0]
    commit = _commit()
    path = path.resolve()
    files = LaunchFiles(task=path, grid=path.with_suffix(".toml"), source=path.with_suffix(".src.tar.gz"),
                        commit=commit)
    path.parent.mkdir(parents=True, exist_ok=True)
    files.grid.write_text(grid_text(plan, option, model_fields or {}))
    subprocess.run(["git", "archive", "--format=tar.gz", f"--output={files.source}", commit, "--", ".",
                    ":(exclude)results"], cwd=REPO, check=True, capture_output=True)
    files.task.write_text(task_yaml(option, files, grid_name(plan)))
    return files


def grid_name(plan: Plan) -> str:
    """The experiment (and results folder) the launched cells are measured under: `launch-<model>`."""
    model = "".join(c if c.isalnum() or c in "_-" else "_" for c in plan.request.model)
    return f"launch-{model}"[:64]


def grid_text(plan: Plan, option: Option, model_fields: dict[str, object]) -> str:
    """The grid file of one option: one cell, at the plan's image size (224 when no row gave one).

    channels_last is on: the plan's predicted rows trace it so (`bench.speed.predict.PlanCandidates`)."""
    row = option.line.row
    code = ":" in plan.request.model and not plan.request.model.startswith("hf-hub:")
    extra = "".join(f"{name} = [{json.dumps(value)}]\n" for name, value in model_fields.items())
    return (f"# Written by bench plan --launch-spec: {option.line.instance.label}, {option.configuration}\n"
            f"[experiment]\nname = {json.dumps(grid_name(plan))}\n"
            f"description = {json.dumps(f'the plan option measured on {option.line.instance.label}')}\n"
            + ("runs_model_code = true  # the model was named as code on the command line\n" if code else "")
            + f"\n[grid]\nmodel = [{json.dumps(plan.request.model)}]\nimage_size = [{row.image_size}]\n"
            f"effective_batch = {row.micro_batch * option.accum_steps_per_gpu}\n"
            f"pairs = [[{row.micro_batch}, {option.accum_steps_per_gpu}]]\n"
            f"precision = [{json.dumps(row.precision)}]\ncheckpointing = [{json.dumps(row.checkpointing)}]\n"
            f"optimizer = [{json.dumps(row.optimizer)}]\nchannels_last = [true]\n{extra}")


def task_yaml(option: Option, files: LaunchFiles, experiment: str) -> str:
    """The SkyPilot task: resources from the option's instance, setup from the archive, run = bench run."""
    import yaml

    instance = option.line.instance
    accelerator = SKYPILOT_ACCELERATORS.get(instance.gpu)
    if accelerator is None:
        raise OptionError(f"--launch-spec: no SkyPilot accelerator name for GPU {instance.gpu}; known: "
                          f"{', '.join(SKYPILOT_ACCELERATORS)}")
    resources: dict[str, object] = {"accelerators": f"{accelerator}:{instance.gpu_count}", "use_spot": option.spot}
    if instance.provider in SKYPILOT_CLOUDS:
        resources["cloud"] = instance.provider
        if instance.region != "all":
            resources["region"] = instance.region
    nproc = f" --nproc {instance.gpu_count}" if instance.gpu_count > 1 else ""
    # The cluster's copies have fixed names: the local file names (any text a user typed) never reach its shell.
    task = {
        "name": experiment,
        "resources": resources,
        "envs": {"BENCH_COMMIT": files.commit},
        "file_mounts": {f"{REMOTE_DIR}/{REMOTE_GRID}": str(files.grid),
                        f"{REMOTE_DIR}/{REMOTE_SOURCE}": str(files.source)},
        "setup": (f"set -e\nmkdir -p {REMOTE_DIR}/src && tar -xzf {REMOTE_DIR}/{REMOTE_SOURCE} -C {REMOTE_DIR}/src\n"
                  f"cd {REMOTE_DIR}/src && python3 -m venv .venv\n"
                  ".venv/bin/pip install --quiet -e . $(test -f constraints.txt && echo -c constraints.txt)\n"),
        "run": (f"set -e\ncd {REMOTE_DIR}/src\n"
                f".venv/bin/bench run {REMOTE_DIR}/{REMOTE_GRID} --results {REMOTE_DIR}/results{nproc}\n"),
    }
    header = (f"# SkyPilot task written by bench plan --launch-spec (bench commit {files.commit[:12]}):\n"
              f"# {instance.label}, {option.configuration}, ${option.usd_per_run:.2f} per run "
              f"({option.usd_basis}, {option.evidence}).\n"
              f"# sky launch -c bench {shlex.quote(files.task.name)}; then rsync -Pavz bench:{REMOTE_DIR}/results/ results/\n")
    return header + yaml.dump(task, Dumper=_literal_blocks(), sort_keys=False, width=120)


def _literal_blocks():
    import yaml

    class ScriptsAsBlocks(yaml.SafeDumper):
        """Multi-line strings (setup, run) as `|` blocks, as SkyPilot's examples write them."""

    def script(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
        return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)

    ScriptsAsBlocks.add_representer(str, script)
    return ScriptsAsBlocks


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        raise OptionError(f"--launch-spec: {REPO} is not a git checkout; the task installs the repository at a "
                          "commit") from None
