"""`export --to torchtitan` for the release (0.3.0, the default) and for torchtitan main after
73aed7f6c, which counts the batch in tokens (planner/emit/titan_keys.py): the keys each writes, by
hand on a tiny analytic LLaMA (seq 32), checked against each version's field names as read, and
parsed by torchtitan's own ConfigManager where torchtitan is installed."""

from __future__ import annotations

import ast
import importlib
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from click.testing import CliRunner
from export_plans import make_plan

from planner import io
from planner.cli import cli
from planner.emit import titan_keys
from planner.errors import UserError
from planner.models import archs
from planner.profiler import analytic
from planner.profiler.analytic import Shape
from planner.schema import FileRef

TINY = archs.Arch(name="tiny-llama", hidden_size=64, intermediate_size=160, num_layers=4, num_heads=4,
                  num_kv_heads=2, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=32)
SEQ = 32
# TrainingConfig's and ParallelismConfig's fields the export may set, as each version defines them:
# 0.3.0's config/configs.py (the wheel, = main at 5ab3a0fd1) and main's at b5bcd76c
FIELDS = {
    "0.3.0": {"training": {"local_batch_size", "global_batch_size", "seq_len", "disable_cuda_graphs"},
              "parallelism": {"pipeline_parallel_microbatch_size"}},
    "main": {"training": {"num_tokens_per_microbatch_per_dp_rank", "num_tokens_per_train_step", "max_context_length",
                          "disable_cuda_graphs"},
             "parallelism": {"num_pp_microbatches"}},
}
COMMON = {"parallelism": {"pipeline_parallel_degree", "module_fqns_per_model_part", "pipeline_parallel_schedule",
                          "tensor_parallel_degree", "data_parallel_shard_degree", "data_parallel_replicate_degree",
                          "context_parallel_degree", "expert_parallel_degree"},
          "training": set(), "compile": {"enable", "components"}}


def _plan(tmp_path, sizes, *, microbatches: int = 4, **setup):
    profile = analytic.analytic_profile(TINY, Shape(seq_len=SEQ, micro_batch_size=2), gpu=archs.gpu("h100"),
                                        model=FileRef(file="arch:test", sha256="0" * 64))
    io.save_profile(profile, tmp_path / "tiny.json")
    plan = make_plan(profile, tmp_path / "tiny.json", sizes, {"layers.1"}, microbatches=microbatches,
                     runtime="torchtitan")
    if setup:
        plan = plan.model_copy(update={"setup": plan.setup.model_copy(update=setup)})
    io.save_plan(plan, tmp_path / "plan.yaml")
    return tmp_path / "plan.yaml"


def _export(plan_path, version: str, base: str = "ckplan_base:base"):
    out = plan_path.with_name(f"ckplan_titan_{version.replace('.', '_')}.py")
    result = CliRunner().invoke(cli, ["export", str(plan_path), "--to", "torchtitan", "--torchtitan-version",
                                      version, "--torchtitan-base", base, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def _assigned(text: str) -> dict[str, dict[str, object]]:
    """config.SECTION.KEY = VALUE in ckplan_config(), by section (values as literals or names)."""
    out: dict[str, dict[str, object]] = {}
    function = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == "ckplan_config")
    for node in function.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute):
            target = node.targets[0]
            if isinstance(target.value, ast.Attribute):
                value = ast.literal_eval(node.value) if isinstance(node.value, ast.Constant) else ast.unparse(node.value)
                out.setdefault(target.value.attr, {})[target.attr] = value
    return out


def test_main_counts_the_pipelines_microbatches_in_tokens(tmp_path):
    """2 stages, 4 microbatches of 1 sequence of 32 tokens, dp 1: main takes 4 pipeline microbatches
    of 32 token slots, 128 a step; 0.3.0 takes a local batch of 4 sequences split into microbatches of 1."""
    plan = _plan(tmp_path, [3, 3])
    main = _assigned(_export(plan, "main").read_text())
    assert main["training"] == {"num_tokens_per_microbatch_per_dp_rank": 32, "num_tokens_per_train_step": 128,
                                "max_context_length": SEQ, "disable_cuda_graphs": True}
    assert main["parallelism"]["num_pp_microbatches"] == 4
    release = _assigned(_export(plan, "0.3.0").read_text())
    assert release["training"] == {"local_batch_size": 4, "seq_len": SEQ, "disable_cuda_graphs": True}
    assert release["parallelism"]["pipeline_parallel_microbatch_size"] == 1
    for version, assigned in (("main", main), ("0.3.0", release)):
        for section, keys in assigned.items():
            assert set(keys) <= FIELDS[version].get(section, set()) | COMMON[section], (version, section)


