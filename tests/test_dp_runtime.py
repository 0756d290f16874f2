"""Data parallelism in the runtime: the rank layout and its process groups, DP x PP training
equal to one process, static memory per ZeRO stage and shard group, optimizer offload equal
to the optimizer it replaces."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from click.testing import CliRunner
from conftest import ROOT
from fixtures.cli import run_ok
from fixtures.rt_plans import make_plan

from planner import io
from planner.cli import cli
from planner.cost import dataparallel
from planner.runtime import run_plan
from planner.runtime.mesh import Layout, device_mesh
from planner.runtime.offload import OffloadOptimizer
from planner.runtime.reference import against_reference
from planner.schema import TrainSetup

DP_TINY = ROOT / "tests" / "fixtures" / "dp_tiny.py"
TIED = ROOT / "tests" / "fixtures" / "tied_gpt.py"
DP_WIDE = ROOT / "tests" / "fixtures" / "dp_wide.py"
BLOCK_PARAMS = 32 * 32 + 32  # one Linear(32, 32)
ADAM_STEP_BYTES = 4  # Adam's step count: a float32 scalar tensor per parameter tensor it steps


def test_layout_dp4_shard_group2():
    layout = Layout(stages=2, dp=4, shard=2)
    assert layout.shard_groups(0) == [[0, 1], [2, 3]] and layout.replica_groups(0) == [[0, 2], [1, 3]]
    assert layout.shard_groups(1) == [[4, 5], [6, 7]] and layout.replica_groups(1) == [[4, 6], [5, 7]]
    assert layout.pipelines() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert [layout.stage_of(rank) for rank in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_device_mesh_process_groups_dp4_shard_group2():
    """The groups torch's device mesh makes for each of 4 ranks are the ones the layout names.
    Each rank's view is made in this process over torch's fake process group (the groups are
    the mesh's arithmetic, whatever the backend); 4 gloo processes on this layout train like one
    process in test_dp_x_pp_trains_like_one_process_and_holds_the_predicted_static_memory (dp 4,
    shard group 2)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    layout = Layout(stages=1, dp=4, shard=2)
    found = {}
    for rank in range(4):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=4)
        try:
            mesh = device_mesh(layout, "cpu")
            found[rank] = {dim: dist.get_process_group_ranks(mesh[dim].get_group()) for dim in ("shard", "replicate")}
        finally:
            dist.destroy_process_group()
    for rank, groups in found.items():
        assert groups["shard"] == next(group for group in layout.shard_groups(0) if rank in group)
        assert groups["replicate"] == next(group for group in layout.replica_groups(0) if rank in group)
    assert found[0] == {"shard": [0, 1], "replicate": [0, 2]} and found[3] == {"shard": [2, 3], "replicate": [1, 3]}


def _dp_plan(stages: int, *, dp: int, zero: int, shard_group: int | None, offload: bool = False,
             zero_gather: str = "per-microbatch"):
    per_stage = 8 // stages
    plan = make_plan(DP_TINY, [[str(i) for i in range(s * per_stage, (s + 1) * per_stage)] for s in range(stages)],
                     microbatches=2)
    plan.setup = TrainSetup.model_validate({**plan.setup.model_dump(), "dp": dp, "zero": zero,
                                            "shard_group": shard_group, "offload": offload,
                                            "zero_gather": zero_gather})
    return plan


