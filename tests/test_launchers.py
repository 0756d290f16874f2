"""Launch files: the world split into nodes, each form's exact fields, and one clean sentence
for what cannot be launched."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from export_plans import llm_profile, make_plan
from fixtures.cli import run, run_ok

from planner import io
from planner.emit import launchers
from planner.errors import UserError


@pytest.fixture()
def plan_file(tmp_path):
    profile = llm_profile()
    io.save_profile(profile, tmp_path / "llm.json")
    plan = make_plan(profile, tmp_path / "llm.json", [4, 3, 3], {"layers.2"})
    io.save_plan(plan, tmp_path / "plan.yaml")
    return tmp_path / "plan.yaml"


def test_world_over_nodes_and_each_form(plan_file):
    plan = io.load_plan(plan_file)
    launch = launchers.launch_for(plan, plan_file, tp=4, gpus_per_node=4, entry=("train.py", "--x", "a b"))
    assert (launch.num_nodes, launch.gpus_per_node) == (3, 4)  # 3 stages x dp 1 x tp 4 = 12 GPUs
    lines = launchers.torchrun_lines(launch)
    assert lines.count("torchrun --nnodes 3 --nproc-per-node 4 --node-rank") == 3
    assert "--node-rank 2 --master-port 29500" in lines and "train.py --x 'a b'" in lines
    slurm = launchers.slurm_script(launch)
    assert "#SBATCH --nodes=3\n" in slurm and "#SBATCH --gpus-per-node=4\n" in slurm
    job = yaml.safe_load(launchers.trainjob(launch))
    assert job["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and job["spec"]["runtimeRef"]["name"] == "torch-distributed"
    assert job["spec"]["trainer"] | {"image": None} == {
        "image": None, "command": ["torchrun"], "args": ["train.py", "--x", "a b"], "numNodes": 3,
        "numProcPerNode": 4, "resourcesPerNode": {"limits": {"nvidia.com/gpu": 4}}}


def test_a_partial_node_is_refused(plan_file):
    with pytest.raises(UserError, match="whole number of nodes"):
        launchers.launch_for(io.load_plan(plan_file), plan_file, tp=1, gpus_per_node=2, entry=("x",))


def test_job_names_are_dns_labels():
    assert launchers.job_name("Plan_405B.v2") == "plan-405b-v2"
    assert launchers.job_name("$$$") == "ckplan-job"
    assert len(launchers.job_name("a" * 100)) == 63


def test_ckplan_runtime_runs_ckplan_launch_under_torchrun(plan_file):
    plan = io.load_plan(plan_file)
    launch = launchers.launch_for(plan, plan_file, tp=1, gpus_per_node=8, entry=None)
    assert launch.entry == ("-m", "planner.cli", "launch", str(plan_file)) and launch.num_nodes == 1


def test_export_cli_writes_each_form_and_refuses_strays(plan_file):
    for target, suffix in (("torchrun", "torchrun.sh"), ("slurm", "slurm.sh"), ("kubernetes", "trainjob.yaml")):
        run_ok("export", plan_file, "--to", target)
        assert (plan_file.parent / f"plan.{suffix}").is_file()
    result = run("export", plan_file, "--to", "torchrun", "--image", "x")
    assert result.exit_code == 1 and "--image" in result.output
    result = run("export", plan_file, "--to", "megatron", "--entry", "x")
    assert result.exit_code == 1 and "--entry applies to --to torchrun" in result.output
    result = run("export", plan_file, "--to", "slurm", "--entry", "'unclosed")
    assert result.exit_code == 1 and "--entry" in result.output


def test_search_writes_launch_files(tmp_path):
    config = _tiny_config(tmp_path)
    out = tmp_path / "best.yaml"
    run_ok("search", "--arch-config", config, "--gpus", "16", "--gpus-per-node", "8", "--global-batch", "16",
           "--seq-len", "512", "--runtime", "torchtitan", "--out", out, "--launch-files", tmp_path / "launch")
    written = sorted(p.name for p in (tmp_path / "launch").iterdir())
    assert written == ["best.slurm.sh", "best.torchrun.sh", "best.trainjob.yaml"]
    job = yaml.safe_load((tmp_path / "launch" / "best.trainjob.yaml").read_text())
    assert job["spec"]["trainer"]["numNodes"] * job["spec"]["trainer"]["numProcPerNode"] == 16


def _tiny_config(tmp_path: Path, **sizes) -> Path:
    """A small LLaMA-style config.json (sizes override its dimensions)."""
    import json

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 512, "intermediate_size": 1408,
                                "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
                                "vocab_size": 8000, "tie_word_embeddings": False, "max_position_embeddings": 4096,
                                "rms_norm_eps": 1e-5, "rope_theta": 10000.0} | sizes))
    return path


def test_a_torchtitan_launch_says_when_its_toml_is_not_written(tmp_path):
    """The default entry runs torchtitan.train on PLAN.torchtitan.toml, the 0.2 export's name;
    `export --to torchtitan` writes 0.3's Python config by default, so the torchrun line named a
    file that was never written, unsaid."""
    profile = llm_profile()
    io.save_profile(profile, tmp_path / "llm.json")
    io.save_plan(make_plan(profile, tmp_path / "llm.json", [4, 3, 3], set(), runtime="torchtitan"),
                 tmp_path / "plan.yaml")
    said = run_ok("export", tmp_path / "plan.yaml", "--to", "torchrun").output
    assert "plan.torchtitan.toml, which does not exist yet" in " ".join(said.split())
    run_ok("export", tmp_path / "plan.yaml", "--to", "torchtitan", "--torchtitan-version", "0.2.2")
    assert (tmp_path / "plan.torchtitan.toml").exists()
    said = run_ok("export", tmp_path / "plan.yaml", "--to", "torchrun", "--out", tmp_path / "again.sh").output
    assert "does not exist yet" not in said
    said = run_ok("export", tmp_path / "plan.yaml", "--to", "slurm", "--entry", "-m torchtitan.train --module m").output
    assert "does not exist yet" not in said
