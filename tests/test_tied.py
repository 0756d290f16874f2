"""Parameters shared between pipeline layers: found by identity, refused when only
their memory is shared, and placed on the stages that must keep them tied."""

from __future__ import annotations

import pytest
import torch
from conftest import ROOT
from torch import nn

from planner.cost.tied import check_tieable, cross_stage, tied_params
from planner.errors import UserError
from planner.models.modelfile import load_model_file, pipeline_layers

TIED = ROOT / "tests" / "fixtures" / "tied_gpt.py"
VOCAB, DIM = 64, 32


def _tied_layers():
    return pipeline_layers(load_model_file(TIED).build_model())


def test_the_shared_embedding_is_found_once_under_both_layers():
    (item,) = tied_params(_tied_layers())
    assert item.names == (("embed", "tokens.weight"), ("head", "weight"))
    assert item.param_count == VOCAB * DIM and item.param_bytes == 4 * VOCAB * DIM


def test_a_model_without_sharing_has_no_tied_params():
    model = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 2))
    assert tied_params(list(model.named_children())) == []


def test_only_sets_split_across_stages_need_tying():
    (item,) = tied_params(_tied_layers())
    together = [["embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "head"]]
    assert cross_stage([item], together) == []
    apart = [["embed", "blocks.0"], ["blocks.1"], ["blocks.2", "blocks.3", "head"]]
    assert cross_stage([item], apart) == [(item, [0, 2])]


def test_a_weight_that_is_a_view_of_another_layers_weight_is_refused():
    first = nn.Linear(4, 4)
    second = nn.Linear(4, 2)
    second.weight = nn.Parameter(first.weight.data[:2])  # same memory, another parameter
    with pytest.raises(UserError, match=r"0\.weight and 1\.weight share memory without being the same parameter"):
        check_tieable([("0", first), ("1", second)])


def test_shared_whole_parameters_and_constant_buffers_are_accepted():
    layers = _tied_layers()
    mask = torch.ones(3)
    layers[1][1].register_buffer("mask", mask)
    layers[2][1].register_buffer("mask", mask)
    check_tieable(layers)


# ---------------------------------------------------------------- cost model


def _tied_profile(sum_ms: float):
    from planner.models.synthetic import layer, profile_of
    from planner.schema import TiedSet

    layers = [
        layer("embed", "Embed", fwd_ms=1, act_mib=1, input_mib=1, param_count=1000, adam_step_ms=2),
        layer("blocks.0", "Block", fwd_ms=2, act_mib=1, input_mib=1, param_count=500, adam_step_ms=1),
        layer("head", "Head", fwd_ms=1, act_mib=1, input_mib=1, param_count=1000, adam_step_ms=2),
    ]
    tied = [TiedSet(layers=["embed", "head"], param_count=1000, param_bytes=4000, sum_ms=sum_ms)] if sum_ms else []
    return profile_of(layers).model_copy(update={"tied": tied})


def test_each_stage_holding_a_tied_copy_is_charged_the_gradient_sum_and_the_copy():
    from planner.cost import costmodel
    from planner.schema import StagePlan, TrainSetup

    # the pipeline's link at 16 MB/s: the fp32 gradient of the 1000 shared parameters (4,000 B), all-reduced
    # between the two stages (a ring of two: each moves 4,000 B), takes 0.25 ms (rules.tied_sum_ms)
    setup = TrainSetup(stages=2, microbatches=2, micro_batch_size=1, mem_caps_bytes=[2**40] * 2,
                       comm={"pp_gb_per_s": 0.016})
    stages = [StagePlan(index=0, layers=["embed", "blocks.0"]), StagePlan(index=1, layers=["head"])]
    untied = costmodel.evaluate(stages, _tied_profile(0.0), setup)
    tied = costmodel.evaluate(stages, _tied_profile(0.5), setup)  # sum_ms, the one-stage add, not read on two
    assert [s.step_ms for s in untied.stages] == [3.0, 2.0]
    assert [s.step_ms for s in tied.stages] == pytest.approx([3.25, 2.25])  # the sum runs on both holders
    # the copy: each holder keeps the 1000 shared parameters' weights, grads and Adam state (16 B each)
    assert [s.static_bytes for s in tied.stages] == [(1000 + 500) * 16, 1000 * 16]


def test_profiles_made_before_tied_sets_load_and_name_only_their_layers():
    from pydantic import ValidationError

    from planner.schema import Profile

    data = _tied_profile(0.0).model_dump()
    del data["tied"]
    assert Profile.model_validate(data).tied == []
    data["tied"] = [{"layers": ["embed", "lm_head"], "param_count": 1, "param_bytes": 4}]
    with pytest.raises(ValidationError, match="tied names layers"):
        Profile.model_validate(data)


def test_profile_refuses_a_model_whose_layers_share_memory_but_not_the_parameter(tmp_path):
    from click.testing import CliRunner

    from planner.cli import cli

    model = tmp_path / "view_tie.py"
    model.write_text(
        "import torch\nfrom torch import nn\n"
        "def build_model():\n"
        "    first, second = nn.Linear(4, 4), nn.Linear(4, 4)\n"
        "    second.weight = nn.Parameter(first.weight.data)\n"
        "    return nn.Sequential(first, nn.Tanh(), second)\n"
        "def example_batch(n):\n    return torch.randn(n, 4), torch.randn(n, 4)\n"
    )
    result = CliRunner().invoke(cli, ["profile", str(model), "--out", str(tmp_path / "p.json")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "0.weight and 2.weight share memory without being the same parameter" in result.output


def test_layers_sharing_a_parameter_are_one_fsdp2_unit():
    """FSDP2 refuses a parameter two fully_shard groups share (torch 2.13: "use fully_shard([module_a,
    module_b])"): the tied embedding and head are one unit, every other layer its own, in order."""
    from planner.runtime.mesh import _units

    layers = [module for _, module in _tied_layers()]
    units = _units(layers)
    assert [len(unit) for unit in units] == [2, 1, 1, 1, 1]
    assert units[0][0] is layers[0] and units[0][1] is layers[-1]


@pytest.mark.slow
def test_a_tied_model_trains_under_zero_3_on_one_stage_like_one_process(tmp_path):
    """Before, ckplan's runtime sharded each layer apart and FSDP2 raised on the head's shared weight; the tied
    layers now one unit, two ranks at ZeRO 3 give one process's losses."""
    from fixtures.cli import run_ok

    from planner import io
    from planner.runtime.checks import prepare
    from planner.runtime.launcher import run_plan
    from planner.runtime.reference import reference_losses

    profile, plan_path = tmp_path / "profile.json", tmp_path / "plan.yaml"
    run_ok("profile", TIED, "--micro-batch-size", "2", "--threads", "1", "--repeats", "1", "--warmup", "1",
           "--out", profile)
    run_ok("solve", "--profile", profile, "--stages", "1", "--dp", "2", "--zero", "3", "--mem", "1GiB",
           "--microbatches", "2", "--out", plan_path)
    plan = io.load_plan(plan_path)
    report = run_plan(plan, plan_file=plan_path, steps=2, warmup_steps=1)
    reference = reference_losses(plan, prepare(plan, plan_file=plan_path), num_steps=len(report.losses), seed=0)
    torch.testing.assert_close(torch.tensor(report.losses), torch.tensor(reference), rtol=1e-6, atol=1e-5)
