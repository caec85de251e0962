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

from bench.planner.ranking import Option, Plan
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


RUN_NEEDS = ("bench", "pyproject.toml", "constraints.txt")
"""What the task installs from the archive: uncommitted changes here would not reach the cluster."""
STARTUP_MINUTES_SHOWN = 10
"""The task header prices this many minutes of the instance's time for what is not predicted (provisioning,
setup, start-up), so a reader can scale it; it is not a prediction."""


@dataclass(frozen=True)
class LaunchFiles:
    task: Path
    grid: Path
    source: Path
    commit: str
    measurement: str = ""
    """The predicted cost of the measurement run itself, in one sentence (`measurement_cost`)."""


def write_launch_spec(plan: Plan, path: Path, model_fields: dict[str, object] | None = None) -> LaunchFiles:
    """Write the task, its grid and the source archive for the plan's first (cheapest) option.
    `model_fields`: the cells' model options away from their defaults (model_kwargs, in_chans, ...).

    Refused (`OptionError`, one line naming the file) when the model's code is not committed, or a file the run
    installs (`RUN_NEEDS`, the model's code) has uncommitted changes: the archive holds the commit alone."""
    if not plan.options:
        raise OptionError("--launch-spec: the plan has no option to launch")
    option = plan.options[0]
    commit = _commit()
    model = committed_model(plan.request.model)
    path = path.resolve()
    files = LaunchFiles(task=path, grid=path.with_suffix(".toml"), source=path.with_suffix(".src.tar.gz"),
                        commit=commit, measurement=measurement_cost(option))
    path.parent.mkdir(parents=True, exist_ok=True)
    files.grid.write_text(grid_text(plan, option, model_fields or {}, model))
    subprocess.run(["git", "archive", "--format=tar.gz", f"--output={files.source}", commit, "--", ".",
                    ":(exclude)results"], cwd=REPO, check=True, capture_output=True)
    files.task.write_text(task_yaml(option, files, grid_name(plan)))
    return files


def committed_model(model: str) -> str:
    """The model reference the cluster's grid names: a timm or hf-hub name as given; a code file by its path in
    the repository (the task runs from the unpacked archive's root, and bench reads a relative path from there).
    Refuses code outside the repository, not committed, or changed since the commit, and a dirty `RUN_NEEDS`."""
    from bench.grid.model_ref import kind_of

    kind = kind_of(model)
    needed = list(RUN_NEEDS)
    name = model
    if kind in ("file", "module"):
        source = _code_file(model)
        try:
            relative = source.relative_to(REPO).as_posix()
        except ValueError:
            raise OptionError(f"--launch-spec: {source}: the model's code is outside the repository {REPO}, so the "
                              "task's archive cannot carry it; move it into the repository and commit it") from None
        if not _git("ls-files", "--error-unmatch", "--", relative, check=False):
            raise OptionError(f"--launch-spec: {relative}: the model's code is not committed, so the task's archive "
                              f"would not carry it; commit it (git add {shlex.quote(relative)} && git commit)")
        needed.append(relative)
        if kind == "file":
            name = f"{relative}:{model.rsplit(':', 1)[1]}"
    dirty = _git("status", "--porcelain", "--untracked-files=all", "--", *needed).splitlines()
    if dirty:
        changed = dirty[0][3:].split(" -> ")[-1]
        raise OptionError(f"--launch-spec: {changed}: uncommitted changes in a file the run needs (the task installs "
                          f"the commit {_commit()[:12]}); commit or stash them"
                          + (f" ({len(dirty) - 1} more)" if len(dirty) > 1 else ""))
    return name


def _code_file(model: str) -> Path:
    """The file a code reference's factory lives in (a module path: its module's file, as found here)."""
    import importlib.util

    from bench.grid.model_ref import cwd_importable, kind_of

    target = model.rsplit(":", 1)[0]
    if kind_of(model) == "file":
        return Path(target).resolve()
    cwd_importable()
    spec = importlib.util.find_spec(target)
    if spec is None or not spec.origin:
        raise OptionError(f"--launch-spec: {target}: no module file to carry to the cluster")
    origin = Path(spec.origin).resolve()
    expected = REPO.joinpath(*target.split("."))
    if origin not in (expected.with_suffix(".py"), expected / "__init__.py"):
        raise OptionError(f"--launch-spec: {origin}: module {target} is found here, but not as {target.replace('.', '/')}"
                          f".py under the repository root, where the task looks for it; name the file instead "
                          f"(path/to/file.py:factory)")
    return origin


def measurement_cost(option: Option) -> str:
    """The predicted cost of the measurement run itself: the cell's warm-up and timed steps at the option's
    predicted step time (at most the grid's timing budget), and the price of each further stretch the instance is
    up for what is not predicted (provisioning, setup, start-up)."""
    from bench.grid.spec import RunSettings

    settings = RunSettings()
    row = option.line.row
    step_s = row.micro_batch * option.accum_steps_per_gpu / option.line.samples_per_s_per_gpu
    steps = settings.warmup_steps + settings.measured_steps
    low_s = steps * step_s
    high_s = settings.warmup_steps * step_s + max(settings.timing_budget_s, settings.measured_steps * step_s)
    usd_per_s = option.usd_per_hour / 3600
    return (f"measuring it: {steps} steps at the predicted {step_s:.2f} s each, up to the grid's "
            f"{settings.timing_budget_s:g} s timing budget: {low_s:,.0f}-{high_s:,.0f} s, "
            f"${low_s * usd_per_s:,.2f}-{high_s * usd_per_s:,.2f} at ${option.usd_per_hour:,.2f}/h "
            f"({option.usd_basis}); provisioning, setup and start-up are not predicted: "
            f"${STARTUP_MINUTES_SHOWN * 60 * usd_per_s:,.2f} per {STARTUP_MINUTES_SHOWN} minutes of them")


def _git(*args: str, check: bool = True) -> str:
    """git's output in the repository ("" when `check` is off and git fails)."""
    done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
    if done.returncode and check:
        raise OptionError(f"--launch-spec: {REPO}: git {args[0]} failed: {done.stderr.strip().splitlines()[-1:]}")
    return done.stdout if done.returncode == 0 else ""


def grid_name(plan: Plan) -> str:
    """The experiment (and results folder) the launched cells are measured under: `launch-<model>`."""
    model = "".join(c if c.isalnum() or c in "_-" else "_" for c in plan.request.model)
    return f"launch-{model}"[:64]


def grid_text(plan: Plan, option: Option, model_fields: dict[str, object], model: str | None = None) -> str:
    """The grid file of one option: one cell, at the plan's image size (224 when no row gave one). `model`: the
    reference as the cluster names it (`committed_model`; default the plan's).

    channels_last is on: the plan's predicted rows trace it so (`bench.planner.search.PlanCandidates`)."""
    row = option.line.row
    model = model or plan.request.model
    code = ":" in model and not model.startswith("hf-hub:")
    extra = "".join(f"{name} = [{json.dumps(value)}]\n" for name, value in model_fields.items())
    return (f"# Written by bench plan --launch-spec: {option.line.instance.label}, {option.configuration}\n"
            f"[experiment]\nname = {json.dumps(grid_name(plan))}\n"
            f"description = {json.dumps(f'the plan option measured on {option.line.instance.label}')}\n"
            + ("runs_model_code = true  # the model was named as code on the command line\n" if code else "")
            + f"\n[grid]\nmodel = [{json.dumps(model)}]\nimage_size = [{row.image_size}]\n"
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
              + (f"# {files.measurement}.\n" if files.measurement else "") +
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
