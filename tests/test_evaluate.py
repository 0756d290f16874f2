"""`ckplan evaluate`: a hand configuration scored by the cost model beside ckplan's plan."""

from __future__ import annotations

import json

import pytest
from export_plans import llm_profile
from fixtures.cli import run

from planner import io
from planner.commands.handplan import hand_stages
from planner.cost import costmodel
from planner.errors import UserError


@pytest.fixture()
def profile_path(tmp_path):
    path = tmp_path / "llm.json"
    io.save_profile(llm_profile(8), path)
    return path


def test_decoder_counts_put_the_embedding_first_and_the_head_last():
    stages = hand_stages(llm_profile(8), [3, 3, 2], [1, 0, 2], "first")
    assert [s.layers for s in stages] == [["tok_embeddings", "layers.0", "layers.1", "layers.2"],
                                          ["layers.3", "layers.4", "layers.5"], ["layers.6", "layers.7", "output"]]
    assert [s.checkpointed for s in stages] == [["layers.0"], [], ["layers.6", "layers.7"]]
    last = hand_stages(llm_profile(8), [3, 3, 2], [1, 0, 1], "last")
    assert [s.checkpointed for s in last] == [["layers.2"], [], ["layers.7"]]


def test_counts_of_every_layer():
    stages = hand_stages(llm_profile(8), [4, 3, 3], [2, 0, 1], "first")
    assert [s.layers[0] for s in stages] == ["tok_embeddings", "layers.3", "layers.6"]
    assert [s.checkpointed for s in stages] == [["tok_embeddings", "layers.0"], [], ["layers.6"]]


def test_evaluate_scores_the_hand_configuration_with_the_cost_model(profile_path):
    result = run("evaluate", "--profile", str(profile_path), "--mem", "80MiB", "--microbatches", "6",
                 "--parallel-stages", "3", "--layers-per-stage", "3,3,2", "--ckpt-per-stage", "1,0,2", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)  # the notes go to stderr
    profile = io.load_profile(profile_path)
    setup = costmodel_setup(profile)
    cost = costmodel.evaluate(hand_stages(profile, [3, 3, 2], [1, 0, 2], "first"), profile, setup)
    assert summary["hand"]["iteration_ms"] == cost.iteration_ms
    assert [s["peak_bytes"] for s in summary["hand"]["stages"]] == cost.peak_bytes_per_stage
    assert [s["static_bytes"] for s in summary["hand"]["stages"]] == [c.static_bytes for c in cost.stages]
    assert all("reserved_bytes" in s for s in summary["hand"]["stages"] + summary["ckplan"]["stages"])
    assert summary["ckplan"]["status"] == "optimal"
    assert summary["ckplan"]["iteration_ms"] <= cost.iteration_ms or not summary["hand"]["feasible"]


def test_evaluate_counts_the_baselines_against_the_time_limit(profile_path, monkeypatch):
    """One --time-limit bounds the baselines and the search, as in `ckplan solve`: the deadline
    the solver gets started before the baselines ran."""
    import time

    from planner.solve import baselines, search

    seen = {}
    all_baselines, plan = baselines.all_baselines, search.plan

    def slow_baselines(*args, **kwargs):
        time.sleep(0.3)
        return all_baselines(*args, **kwargs)

    def recording_plan(*args, deadline=None, **kwargs):
        seen["elapsed_s"] = deadline.elapsed_s()
        return plan(*args, deadline=deadline, **kwargs)

    monkeypatch.setattr(baselines, "all_baselines", slow_baselines)
    monkeypatch.setattr(search, "plan", recording_plan)
    result = run("evaluate", "--profile", str(profile_path), "--mem", "80MiB", "--microbatches", "6",
                 "--parallel-stages", "3", "--layers-per-stage", "3,3,2", "--ckpt-per-stage", "1,0,2", "--json")
    assert result.exit_code == 0, result.output
    assert seen["elapsed_s"] >= 0.3


def costmodel_setup(profile):
    from planner.schema import TrainSetup

    return TrainSetup(stages=3, microbatches=6, micro_batch_size=1, mem_caps_bytes=[80 * 2**20] * 3)