# (stages, dp, zero, shard group, zero_gather, offload, static bytes per rank by hand: the most a
# stage's rank holds at once in a step). A stage of 4 blocks has 4 x 1056 parameters in 8
# tensors; Adam fp32 is 4 + 4 + 8 bytes per parameter
CASES = [
    # ZeRO 1 over 2 ranks: the optimizer state of 2 weights + 2 biases each
    (2, 2, 1, 2, "per-microbatch", False, 4 * BLOCK_PARAMS * (4 + 4 + 8 / 2) + 4 * ADAM_STEP_BYTES),
    # ZeRO 3 (FSDP2) over 2 ranks, reduced and resharded every microbatch: everything halved
    (2, 2, 3, 2, "per-microbatch", False, 4 * BLOCK_PARAMS * (4 + 4 + 8) / 2 + 8 * ADAM_STEP_BYTES),
    # the same as torch's pipeline schedule runs it: after a backward the weights' shards (4 / 2),
    # the weights gathered (4) and the gradients whole (4) until the last backward, the optimizer's shard
    (2, 2, 3, 2, "per-iteration", False, 4 * BLOCK_PARAMS * (4 / 2 + 4 + 4 + 8 / 2) + 8 * ADAM_STEP_BYTES),
    # ZeRO 2 as HSDP, dp 4 in 2 shard groups of 2, one stage of all 8 blocks: in the second
    # microbatch's forward the weights gathered (4) beside their shards (4 / 2), the gradients'
    # shards from the first (4 / 2), the optimizer's shard
    (1, 4, 2, 2, "per-microbatch", False, 8 * BLOCK_PARAMS * (4 + 4 / 2 + 4 / 2 + 8 / 2) + 16 * ADAM_STEP_BYTES),
    # ZeRO 3 as HSDP, the same groups: everything halved
    (1, 4, 3, 2, "per-microbatch", False, 8 * BLOCK_PARAMS * (4 + 4 + 8) / 2 + 16 * ADAM_STEP_BYTES),
    # ZeRO 0 with the optimizer on the host: weights and gradients stay on the device
    (2, 2, 0, None, "per-microbatch", True, 4 * BLOCK_PARAMS * (4 + 4)),
]


@pytest.mark.slow
@pytest.mark.parametrize(("stages", "dp", "zero", "shard_group", "zero_gather", "offload", "static_bytes"), CASES)
def test_dp_x_pp_trains_like_one_process_and_holds_the_predicted_static_memory(
        stages, dp, zero, shard_group, zero_gather, offload, static_bytes):
    plan = _dp_plan(stages, dp=dp, zero=zero, shard_group=shard_group, offload=offload, zero_gather=zero_gather)
    report = run_plan(plan, plan_file=None, steps=1, warmup_steps=1)
    diffs = against_reference(plan, report, plan_file=None, seed=0)
    assert len(diffs) == 3 and all(diff.ok for diff in diffs), diffs
    params = 8 // stages * BLOCK_PARAMS
    # the cost model's (with FSDP2's 1/K shard of the weights beside the weights it gathers)
    predicted = params * dataparallel.bytes_per_param(plan.setup)
    assert max(stage.measured.static_bytes for stage in report.stages) == static_bytes
    assert all(abs(stage.measured.static_bytes - predicted) <= 0.05 * predicted for stage in report.stages)
    host = 4 * BLOCK_PARAMS * (4 + 4 + 8)  # fp32 master, its gradient, Adam's m and v
    assert all(stage.measured.host_bytes == (host + 8 * ADAM_STEP_BYTES if offload else 0)
               for stage in report.stages)


@pytest.fixture(scope="module")
def wide_profile(tmp_path_factory):
    """dp_wide.py profiled once for both ZeRO stages (a profile does not depend on them)."""
    profile = tmp_path_factory.mktemp("dp_wide") / "profile.json"
    run_ok("profile", DP_WIDE, "--micro-batch-size", "1", "--threads", "1", "--repeats", "2", "--out", profile)
    return profile


@pytest.mark.slow
@pytest.mark.xdist_group("wide_profile")  # one worker profiles it once for both
@pytest.mark.parametrize("zero", [2, 3])
def test_zero2_zero3_peak_holds_to_the_prediction(tmp_path, wide_profile, zero):
    """Profile, solve and run ZeRO 2/3 as HSDP (dp 4 in 2 shard groups of 2) on blocks whose
    parameters outweigh their activations: the measured peak is the prediction's, FSDP2's units charged
    per moment (planner/cost/fsdpunits.py; the largest layer's constant term was 5% and 9% over). ZeRO 2
    peaks at the last block's copy-out with its all-gather output and the one before; 0.7% under here,
    the batch each rank draws whole (4 x 64 KiB; the batch term charges a rank's slice)."""
    profile, plan_path = wide_profile, tmp_path / "plan.yaml"
    run_ok("solve", "--profile", profile, "--stages", "1", "--mem", "1GB", "--microbatches", "4", "--dp", "4",
           "--zero", zero, "--shard-group", "2", "--out", plan_path)
    plan = io.load_plan(plan_path)
    report = run_plan(plan, plan_file=plan_path, steps=1, warmup_steps=1)
    for stage in report.stages:
        measured, predicted = stage.measured.peak_bytes, stage.predicted.peak_bytes
        assert abs(measured - predicted) <= 0.02 * predicted, (measured, predicted)


