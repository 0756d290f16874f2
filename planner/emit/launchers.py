"""How to start a plan across machines: a `torchrun` line per node, a Slurm batch script, and a
Kubernetes training job (Kubeflow Trainer's TrainJob). Every value is typed here and quoted
where it lands (shlex for the shells, the YAML dumper for the manifest), so a hostile plan path
or job name stays one argument.

Sources:
- torchrun: torch/distributed/run.py (torch 2.x): --nnodes, --nproc-per-node, --node-rank,
  --master-addr, --master-port; --rdzv-backend c10d with --rdzv-endpoint and --rdzv-id; every
  option also read from a PET_-prefixed environment variable (torch.distributed.argparse_util.env).
- Slurm: sbatch's --nodes, --ntasks-per-node, --gpus-per-node, --exclusive; srun starts one task
  per node; `scontrol show hostnames "$SLURM_JOB_NODELIST"` lists the nodes (its first the
  rendezvous host), as torchtitan's multinode_trainer.slurm does.
- Kubernetes: kubeflow/trainer pkg/apis/trainer/v1alpha1/trainjob_types.go (0015772c): TrainJob
  (trainer.kubeflow.org/v1alpha1) spec.runtimeRef {name, apiGroup, kind} (the ClusterTrainingRuntime
  "torch-distributed" installed with the trainer) and spec.trainer {image, command, args, numNodes,
  numProcPerNode, resourcesPerNode}; the torch plugin sets PET_NNODES, PET_NPROC_PER_NODE,
  PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT, which torchrun reads; spec.trainer.env (a list
  of {name, value}, merged with the runtime's trainer environment: the Trainer model of Kubeflow
  Trainer's Python API, TrainerV1alpha1Trainer).
- torchtitan's trainer, as its own run_train.sh starts it: 0.2.x `PYTORCH_ALLOC_CONF=
  "expandable_segments:True" torchrun ... -m torchtitan.train --job.config_file CONFIG_FILE`
  (run_train.sh at v0.2.2); 0.3.0 and main `PYTORCH_ALLOC_CONF="expandable_segments:True" torchrun
  ... -m torchtitan.train --module MODULE --config CONFIG` (run_train.sh since 9810191bb, 2026-02-23,
  unchanged to b5bcd76c; the 0.3.0 release is main after 5ab3a0fd1, which has it). ConfigManager
  imports MODULE by name (config/manager.py 99-131 at b5bcd76c and in the 0.3.0 wheel), so the
  export's folder goes first on PYTHONPATH. The expandable segments are set where the plan's reserve
  was replayed under them (stated, or one node as run_train.sh; across nodes torchtitan's
  multinode_trainer.slurm sets none, and the plan was scored so): the launch runs what was predicted.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

from planner.cost import reserve_fsdp2
from planner.emit import titan_keys
from planner.emit.rounding import one_line
from planner.errors import UserError

MASTER_PORT = 29500
TRAINER_API = "trainer.kubeflow.org/v1alpha1"
TORCH_RUNTIME = "torch-distributed"
IMAGE_PLACEHOLDER = "REPLACE-WITH-YOUR-TRAINING-IMAGE"
TARGETS = ("torchrun", "slurm", "kubernetes")
SUFFIX = {"torchrun": ".torchrun.sh", "slurm": ".slurm.sh", "kubernetes": ".trainjob.yaml"}


@dataclass(frozen=True)
class Launch:
    """What every launcher writes from: the world and what each process runs."""

    name: str  # the job's name (a DNS-1123 label where Kubernetes reads it)
    num_nodes: int
    gpus_per_node: int
    entry: tuple[str, ...]  # torchrun's program and its arguments: ("-m", "planner.cli", "launch", "plan.yaml")
    gpu_resource: str = "nvidia.com/gpu"  # the device plugin's resource name
    image: str = IMAGE_PLACEHOLDER
    env: tuple[tuple[str, str], ...] = ()  # set for every process; PYTHONPATH goes before the caller's
    # hosts a block of one NVLink domain holds as the plan was scored (CommSetup.nvlink_domain over the host): Slurm's
    # --segment places the job's nodes so; 1: each host its own domain, nothing to place
    domain_hosts: int = 1

    def __post_init__(self):
        if self.num_nodes < 1 or self.gpus_per_node < 1:
            raise UserError("a launch needs at least one node of at least one GPU")
        if not self.entry:
            raise UserError("a launch needs the program each process runs")


def world_size(plan) -> int:
    """GPUs the plan runs on: pipeline stages x data-parallel replicas x the profile's tensor
    parallelism (recorded by analytic profiles)."""
    return plan.setup.pipeline.stages * plan.setup.data_parallel.dp


def launch_for(plan, plan_path: Path, *, tp: int, gpus_per_node: int, entry: tuple[str, ...] | None,
               framework: str | None = None, image: str | None = None, gpu_name: str = "",
               torchtitan_version: str | None = None) -> Launch:
    """The Launch of a plan: its world (stages x dp x tp) over nodes of `gpus_per_node`, each
    process running `entry` (default: ckplan's own runtime for a plan it launches, torchtitan's
    trainer on the plan's torchtitan export of `torchtitan_version`; other frameworks need --entry)."""
    world = world_size(plan) * tp
    per_node = min(gpus_per_node, world)
    if world % per_node:
        raise UserError(f"the plan runs on {world} GPUs, not a whole number of nodes of {per_node}; "
                        "give --gpus-per-node dividing it")
    framework = framework or plan.setup.training.runtime
    if entry is None and framework == "ckplan" and plan.profile_source == "analytic":
        raise UserError("an analytic plan is exported, not run by ckplan's runtime: plan it for the framework that "
                        "runs it (--runtime torchtitan), or say what each process runs with --entry")
    check_torchtitan_version(torchtitan_version, framework=framework, entry=entry)
    env: tuple[tuple[str, str], ...] = ()
    if entry is None:
        entry, env = default_entry(framework, plan_path, torchtitan_version)
    if framework == "torchtitan" and not reserve_fsdp2.launch_sets_expandable(plan.setup, job_gpus=world,
                                                                               gpus_per_node=gpus_per_node):
        env = tuple((name, value) for name, value in env if name != "PYTORCH_ALLOC_CONF")
    training = plan.setup.training  # NCCL's settings the plan was scored with, in every process's environment
    env += (("NCCL_ALGO", "Ring"), ("NCCL_PROTO", "simple")) if training.nccl_ring_simple else ()
    env += (("NCCL_NVLS_ENABLE", "0"),) if training.nccl_nvls_off else ()
    resource = "amd.com/gpu" if gpu_name.lower().startswith("mi") else "nvidia.com/gpu"
    domain = plan.setup.comm.nvlink_domain or per_node  # the NVLink domain the links were placed by
    hosts = min(domain, world) // per_node if domain % per_node == 0 else 1
    return Launch(name=job_name(plan_path.stem), num_nodes=world // per_node, gpus_per_node=per_node,
                  entry=tuple(entry), gpu_resource=resource, image=image or IMAGE_PLACEHOLDER, env=env,
                  domain_hosts=hosts)


def _segment(launch: Launch) -> list[str]:
    """The job's nodes in blocks of one NVLink domain, as the plan was scored: Slurm's --segment (the block topology
    plugin), as Megatron-Bridge's executor asks it of 4-GPU GB200 hosts (scripts/performance/utils/executors.py
    slurm_executor, 023219ed: `segment`); said, not set, where the domain's hosts do not divide the job's."""
    hosts = launch.domain_hosts
    if hosts <= 1:
        return []
    if launch.num_nodes % hosts:
        return [f"# scored with NVLink domains of {hosts} hosts, which do not divide the job's {launch.num_nodes}: "
                "place its nodes so they lie in as few domains as that"]
    return [f"# the plan was scored with NVLink domains of {hosts} hosts: its nodes in blocks of one",
            f"#SBATCH --segment={hosts}"]


def entry_argv(text: str) -> tuple[str, ...]:
    """--entry as the program and its arguments (shlex's words). Each lands quoted as one argument (the module
    docstring), so a shell expansion written in it ("${CKPLAN_MEGATRON_ARGS[@]}", $VAR, `cmd`) would reach the
    program as its text, never expanded: refused, naming the word."""
    try:
        argv = tuple(shlex.split(text))
    except ValueError as exc:
        raise UserError(f"--entry {text!r}: {exc}") from exc
    expanded = next((arg for arg in argv if "$" in arg or "`" in arg), None)
    if expanded is not None:
        raise UserError(f"--entry: {expanded!r} would reach the program as that text, not expanded: the launch file "
                        "quotes each word of the entry as one argument, which no shell expands; give the arguments "
                        "themselves (a Megatron-LM export's CKPLAN_MEGATRON_ARGS written out)")
    return argv


def check_torchtitan_version(version: str | None, *, framework: str, entry: tuple[str, ...] | None) -> None:
    """--torchtitan-version chooses the trainer of a torchtitan plan's default entry: refused
    beside --entry or for another runtime, and read as a version ckplan knows."""
    if version is None:
        return
    if entry is not None or framework != "torchtitan":
        raise UserError("--torchtitan-version says which torchtitan trainer a torchtitan plan's launch file runs; "
                        + ("with --entry you name what runs yourself: drop one of them" if entry is not None else
                           f"this plan runs on {framework}'s runtime: drop it"))
    titan_keys.parse(version)


def default_entry(framework: str, plan_path: Path, torchtitan_version: str | None = None
                  ) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """(what each process runs, the environment it runs in) for a framework ckplan knows."""
    if framework == "ckplan":  # `ckplan launch` joins the ranks torchrun started (runtime/launcher.py)
        return ("-m", "planner.cli", "launch", str(plan_path)), ()
    if framework == "torchtitan":
        return torchtitan_entry(plan_path, torchtitan_version)
    raise UserError(f"say what each {framework} process runs with --entry (e.g. --entry 'pretrain_gpt.py ...'): "
                    "ckplan knows the entry of its own runtime and of torchtitan only")


def torchtitan_entry(plan_path: Path, version: str | None = None
                     ) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """torchtitan's trainer on the file `export --to torchtitan --torchtitan-version VERSION` writes
    beside the plan, as run_train.sh of that version starts it (module docstring)."""
    from planner.emit import torchtitan

    version = version or titan_keys.NEWEST_RELEASE
    export = plan_path.with_name(torchtitan.export_name(plan_path.stem, version))
    env = (("PYTORCH_ALLOC_CONF", "expandable_segments:True"),)
    if not titan_keys.parse(version).python:
        return ("-m", "torchtitan.train", "--job.config_file", str(export)), env
    folder = str(export.parent.resolve())
    if os.pathsep in folder:  # Python splits PYTHONPATH there, with no escape
        raise UserError(f"the plan's folder {folder!r} holds {os.pathsep!r}, which PYTHONPATH cannot carry, and "
                        "torchtitan imports the export from there; move the plan, or give --entry")
    return (("-m", "torchtitan.train", "--module", torchtitan.module_name(plan_path.stem), "--config",
             torchtitan.CONFIG_FUNCTION), env + (("PYTHONPATH", folder),))


def entry_file(launch: Launch) -> Path | None:
    """The export a default torchtitan entry runs: the job TOML, or the module found on its
    PYTHONPATH; None for any other entry."""
    entry = launch.entry
    if entry[:3] == ("-m", "torchtitan.train", "--job.config_file") and len(entry) == 4:
        return Path(entry[3])
    paths = dict(launch.env).get("PYTHONPATH")
    if entry[:3] == ("-m", "torchtitan.train", "--module") and len(entry) == 6 and paths:
        return Path(paths) / (entry[3] + ".py")
    return None


def _exports(launch: Launch) -> list[str]:
    """`export NAME=VALUE` lines, each value one shell word; PYTHONPATH keeps what the caller had after ours."""
    lines = []
    for name, value in launch.env:
        tail = '"${PYTHONPATH:+:$PYTHONPATH}"' if name == "PYTHONPATH" else ""
        lines.append(f"export {name}={shlex.quote(value)}{tail}")
    return lines


def job_name(text: str) -> str:
    """A DNS-1123 label from a file's stem: lower-case letters, digits and '-', at most 63."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:63].strip("-")
    return name or "ckplan-job"


def torchrun_lines(launch: Launch) -> str:
    """One torchrun command per node (static rendezvous on node 0's $MASTER_ADDR)."""
    entry = " ".join(shlex.quote(arg) for arg in launch.entry)
    lines = ["#!/bin/bash", f"# {launch.num_nodes} node(s) x {launch.gpus_per_node} GPUs: run line N on node N; "
             "MASTER_ADDR is node 0's address", "set -euo pipefail", ': "${MASTER_ADDR:?set MASTER_ADDR to node 0}"',
             *_exports(launch)]
    for rank in range(launch.num_nodes):
        args = ["torchrun", "--nnodes", str(launch.num_nodes), "--nproc-per-node", str(launch.gpus_per_node),
                "--node-rank", str(rank), "--master-port", str(MASTER_PORT)]
        lines.append(f"# node {rank}\n" + " ".join(args) + ' --master-addr "$MASTER_ADDR" ' + entry)
    return "\n".join(lines) + "\n"


def slurm_script(launch: Launch) -> str:
    """An sbatch script: one srun task per node, each a torchrun of the node's GPUs, c10d
    rendezvous on the first node."""
    entry = " ".join(shlex.quote(arg) for arg in launch.entry)
    return "\n".join([
        "#!/bin/bash",
        f"#SBATCH --job-name={launch.name}",
        f"#SBATCH --nodes={launch.num_nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={launch.gpus_per_node}",
        "#SBATCH --exclusive",
        *_segment(launch),
        "set -euo pipefail",
        *_exports(launch),  # srun passes the environment on (--export=ALL, its default)
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"srun torchrun --nnodes {launch.num_nodes} --nproc-per-node {launch.gpus_per_node} "
        f'--rdzv-id "$SLURM_JOB_ID" --rdzv-backend c10d --rdzv-endpoint "$head_node:{MASTER_PORT}" {entry}',
    ]) + "\n"


def trainjob(launch: Launch) -> str:
    """Kubeflow Trainer's TrainJob on the torch-distributed runtime."""
    manifest = {
        "apiVersion": TRAINER_API,
        "kind": "TrainJob",
        "metadata": {"name": launch.name},
        "spec": {
            "runtimeRef": {"name": TORCH_RUNTIME, "apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime"},
            "trainer": {
                "image": launch.image,
                "command": ["torchrun"],
                "args": list(launch.entry),
                "numNodes": launch.num_nodes,
                "numProcPerNode": launch.gpus_per_node,
                "resourcesPerNode": {"limits": {launch.gpu_resource: launch.gpus_per_node}},
            } | ({"env": [{"name": name, "value": value} for name, value in launch.env]} if launch.env else {}),
        },
    }
    note = (f"# Kubeflow Trainer TrainJob ({TRAINER_API}); torchrun reads the PET_* variables the torch plugin sets\n"
            + (f"# set spec.trainer.image: {IMAGE_PLACEHOLDER} is a placeholder\n"
               if launch.image == IMAGE_PLACEHOLDER else "")
            + (f"# the image must hold {one_line(str(entry_file(launch)))}, the file each process runs\n"
               if entry_file(launch) else ""))
    return note + yaml.safe_dump(manifest, sort_keys=False)


RENDER = {"torchrun": torchrun_lines, "slurm": slurm_script, "kubernetes": trainjob}


def write_all(plan, plan_path: Path, folder: Path, *, tp: int, gpus_per_node: int, framework: str | None = None,
              entry: tuple[str, ...] | None = None, image: str | None = None,
              torchtitan_version: str | None = None) -> tuple[list[Path], Launch]:
    """The three launch files of a plan in `folder` (STEM.torchrun.sh, STEM.slurm.sh,
    STEM.trainjob.yaml), and the Launch they render."""
    from planner import io

    launch = launch_for(plan, plan_path, tp=tp, gpus_per_node=gpus_per_node, entry=entry,
                        framework=framework, image=image, gpu_name=plan.device.name,
                        torchtitan_version=torchtitan_version)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for target in TARGETS:
        path = folder / (plan_path.stem + SUFFIX[target])
        io.write_atomic(path, RENDER[target](launch))
        written.append(path)
    return written, launch


def missing_export(launch: Launch, plan_path: Path, torchtitan_version: str | None) -> str | None:
    """What to say where a launch runs torchtitan's trainer on an export not written yet (the
    command that writes it), or None."""
    runs = entry_file(launch)
    if runs is None or runs.exists():
        return None
    version = torchtitan_version or titan_keys.NEWEST_RELEASE
    return (f"each process runs torchtitan {version}'s trainer on {runs}, which does not exist yet: `ckplan export "
            f"{plan_path} --to torchtitan --torchtitan-version {version}` writes it there")