def test_main_without_a_pipeline_accumulates_over_the_step_tokens(tmp_path):
    """One stage, 4 microbatches of 2 sequences, dp 8 (ZeRO 3): a forward of 2 x 32 = 64 token slots,
    4 accumulation steps over 8 ranks = 2048 tokens a step; num_pp_microbatches 1 (no pipeline)."""
    plan = _plan(tmp_path, [6], micro_batch_size=2, dp=8, zero=3)
    text = _export(plan, "main").read_text()
    main = _assigned(text)
    assert main["training"] == {"num_tokens_per_microbatch_per_dp_rank": 64, "num_tokens_per_train_step": 2048,
                                "max_context_length": SEQ, "disable_cuda_graphs": True}
    assert main["parallelism"]["num_pp_microbatches"] == 1
    assert "one window of tokens, attended block-causally" in " ".join(text.split())


def test_versions_are_parsed_and_unread_ones_refused():
    assert titan_keys.parse("main") == titan_keys.Version(name="main", python=True, tokens=True)
    assert titan_keys.parse("v0.3.0").python and not titan_keys.parse("0.3.0").tokens
    assert titan_keys.parse("0.2.2").head == "output" and titan_keys.parse("main").head == "lm_head"
    with pytest.raises(UserError, match="not a release ckplan has read"):
        titan_keys.parse("0.4.0")
    with pytest.raises(UserError, match="give a release number"):
        titan_keys.parse("latest")


def test_main_needs_the_sequence_length_it_counts_tokens_by(tmp_path):
    """A measured profile records no sequence length: the main export is refused in one sentence."""
    from export_plans import write

    _, _, plan_path = write(tmp_path, [4, 3, 3], {"layers.1"}, runtime="torchtitan")
    result = CliRunner().invoke(cli, ["export", str(plan_path), "--to", "torchtitan", "--torchtitan-version", "main",
                                      "--torchtitan-base", "m:f", "--out", str(tmp_path / "o.py")])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "does not record its sequence length" in result.output
    assert not (tmp_path / "o.py").exists()


def test_the_float8_note_names_what_the_version_offers(tmp_path):
    assert "rowwise recipes only" in titan_keys.float8_note(titan_keys.parse("0.3.0"), False)
    assert "model.converters" in titan_keys.float8_note(titan_keys.parse("0.2.2"), True)


# ---------------------------------------------------------------- torchtitan's own parser

_BASE = '''from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Annotated

import tyro
from torchtitan.components.loss import ChunkedLossWrapper
from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
from torchtitan.distributed.activation_checkpoint import ActivationCheckpointingConfig, SelectiveAC


@dataclass(kw_only=True)
class Job:
    """The fields of Trainer.Config the export sets, typed as torchtitan types them (its Trainer
    needs CUDA-era packages to import)."""
    model_spec: Annotated[object, tyro.conf.Suppress] = None
    hf_assets_path: str = "./assets"
    training: TrainingConfig = field(default_factory=TrainingConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    activation_checkpoint: ActivationCheckpointingConfig = field(default_factory=SelectiveAC.Config)
    compile: CompileConfig = field(default_factory=CompileConfig)
    loss: Annotated[object, tyro.conf.Suppress] = field(default_factory=ChunkedLossWrapper.Config)  # as llama3's


def base():
    return Job(model_spec=SimpleNamespace(model=SimpleNamespace(layers=[None] * 4)))
'''


@pytest.mark.frameworks
def test_torchtitans_config_manager_parses_the_export_for_the_installed_version(tmp_path):
    """torchtitan's ConfigManager (--module/--config, then tyro over the loaded config) takes the file
    written for the version installed: main's keys where its TrainingConfig counts tokens, else 0.3.0's.
    Parse only; nothing trains."""
    pytest.importorskip("torchtitan.config")
    pytest.importorskip("tyro")
    from torchtitan.config import TrainingConfig
    from torchtitan.config.manager import ConfigManager

    version = "main" if "num_tokens_per_microbatch_per_dp_rank" in {f.name for f in fields(TrainingConfig)} else "0.3.0"
    (tmp_path / "ckplan_base.py").write_text(_BASE)
    path = _export(_plan(tmp_path, [3, 3]), version)
    sys.path.insert(0, str(tmp_path))
    try:
        config = ConfigManager().parse_args(["--module", path.stem, "--config", "ckplan_config",
                                             "--training.steps", "7"])
    finally:
        sys.path.remove(str(tmp_path))
        for name in ("ckplan_base", path.stem):
            sys.modules.pop(name, None)
        importlib.invalidate_caches()
    assert config.training.steps == 7  # the command line over the loaded config, as torchtitan parses it
    assert config.training.disable_cuda_graphs is True  # 0.3.0 and main refuse a pipeline under CUDA graphs
    assert type(config.loss).__qualname__ == "CrossEntropyLoss.Config"  # scored on whole logits: the base's unwrapped
    assert config.parallelism.pipeline_parallel_degree == 2
    assert config.parallelism.module_fqns_per_model_part[-1][-2:] == ["norm", "lm_head"]
    assert type(config.activation_checkpoint).__name__ == "Config" and config.activation_checkpoint.layers == ["layers.1"]
    if version == "main":
        assert (config.training.num_tokens_per_microbatch_per_dp_rank, config.parallelism.num_pp_microbatches) == (32, 4)
    else:
        assert (config.training.local_batch_size, config.parallelism.pipeline_parallel_microbatch_size) == (4, 1)