@pytest.mark.slow
def test_launch_dp_with_tied_weights_trains_like_one_process(tmp_path):
    """`ckplan launch --dp 2 --reference`: 2 stages sharing the embedding, 2 replicas (a tie
    group per replica, summing matching FSDP2 shards under ZeRO 3), the whole batch in one process."""
    plan = make_plan(TIED, [["embed", "blocks.0", "blocks.1"], ["blocks.2", "blocks.3", "head"]], microbatches=2)
    plan.setup = TrainSetup.model_validate({**plan.setup.model_dump(), "zero": 3})  # sharded over all --dp ranks
    path = tmp_path / "plan.yaml"
    io.save_plan(plan, path)
    result = CliRunner().invoke(cli, ["launch", str(path), "--dp", "2", "--steps", "1", "--warmup-steps", "1",
                                      "--reference"])
    assert result.exit_code == 0, result.output
    assert "x dp 2 (ZeRO 3, shard group 2)" in result.output and "trains like one process" in result.output
    assert "not run" not in result.output  # no warning that data parallelism is left out


def test_launch_dp_must_fit_the_shard_group(tmp_path):
    plan = _dp_plan(2, dp=4, zero=3, shard_group=4)
    path = tmp_path / "plan.yaml"
    io.save_plan(plan, path)
    result = CliRunner().invoke(cli, ["launch", str(path), "--dp", "2"])
    assert result.exit_code == 1 and "--dp 2 does not fit the plan" in result.output, result.output


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_offload_steps_exactly_like_the_optimizer_it_replaces(optimizer):
    """Three chunks of whole tensors (chunk_params below one layer), five steps: bit for bit
    the same weights as the optimizer stepping on the device."""
    from planner.cost.optimizers import make_optimizer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
    twin = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
    twin.load_state_dict(model.state_dict())
    offloaded = OffloadOptimizer(model.parameters(), optimizer=optimizer, chunk_params=40)
    assert len(offloaded._chunks) == 3  # [w0 (64)], [b0, w1 (8 + 32)], [b1]
    plain = make_optimizer(optimizer, twin.parameters())
    initial = [param.detach().clone() for param in model.parameters()]
    for _ in range(5):
        x = torch.randn(4, 8)
        for net, opt in ((model, offloaded), (twin, plain)):
            opt.zero_grad()
            net(x).square().mean().backward()
            opt.step()
    for got, want in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(got, want)
    assert not any(torch.equal(got, before) for got, before in zip(model.parameters(), initial, strict=True))


@pytest.mark.cuda
def test_overlapped_offload_on_cuda_steps_like_the_optimizer_on_the_device():
    """The CUDA path (pinned host copies, two copy streams, chunk by chunk): the same weights
    as Adam on the GPU, up to the host's and the GPU's float rounding. Not run without a GPU."""
    from planner.cost.optimizers import make_optimizer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8)).cuda()
    twin = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8)).cuda()
    twin.load_state_dict(model.state_dict())
    offloaded = OffloadOptimizer(model.parameters(), optimizer="adam", chunk_params=64)
    assert offloaded.cuda and len(offloaded._chunks) == 4
    plain = make_optimizer("adam", twin.parameters())
    for _ in range(5):
        x = torch.randn(16, 64, device="cuda")
        for net, opt in ((model, offloaded), (twin, plain)):
            opt.zero_grad()
            net(x).square().mean().backward()
            opt.step()
    for got, want in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(got, want)
