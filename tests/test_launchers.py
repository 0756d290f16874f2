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
    result = run_ok("search", "--arch-config", config, "--gpus", "16", "--gpus-per-node", "8", "--global-batch", "16",
                    "--seq-len", "512", "--runtime", "torchtitan", "--out", out, "--launch-files", tmp_path / "launch",
                    "--torchtitan-version", "0.2.2")
    written = sorted(p.name for p in (tmp_path / "launch").iterdir())
    assert written == ["best.slurm.sh", "best.torchrun.sh", "best.trainjob.yaml"]
    job = yaml.safe_load((tmp_path / "launch" / "best.trainjob.yaml").read_text())
    assert job["spec"]["trainer"]["numNodes"] * job["spec"]["trainer"]["numProcPerNode"] == 16
    # the version's trainer on the version's export, which search does not write: it says how to
    assert job["spec"]["trainer"]["args"][-2:] == ["--job.config_file", str(tmp_path / "best.torchtitan.toml")]
    said = " ".join(result.output.split())
    assert f"`ckplan export {out} --to torchtitan --torchtitan-version 0.2.2` writes it there" in said


@pytest.mark.parametrize("extra, sentence", [
    ([], "give --launch-files DIR or drop it"),
    (["--launch-files", "L", "--torchtitan-version", "9.9"], "not a release ckplan has read"),
    (["--launch-files", "L", "--entry", "train.py"], "with --entry you name what runs yourself"),
    (["--launch-files", "L", "--runtime", "megatron", "--entry", "x"], "with --entry you name what runs yourself"),
])
def test_search_refuses_a_stray_torchtitan_version(tmp_path, extra, sentence):
    args = ["search", "--arch-config", _tiny_config(tmp_path), "--gpus", "8", "--global-batch", "8", "--seq-len",
            "512", "--out", tmp_path / "best.yaml", "--torchtitan-version", "main"]
    result = run(*args, *(["--runtime", "torchtitan"] if "--runtime" not in extra else []), *extra)
    assert result.exit_code != 0 and sentence in " ".join(result.output.split())
    assert not (tmp_path / "best.yaml").exists()


def _tiny_config(tmp_path: Path, **sizes) -> Path:
    """A small LLaMA-style config.json (sizes override its dimensions)."""
    import json

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 512, "intermediate_size": 1408,
                                "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
                                "vocab_size": 8000, "tie_word_embeddings": False, "max_position_embeddings": 4096,
                                "rms_norm_eps": 1e-5, "rope_theta": 10000.0} | sizes))
    return path


def _titan_plan(folder: Path, stem: str = "my-plan.v2") -> Path:
    """A torchtitan plan of 3 stages saved as folder/STEM.yaml (a stem with a dash and dots)."""
    folder.mkdir(parents=True, exist_ok=True)
    profile = llm_profile()
    io.save_profile(profile, folder / "llm.json")
    io.save_plan(make_plan(profile, folder / "llm.json", [4, 3, 3], set(), runtime="torchtitan"), folder / f"{stem}.yaml")
    return folder / f"{stem}.yaml"


def test_torchtitan_module_names_are_identifiers_torchtitan_does_not_claim():
    from planner.emit import torchtitan

    cases = {"my-plan.v2": "my_plan_v2_torchtitan", "plan": "plan_torchtitan", "405b": "plan_405b_torchtitan",
             "llama3": "llama3_torchtitan", "plän 1": "pl_n_1_torchtitan", "class": "class_torchtitan"}
    for stem, name in cases.items():
        assert torchtitan.module_name(stem) == name and name.isidentifier()
    assert torchtitan.export_name("my-plan.v2", "0.3.0") == "my_plan_v2_torchtitan.py"
    assert torchtitan.export_name("my-plan.v2", "main") == "my_plan_v2_torchtitan.py"
    assert torchtitan.export_name("my-plan.v2", "0.2.2") == "my-plan.v2.torchtitan.toml"