@pytest.mark.parametrize("compiled, written", [(True, True), (False, False)])
def test_asynctp_is_written_where_the_plan_was_scored_with_it(tmp_path, compiled, written):
    """--tp-overlap async-tp: compile.enable_async_tensor_parallel in 0.3.0 and main (737594746), the
    parallelism section's key in 0.2.x; torchtitan refuses it without the model compiled, so it is then
    left off and said."""
    plan_path = _plan(tmp_path, [3, 3])
    from planner import io as plan_io

    plan = plan_io.load_plan(plan_path)
    setup = plan.setup.model_copy(update={
        "comm": plan.setup.comm.model_copy(update={"tp": 2, "tp_overlap": "async-tp"}),
        "training": plan.setup.training.model_copy(update={"compile": compiled})})
    plan_io.save_plan(plan.model_copy(update={"setup": setup}), plan_path)
    text = _export(plan_path, "main").read_text()
    assert _assigned(text)["compile"].get("enable_async_tensor_parallel") is (True if written else None)
    assert ("AsyncTP without the model compiled" in " ".join(text.split())) is not written
    toml = plan_path.with_name("o.toml")
    run = CliRunner().invoke(cli, ["export", str(plan_path), "--to", "torchtitan", "--torchtitan-version", "0.2.2",
                                   "--out", str(toml)])
    assert run.exit_code == 0, run.output
    import tomllib

    assert tomllib.loads(toml.read_text())["parallelism"].get("enable_async_tensor_parallel") is (
        True if written else None)


@pytest.mark.parametrize("sp", [True, False])
def test_sequence_parallel_is_written_as_the_profile_assumed_it(tmp_path, sp):
    """A TP 2 profile with or without SP: 0.3.0 and main write enable_sequence_parallel (default True since
    aa68af18e); 0.2.x always runs SP, so a profile without it is said there."""
    plan_path = _plan(tmp_path, [3, 3])
    profile = io.load_profile(tmp_path / "tiny.json")
    io.save_profile(profile.model_copy(update={"assumptions": {**profile.assumptions, "tp": 2, "sp": sp}}),
                    tmp_path / "tiny.json")
    plan = io.load_plan(plan_path)
    io.save_plan(plan.model_copy(update={"profile": io.file_ref(tmp_path / "tiny.json")}), plan_path)
    for version in ("main", "0.3.0"):
        parallelism = _assigned(_export(plan_path, version).read_text())["parallelism"]
        assert (parallelism["tensor_parallel_degree"], parallelism["enable_sequence_parallel"]) == (2, sp)
    toml = tmp_path / "o.toml"
    result = CliRunner().invoke(cli, ["export", str(plan_path), "--to", "torchtitan", "--torchtitan-version", "0.2.2",
                                      "--out", str(toml)])
    assert result.exit_code == 0, result.output
    assert ("tensor parallelism without sequence parallelism" in " ".join(toml.read_text().split())) is not sp


@pytest.mark.parametrize("target, option, value", [("megatron", "--torchtitan-version", "main"),
                                                    ("torchrun", "--torchtitan-base", "m:f")])
def test_the_torchtitan_options_are_refused_for_another_target(tmp_path, target, option, value):
    """A launch file takes --torchtitan-version (the trainer it runs, tests/test_launchers.py), not the base."""
    plan = _plan(tmp_path, [3, 3])
    result = CliRunner().invoke(cli, ["export", str(plan), "--to", target, option, value])
    assert result.exit_code != 0 and f"{option} applies to --to torchtitan" in result.output
    assert "Traceback" not in result.output


