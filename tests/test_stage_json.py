"""Every --json output's per-rank dictionaries come from one builder (planner/commands/stage_json.py,
keys declared in planner/schema/summary.py): evaluate --profile, evaluate --from-megatron,
evaluate --from-torchtitan, solve and search give the same keys, and the same values for the
same plan. Three builders had let replayed_reserved_bytes reach two outputs and not the third."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT
from fixtures.cli import run_ok
from test_launchers import _tiny_config

from planner import io
from planner.commands import evaluate_config
from planner.commands.stage_json import stages_json
from planner.cost import costmodel
from planner.cost.float8 import float8_profile
from planner.schema import StagePredicted
from planner.schema.summary import StageSummary

CONFIGS = ROOT / "tests" / "fixtures" / "configs"
GPT3 = CONFIGS / "megatron_gpt3_mcore_te_tp2_pp2.yaml"  # Megatron-LM's test: 12 layers, TP 2, PP 2
LLAMA8B = CONFIGS / "torchtitan_llama3_8b.toml"  # FSDP2 over 8 GPUs, op-level SAC
KEYS = set(StageSummary.model_fields)
# the setup GPT3's file gives (evaluate_config.predict), as evaluate's and solve's options say it
GPT3_OPTIONS = ("--microbatches", "8", "--precision", "bf16-mixed", "--runtime", "megatron",
                "--no-gradient-accumulation-fusion", "--log-params-norm", "--log-num-zeros-in-grad",
                "--deterministic-mode", "--nccl-ring-simple")  # its ENV_VARS: the functional tests' launcher's Ring/Simple
LLAMA8B_OPTIONS = ("--layers-per-stage", "32", "--checkpoint", ",".join(f"layers.{i}" for i in range(32)),
                   "--op-level-sac", "--dp", "8", "--zero", "3", "--microbatches", "1", "--precision", "bf16-mixed",
                   "--runtime", "torchtitan")


def _profile_of(config, folder, *, megatron: bool, gpus: int):
    """The analytic profile evaluate --from-* scores the config's job on, in a file."""
    job = evaluate_config.read_job(config if megatron else None, None if megatron else config)
    path = folder / "profile.json"
    io.save_profile(evaluate_config.predict(job, gpus=gpus, gpu_name="h100-sxm").profile, path)
    return path


def _check_keys(stages: list[dict]) -> None:
    assert stages
    for stage in stages:
        assert set(stage) == KEYS, set(stage) ^ KEYS
        assert stage["rank"] == stage["index"]  # "rank": evaluate --from-*'s old name, kept
        assert stage["reserved_bytes"] is not None and stage["reserved_by"] in ("replay", "divisor")  # an h100's


@pytest.fixture(scope="module")
def gpt3(tmp_path_factory):
    return _profile_of(GPT3, tmp_path_factory.mktemp("gpt3"), megatron=True, gpus=4)


def test_evaluate_from_megatron_gives_what_evaluate_gives_on_its_profile(gpt3):
    ranks = json.loads(run_ok("evaluate", "--from-megatron", GPT3, "--gpus", "4", "--json").stdout)["ranks"]
    summary = json.loads(run_ok("evaluate", "--profile", gpt3, "--layers-per-stage", "6,6", "--ckpt-per-stage",
                                "0,0", *GPT3_OPTIONS, "--json", "--time-limit", "20").stdout)
    _check_keys(ranks)
    _check_keys(summary["ckplan"]["stages"])
    assert summary["hand"]["stages"] == ranks


def test_solve_gives_what_evaluate_gives_for_its_plan(gpt3, tmp_path):
    """A cap that makes solve checkpoint (whole layers: what --checkpoint names); evaluate of the
    plan it wrote, by layer counts and names, gives its ranks key for key."""
    out = tmp_path / "plan.yaml"
    options = (*GPT3_OPTIONS, "--recompute", "whole-layer", "--mem", "3GiB")
    solved = json.loads(run_ok("solve", "--profile", gpt3, "--stages", "2", *options, "--json", "--out", out,
                               "--time-limit", "20").stdout)["stages"]
    _check_keys(solved)
    plan = io.load_plan(out)
    recorded = set(StagePredicted.model_fields) & KEYS  # what plan.yaml records of each, the same
    assert [{key: s[key] for key in recorded} for s in solved] == [
        {key: getattr(s.predicted, key) for key in recorded} for s in plan.stages]
    checkpointed = [name for stage in plan.stages for name in stage.checkpointed]
    assert checkpointed  # the cap made it checkpoint
    evaluated = json.loads(run_ok("evaluate", "--profile", gpt3, *options, "--json", "--time-limit", "20",
                                  "--layers-per-stage", ",".join(str(len(s.layers)) for s in plan.stages),
                                  "--checkpoint", ",".join(checkpointed)).stdout)["hand"]["stages"]
    assert evaluated == solved


def test_evaluate_from_torchtitan_gives_what_evaluate_gives_on_its_profile(tmp_path):
    profile = _profile_of(LLAMA8B, tmp_path, megatron=False, gpus=8)
    ranks = json.loads(run_ok("evaluate", "--from-torchtitan", LLAMA8B, "--gpus", "8", "--json").stdout)["ranks"]
    summary = json.loads(run_ok("evaluate", "--profile", profile, *LLAMA8B_OPTIONS, "--json",
                                "--time-limit", "20").stdout)
    _check_keys(ranks)
    assert summary["hand"]["stages"] == ranks


def test_search_gives_what_the_cost_model_gives_for_the_plan_it_writes(tmp_path):
    out = tmp_path / "best.yaml"
    data = json.loads(run_ok("search", "--arch-config", _tiny_config(tmp_path), "--gpus", "8", "--global-batch", "8",
                             "--seq-len", "512", "--top", "2", "--json", "--out", out).stdout)
    for row in data["ranked"]:
        _check_keys(row["stages"])
    plan = io.load_plan(out)
    profile = float8_profile(io.load_profile(tmp_path / "best.profile.json"), plan.setup)
    assert data["ranked"][0]["stages"] == stages_json(plan.stages, costmodel.evaluate(plan.stages, profile, plan.setup))


def test_a_stage_dictionary_with_a_key_missing_or_unknown_is_refused():
    from pydantic import ValidationError

    stage = dict.fromkeys(KEYS, 0) | {"layers": ["a"], "checkpointed": [], "recompute": {}, "reserved_by": None,
                                      "cap_replay": None, "fits": True, "nccl_buffers": {"dp": 1},
                                      "reserved_range_bytes": None}
    assert StageSummary(**stage).model_dump() == stage
    for broken in ({k: v for k, v in stage.items() if k != "replayed_reserved_bytes"}, stage | {"peak": 0},
                   stage | {"rank": 1}):
        with pytest.raises(ValidationError):
            StageSummary(**broken)