def test_a_torchtitan_launch_runs_the_export_of_its_version(tmp_path):
    """0.3.0 and main: run_train.sh's `-m torchtitan.train --module M --config F` (since 9810191bb),
    the export's folder first on PYTHONPATH; 0.2.x: `--job.config_file` on the TOML (v0.2.2); each
    under run_train.sh's PYTORCH_ALLOC_CONF."""
    plan_file = _titan_plan(tmp_path / "runs.d")
    plan = io.load_plan(plan_file)
    folder = str((tmp_path / "runs.d").resolve())
    alloc = ("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    for version in (None, "0.3.0", "main"):
        launch = launchers.launch_for(plan, plan_file, tp=1, gpus_per_node=3, entry=None, torchtitan_version=version)
        assert launch.entry == ("-m", "torchtitan.train", "--module", "my_plan_v2_torchtitan", "--config", "ckplan_config")
        assert launch.env == (alloc, ("PYTHONPATH", folder))
        assert launchers.entry_file(launch) == Path(folder) / "my_plan_v2_torchtitan.py"
    lines = launchers.torchrun_lines(launch).splitlines()
    assert lines[4:] == [
        "export PYTORCH_ALLOC_CONF=expandable_segments:True",
        f'export PYTHONPATH={folder}"${{PYTHONPATH:+:$PYTHONPATH}}"',
        "# node 0",
        'torchrun --nnodes 1 --nproc-per-node 3 --node-rank 0 --master-port 29500 --master-addr "$MASTER_ADDR" '
        "-m torchtitan.train --module my_plan_v2_torchtitan --config ckplan_config"]
    slurm = launchers.slurm_script(launch)
    assert ("export PYTHONPATH=" in slurm and slurm.endswith(
        '--rdzv-endpoint "$head_node:29500" -m torchtitan.train --module my_plan_v2_torchtitan --config ckplan_config\n'))
    job = yaml.safe_load(launchers.trainjob(launch))["spec"]["trainer"]
    assert job["args"] == list(launch.entry)
    assert job["env"] == [{"name": "PYTORCH_ALLOC_CONF", "value": "expandable_segments:True"},
                          {"name": "PYTHONPATH", "value": folder}]
    old = launchers.launch_for(plan, plan_file, tp=1, gpus_per_node=3, entry=None, torchtitan_version="0.2.2")
    toml = str(tmp_path / "runs.d" / "my-plan.v2.torchtitan.toml")
    assert old.entry == ("-m", "torchtitan.train", "--job.config_file", toml) and old.env == (alloc,)
    assert launchers.torchrun_lines(old).splitlines()[4:] == [
        "export PYTORCH_ALLOC_CONF=expandable_segments:True", "# node 0",
        'torchrun --nnodes 1 --nproc-per-node 3 --node-rank 0 --master-port 29500 --master-addr "$MASTER_ADDR" '
        f"-m torchtitan.train --job.config_file {toml}"]
    mine = launchers.launch_for(plan, plan_file, tp=1, gpus_per_node=3, entry=("train.py",))
    assert mine.env == () and launchers.entry_file(mine) is None  # --entry: what the user named, as named


def _run_script(script: Path, tmp_path: Path, **env) -> tuple[list[str], str]:
    """(the arguments a stand-in torchrun got, the PYTHONPATH it ran under), the script run by bash."""
    import shutil
    import subprocess

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    record, paths = tmp_path / "args", tmp_path / "pythonpath"
    (bin_dir / "torchrun").write_text(f'#!/bin/bash\nfor a in "$@"; do printf "%s\\0" "$a"; done > "{record}"\n'
                                      f'printf "%s" "$PYTHONPATH" > "{paths}"\n')
    (bin_dir / "torchrun").chmod(0o755)
    subprocess.run([shutil.which("bash"), str(script)], check=True, timeout=30, cwd=tmp_path, capture_output=True,
                   env={"PATH": f"{bin_dir}:/usr/bin:/bin", "MASTER_ADDR": "10.0.0.1"} | env)
    return record.read_text().split("\0")[:-1], paths.read_text()


def test_the_launchs_pythonpath_and_module_find_the_file_the_export_wrote(tmp_path):
    """`export --to torchtitan` then `--to torchrun`, the script run under bash: the module it names
    is an identifier, and Python given the PYTHONPATH it exports finds it at the file written."""
    import os
    import subprocess
    import sys

    plan_file = _titan_plan(tmp_path / "a-b.c")
    run_ok("export", plan_file, "--to", "torchtitan", "--torchtitan-base", "m:f")
    written = tmp_path / "a-b.c" / "my_plan_v2_torchtitan.py"
    assert written.is_file() and not (tmp_path / "a-b.c" / "my-plan.v2.torchtitan.py").exists()
    run_ok("export", plan_file, "--to", "torchrun")
    args, paths = _run_script(tmp_path / "a-b.c" / "my-plan.v2.torchrun.sh", tmp_path, PYTHONPATH="/theirs")
    module = args[args.index("--module") + 1]
    assert module.isidentifier() and args[args.index("--config") + 1] == "ckplan_config"
    assert paths == f"{(tmp_path / 'a-b.c').resolve()}{os.pathsep}/theirs"  # ours first, the caller's kept
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    found = subprocess.run([sys.executable, "-c", "import importlib.util, sys; "
                            "print(importlib.util.find_spec(sys.argv[1]).origin)", module],
                           cwd=elsewhere, env={"PYTHONPATH": paths}, capture_output=True, text=True, check=True)
    assert Path(found.stdout.strip()) == written.resolve()


def test_a_hostile_folder_reaches_pythonpath_as_one_value(tmp_path):
    folder = tmp_path / "x $(touch PWNED)\ntouch PWNED `touch PWNED`;'q\""
    plan_file = _titan_plan(folder, stem="p")
    run_ok("export", plan_file, "--to", "torchrun")
    args, paths = _run_script(folder / "p.torchrun.sh", tmp_path)
    assert paths == str(folder.resolve()) and args[-4:] == ["--module", "p_torchtitan", "--config", "ckplan_config"]
    assert not list(tmp_path.rglob("PWNED"))
    run_ok("export", plan_file, "--to", "kubernetes")
    text = (folder / "p.trainjob.yaml").read_text()
    head = text[:text.index("\napiVersion: ")].splitlines()
    assert len(head) == 3 and all(line.startswith("# ") for line in head)  # the path's newline stayed in its comment
    assert yaml.safe_load(text)["spec"]["trainer"]["env"][1] == {"name": "PYTHONPATH", "value": str(folder.resolve())}
    colon = _titan_plan(tmp_path / "a:b", stem="p")
    result = run("export", colon, "--to", "slurm")
    assert result.exit_code == 1 and "which PYTHONPATH cannot carry" in " ".join(result.output.split())
    assert not (tmp_path / "a:b" / "p.slurm.sh").exists()


def test_the_launchs_torchtitan_version_is_the_exports_option(tmp_path):
    plan_file = _titan_plan(tmp_path)
    run_ok("export", plan_file, "--to", "slurm", "--torchtitan-version", "0.2.2")
    assert "--job.config_file" in (tmp_path / "my-plan.v2.slurm.sh").read_text()
    result = run("export", plan_file, "--to", "slurm", "--torchtitan-version", "0.2.2", "--entry", "train.py")
    assert result.exit_code == 1 and "with --entry you name what runs yourself" in " ".join(result.output.split())
    result = run("export", plan_file, "--to", "slurm", "--torchtitan-version", "0.1.0")
    assert result.exit_code == 1 and "0.2.0 or newer" in result.output
    ckplan_plan = tmp_path / "ck"
    ckplan_plan.mkdir()
    profile = llm_profile()
    io.save_profile(profile, ckplan_plan / "llm.json")
    io.save_plan(make_plan(profile, ckplan_plan / "llm.json", [4, 3, 3], set()), ckplan_plan / "plan.yaml")
    result = run("export", ckplan_plan / "plan.yaml", "--to", "torchrun", "--torchtitan-version", "main")
    assert result.exit_code == 1 and "runs on ckplan's runtime" in " ".join(result.output.split())


def test_a_torchtitan_launch_says_when_its_export_is_not_written(tmp_path):
    """The launch file runs the export of its version; said when that file is not there yet (it was
    PLAN.torchtitan.toml, the 0.2 export's name, for every version)."""
    plan_file = _titan_plan(tmp_path)
    said = " ".join(run_ok("export", plan_file, "--to", "torchrun").output.split())
    assert "torchtitan 0.3.0's trainer on" in said and "my_plan_v2_torchtitan.py, which does not exist yet" in said
    assert "--torchtitan-version 0.3.0` writes it" in said
    run_ok("export", plan_file, "--to", "torchtitan", "--torchtitan-base", "m:f")
    said = run_ok("export", plan_file, "--to", "torchrun", "--out", tmp_path / "again.sh").output
    assert "does not exist yet" not in said
    said = " ".join(run_ok("export", plan_file, "--to", "slurm", "--torchtitan-version", "0.2.2").output.split())
    assert "my-plan.v2.torchtitan.toml, which does not exist yet" in said
    run_ok("export", plan_file, "--to", "torchtitan", "--torchtitan-version", "0.2.2")
    assert (tmp_path / "my-plan.v2.torchtitan.toml").exists()
    said = run_ok("export", plan_file, "--to", "slurm", "--torchtitan-version", "0.2.2", "--out", tmp_path / "s.sh").output
    assert "does not exist yet" not in said
    said = run_ok("export", plan_file, "--to", "slurm", "--entry", "-m torchtitan.train --module m").output
    assert "does not exist yet" not in said


def test_a_torchtitan_launch_sets_the_allocator_its_plan_was_scored_under(tmp_path):
    """The reserve replays expandable segments on one node (run_train.sh) and the default segments across
    nodes (multinode_trainer.slurm sets none) unless the plan states them; the launch sets what was scored."""
    plan_file = _titan_plan(tmp_path / "runs")
    plan = io.load_plan(plan_file)
    alloc = ("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    one_node = launchers.launch_for(plan, plan_file, tp=1, gpus_per_node=3, entry=None)
    two_nodes = launchers.launch_for(plan, plan_file, tp=2, gpus_per_node=3, entry=None)
    assert (one_node.num_nodes, two_nodes.num_nodes) == (1, 2)
    assert alloc in one_node.env and alloc not in two_nodes.env
    assert "PYTORCH_ALLOC_CONF" not in launchers.torchrun_lines(two_nodes)
    stated = plan.model_copy(update={"setup": plan.setup.model_copy(update={
        "training": plan.setup.training.model_copy(update={"expandable_segments": True})})})
    assert alloc in launchers.launch_for(stated, plan_file, tp=2, gpus_per_node=3, entry=None).env
    off = plan.model_copy(update={"setup": plan.setup.model_copy(update={
        "training": plan.setup.training.model_copy(update={"expandable_segments": False})})})
    assert alloc not in launchers.launch_for(off, plan_file, tp=1, gpus_per_node=3, entry=None).env