def test_a_hand_configuration_that_does_not_fit_says_so(profile_path):
    result = run("evaluate", "--profile", str(profile_path), "--mem", "60MiB", "--microbatches", "6",
                 "--layers-per-stage", "3,3,2", "--ckpt-per-stage", "0,0,0")
    assert result.exit_code == 0, result.output
    assert "your configuration does not fit" in result.output and "ckplan's plan" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--layers-per-stage", "3,3,3", "--ckpt-per-stage", "0,0,0"],
         "sums to 9 but the profile has 10 layers (8 decoder layers); give counts that sum to 10, or to 8"),
        (["--layers-per-stage", "3,3,2", "--ckpt-per-stage", "4,0,0"], "checkpoints 4 layers in stage 0, which has 3"),
        (["--layers-per-stage", "3,3,2", "--ckpt-per-stage", "0,0"], "has 2 entries for 3 stages"),
        (["--layers-per-stage", "3,x,2", "--ckpt-per-stage", "0,0,0"], "give whole numbers"),
        (["--layers-per-stage", "3,3²,2", "--ckpt-per-stage", "0,0,0"], "give whole numbers"),
        (["--layers-per-stage", "3,3,2", "--ckpt-per-stage", "0,٣,0"], "give whole numbers"),
        (["--layers-per-stage", "3,3,2", "--ckpt-per-stage", "0,-1,0"], "give whole numbers"),
        (["--layers-per-stage", "3,3,2", "--ckpt-per-stage", "0,0,0", "--stages", "4"], "lists 3 stages"),
        (["--layers-per-stage", "3,3,2", "--ckpt-per-stage", "0,0,0", "--microbatches", "2"],
         "at least as many microbatches"),
        # the config file's options beside a profile: dropped before (the degrees set the GPUs, the profile the kind)
        (["--layers-per-stage", "3,3,2", "--ckpt-per-stage", "0,0,0", "--gpus", "16"],
         "--gpus goes with --from-megatron/--from-torchtitan"),
        (["--layers-per-stage", "3,3,2", "--ckpt-per-stage", "0,0,0", "--gpu", "b200"],
         "--gpu goes with --from-megatron/--from-torchtitan"),
    ],
)
def test_evaluate_refuses_in_one_sentence(profile_path, args, message):
    result = run("evaluate", "--profile", str(profile_path), "--mem", "1GB", *args)
    assert result.exit_code == 1 and message in result.output


def test_no_mem_and_no_gpu_in_the_profile(profile_path):
    with pytest.raises(UserError, match="give --mem"):
        from planner.commands.setup_options import build_setup

        build_setup(io.load_profile(profile_path), stages=2, mem=None, microbatches=None, schedule="1F1B",
                    optimizer="adam", precision="fp32", parallel_stages=None)


def test_colossalais_llama3_70b_configuration_on_the_analytic_profile(tmp_path):
    """ColossalAI's hand configuration for LLaMA3-70B on 4 stages: decoder layers
    [19, 20, 20, 21], the first [19, 19, 19, 13] of each checkpointed."""
    path = tmp_path / "l70.json"
    made = run("profile", "--arch", "llama3-70b", "--seq-len", "8192", "--micro-batch-size", "1", "--tp", "8",
               "--sp", "--gpu", "h100", "--out", str(path))
    assert made.exit_code == 0, made.output
    result = run("evaluate", "--profile", str(path), "--microbatches", "16", "--precision", "bf16-mixed",
                 "--layers-per-stage", "19,20,20,21", "--ckpt-per-stage", "19,19,19,13", "--json")
    assert result.exit_code == 0, result.output
    assert "--mem not given: 78.8 GiB per device" in result.stderr  # the H100 80GB's usable memory
    hand = json.loads(result.stdout)["hand"]
    assert [len(s["layers"]) for s in hand["stages"]] == [20, 20, 20, 22]  # + embedding, + norm/head
    assert [len(s["checkpointed"]) for s in hand["stages"]] == [19, 19, 19, 13]
    assert hand["stages"][3]["checkpointed"][0] == "layers.59" and hand["stages"][3]["checkpointed"][-1] == "layers.71"
    assert json.loads(result.stdout)["ckplan"]["iteration_ms"] <= hand["iteration_ms"]