@pytest.mark.frameworks
def test_torchtitans_config_manager_runs_what_the_launch_file_names(tmp_path):
    """The torchrun file of a plan named with a dash and dots, run by bash with a stand-in torchrun:
    torchtitan's ConfigManager, given the arguments after `-m torchtitan.train` and the PYTHONPATH
    the file exports, loads the config function of the export `--to torchtitan` wrote beside the plan
    for the installed version (0.3.0 or main). Parse only; nothing trains."""
    import shutil
    import subprocess

    pytest.importorskip("torchtitan.config")
    pytest.importorskip("tyro")
    from torchtitan.config import TrainingConfig
    from torchtitan.config.manager import ConfigManager

    version = "main" if "num_tokens_per_microbatch_per_dp_rank" in {f.name for f in fields(TrainingConfig)} else "0.3.0"
    (tmp_path / "ckplan_base.py").write_text(_BASE)
    plan = _plan(tmp_path, [3, 3]).rename(tmp_path / "my-plan.v2.yaml")
    for target in ("torchtitan", "torchrun"):
        extra = ["--torchtitan-base", "ckplan_base:base"] if target == "torchtitan" else []
        result = CliRunner().invoke(cli, ["export", str(plan), "--to", target, "--torchtitan-version", version, *extra])
        assert result.exit_code == 0, result.output
    bin_dir, record = tmp_path / "bin", tmp_path / "record"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(f'#!/bin/bash\nprintf "%s\\0" "$PYTHONPATH" "$@" > "{record}"\n')
    (bin_dir / "torchrun").chmod(0o755)
    subprocess.run([shutil.which("bash"), str(tmp_path / "my-plan.v2.torchrun.sh")], check=True, timeout=30,
                   env={"PATH": f"{bin_dir}:/usr/bin:/bin", "MASTER_ADDR": "10.0.0.1"}, capture_output=True)
    paths, *argv = record.read_text().split("\0")[:-1]
    args = argv[argv.index("torchtitan.train") + 1:]
    module = args[args.index("--module") + 1]
    assert module == "my_plan_v2_torchtitan" and module.isidentifier()
    assert (tmp_path / f"{module}.py").is_file() and paths == str(tmp_path.resolve())
    sys.path[:0] = paths.split(":")
    try:
        config = ConfigManager().parse_args([*args, "--training.steps", "7"])
        loaded = sys.modules[module].__file__
    finally:
        del sys.path[:len(paths.split(":"))]
        for name in ("ckplan_base", module):
            sys.modules.pop(name, None)
        importlib.invalidate_caches()
    assert Path(loaded).resolve() == (tmp_path / f"{module}.py").resolve()  # the file the export wrote
    assert config.training.steps == 7 and config.parallelism.pipeline_parallel_degree == 2
    assert config.parallelism.module_fqns_per_model_part[-1][-2:] == ["norm", "lm_head"]


def test_a_base_function_is_refused_for_a_toml_version(tmp_path):
    """0.2.x is configured by the TOML the export writes whole: a --torchtitan-base there was read by nothing."""
    plan = _plan(tmp_path, [3, 3])
    result = CliRunner().invoke(cli, ["export", str(plan), "--to", "torchtitan", "--torchtitan-version", "0.2.2",
                                      "--torchtitan-base", "ckplan_base:base", "--out", str(tmp_path / "t.toml")])
    assert result.exit_code == 1 and "--torchtitan-base names the config function" in result.output
    assert not (tmp_path / "t.toml").exists()


@pytest.mark.frameworks
def test_the_chunked_loss_is_written_as_scored(tmp_path):
    """A plan scored with --chunked-cross-entropy 4: 0.3.0's file wraps the base's loss in ChunkedLossWrapper
    over 4 chunks (torchtitan's ConfigManager parses it); 0.2.x has none, so its export says so."""
    pytest.importorskip("torchtitan.config")
    pytest.importorskip("tyro")
    from torchtitan.config import ConfigManager, TrainingConfig

    plan_path = _plan(tmp_path, [3, 3])
    plan = io.load_plan(plan_path)
    training = plan.setup.training.model_copy(update={"chunked_cross_entropy": 4})
    io.save_plan(plan.model_copy(update={"setup": plan.setup.model_copy(update={"training": training})}), plan_path)
    version = "main" if "num_tokens_per_microbatch_per_dp_rank" in {f.name for f in fields(TrainingConfig)} else "0.3.0"
    (tmp_path / "ckplan_base.py").write_text(_BASE)
    path = _export(plan_path, version)
    sys.path.insert(0, str(tmp_path))
    try:
        config = ConfigManager().parse_args(["--module", path.stem, "--config", "ckplan_config"])
    finally:
        sys.path.remove(str(tmp_path))
        for name in ("ckplan_base", path.stem):
            sys.modules.pop(name, None)
        importlib.invalidate_caches()
    assert type(config.loss).__qualname__ == "ChunkedLossWrapper.Config" and config.loss.num_chunks == 4
    assert type(config.loss.loss_fn).__qualname__ == "CrossEntropyLoss.Config"  # the base's own, unwrapped once
    toml = CliRunner().invoke(cli, ["export", str(plan_path), "--to", "torchtitan", "--torchtitan-version", "0.2.2",
                                    "--out", str(tmp_path / "t.toml")])
    assert toml.exit_code == 0, toml.output
    assert "torchtitan 0.2.2 has no ChunkedLossWrapper" in (tmp_path / "t.toml").read_text()
