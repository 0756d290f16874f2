"""Frozen parameters (requires_grad False): the profile records each layer's trained count, the static term holds
a frozen parameter's weights alone (no gradient, no optimizer state: §710), and the runtime trains such a model
(torch 2.13's MemTracker hooks every parameter of a module it follows: §711)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fixtures.cli import run_ok
from test_costmodel import four_layers, setup, stage_of

from planner import io
from planner.cost import costmodel, dataparallel, frozen, rules
from planner.cost.layers import layer_costs
from planner.runtime.memtrack import PeakMemory


def _frozen_four(*names: str):
    """test_costmodel's four layers, `names` frozen whole (trained_param_count 0), the rest trained (their count)."""
    profile = four_layers()
    layers = [layer.model_copy(update={"trained_param_count": 0 if layer.name in names else layer.param_count})
              for layer in profile.layers]
    return profile.model_copy(update={"layers": layers})


@pytest.mark.parametrize("changes, frozen_bytes, trained_bytes", [
    ({}, 4, 16),  # fp32 Adam: 4 weights; + 4 gradient + 8 (m, v)
    ({"dp": 4, "zero": 1}, 4, 4 + 4 + 8 / 4),  # the optimizer state sharded over 4
    ({"dp": 4, "zero": 3}, 1, 16 / 4),  # everything sharded: a frozen shard 4 / 4
    ({"precision": "bf16-mixed", "dp": 4, "zero": 2}, 2 + 2 / 4, None),  # FSDP2's gathered weights + its shard
])
def test_a_stage_holds_frozen_weights_alone(changes, frozen_bytes, trained_bytes):
    """embed (65,536) and blocks.0 (131,072) frozen on stage 0, blocks.1 (same kind, trained) and head (32,768) on
    stage 1: by hand, 196,608 x the weights' bytes, and 163,840 x every byte a trained parameter holds."""
    profile, s = _frozen_four("embed", "blocks.0"), setup(2, **changes)
    assert stage_of(profile, s, 0, ["embed", "blocks.0"], []).static_bytes == pytest.approx(196608 * frozen_bytes)
    trained = costmodel.bytes_per_param(s) if trained_bytes is None else trained_bytes
    assert stage_of(profile, s, 1, ["blocks.1", "head"], []).static_bytes == pytest.approx(163840 * trained)


@pytest.mark.parametrize("changes", [{}, {"dp": 4, "zero": 1, "offload": True}, {"dp": 4, "zero": 2},
                                     {"precision": "bf16-mixed", "dp": 4, "zero": 3}])
def test_a_trained_parameter_holds_a_frozen_ones_weights_and_more(changes):
    """What a frozen parameter is spared and its weights make bytes_per_param whole, under every sharding."""
    s = setup(1, **changes)
    spared = frozen.trained_bytes_per_param(s)
    frozen_profile = _frozen_four("head")
    head = stage_of(frozen_profile, s, 0, ["head"], []).static_bytes
    assert 0 < spared < costmodel.bytes_per_param(s)
    assert head == pytest.approx(32768 * (costmodel.bytes_per_param(s) - spared))


def test_a_profile_without_trained_counts_trains_every_parameter():
    """Analytic profiles and those made before the field: every parameter charged as trained, as before."""
    assert [layer.frozen_param_count for layer in layer_costs(four_layers())] == [0, 0, 0, 0]
    frozen_layers = layer_costs(_frozen_four("blocks.0"))  # blocks.1 is of its kind, and trained
    assert [layer.frozen_param_count for layer in frozen_layers] == [0, 131072, 0, 0]


def test_the_tracker_follows_a_stage_holding_frozen_parameters():
    """torch's MemTracker registered a gradient hook on the frozen weight and raised ("cannot register a hook on a
    tensor that doesn't require gradient"); now the stage is followed by its tensors, its peak counted."""
    module = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 16))
    module[0].requires_grad_(False)
    with PeakMemory("cpu", external=[module]) as mem:
        module(torch.randn(4, 16)).sum().backward()
    assert module[0].weight.grad is None and module[1].weight.grad is not None
    assert mem.peak_bytes >= 2 * (16 * 16 + 16) * 4 + (16 * 16 + 16) * 4  # both weights, the trained gradient


FROZEN_FILE = Path(__file__).parent / "fixtures" / "frozen_mlp.py"


@pytest.fixture(scope="module")
def frozen_plan(tmp_path_factory):
    folder = tmp_path_factory.mktemp("frozen")
    (folder / "frozen.py").write_text(FROZEN_FILE.read_text())
    said = run_ok("profile", folder / "frozen.py", "--micro-batch-size", "2", "--threads", "1", "--repeats", "1",
                  "--warmup", "0", "--out", folder / "p.json").output
    run_ok("solve", "--profile", folder / "p.json", "--mem", "100MiB", "--stages", "2", "--microbatches", "2",
           "--out", folder / "plan.yaml")
    return folder, " ".join(said.split())


def test_profile_records_trained_counts_and_the_plan_charges_frozen_ones_their_weights(frozen_plan):
    """Layer 0 (72 frozen), layer 2 (its weight's 64 trained, its bias's 8 frozen), layer 3 (18 trained): stage 0
    holds 72 x 4 B; stage 1 (8 x 4 + 82 x 16 = 1,344 B) and Adam's step count on the CPU for each of its 2 + 1
    trained tensors (stepcounts.py)."""
    folder, said = frozen_plan
    assert "layers 0, 2 hold 80 parameters with requires_grad False: charged as frozen" in said, said
    profile = io.load_profile(folder / "p.json")
    assert [(layer.param_count, layer.trained_param_count) for layer in profile.layers] == [
        (72, 0), (0, 0), (72, 64), (18, 18)]
    plan = io.load_plan(folder / "plan.yaml")
    # by hand, a layer: frozen x 4 B + trained x 16 B + 4 B (Adam's fp32 step count on the CPU) a trained tensor
    held = {"0": 72 * 4, "1": 0, "2": 8 * 4 + 64 * 16 + 4, "3": 18 * 16 + 2 * 4}
    assert len(plan.stages) == 2
    assert [stage.predicted.static_bytes for stage in plan.stages] == [sum(held[name] for name in stage.layers)
                                                                       for stage in plan.stages]


@pytest.mark.slow
def test_a_launch_trains_a_frozen_model_as_one_process_does(frozen_plan):
    """`launch --reference` stopped at the first stage holding a frozen parameter (MemTracker's gradient hook); now
    it trains, each rank's measured static equals the plan's (frozen weights alone: no gradient, no Adam state)."""
    folder, _ = frozen_plan
    result = run_ok("launch", folder / "plan.yaml", "--steps", "1", "--warmup-steps", "0", "--reference",
                    "--report", folder / "run.json")
    assert "the pipeline trains like one process" in result.output, result.output
    report, plan = io.load_report(folder / "run.json"), io.load_plan(folder / "plan.yaml")
    assert [stage.measured.static_bytes for stage in report.stages] == [stage.predicted.static_bytes
                                                                       for stage in plan.stages]


LINK = dict(shard_gb_per_s=1.0, overlap_grad_reduce=False)  # 1 GB/s, each collective exposed


@pytest.mark.parametrize("changes, frozen_ms, trained_ms", [
    # ZeRO 0: a ring all-reduce of 131,072 x 4 B over 2 ranks moves 2 x 1/2 of it: 524,288 B at 1 GB/s
    ({"dp": 2}, 0.0, 0.524288),
    # ZeRO 1: a reduce-scatter (1/2 of 524,288 B) and ZeroRedundancyOptimizer's send of its stepped weights (as much)
    ({"dp": 2, "zero": 1}, 0.0, 0.262144 + 0.262144),
    # FSDP2 (ZeRO 2): the frozen weight is gathered like the trained one (262,144 B), its reduce-scatter hides
    ({"dp": 2, "zero": 2}, 0.262144, 0.262144),
])
def test_a_frozen_layer_reduces_no_gradient(changes, frozen_ms, trained_ms):
    """blocks.0 frozen, blocks.1 of its kind trained: the step row's collectives of each, by hand (§729)."""
    costs = {layer.name: layer for layer in layer_costs(_frozen_four("blocks.0"))}
    s = setup(1, **changes, **LINK)
    assert rules.layer_step_ms(costs["blocks.0"], s) == pytest.approx(frozen_ms, abs=1e-12)
    assert rules.layer_step_ms(costs["blocks.1"], s) == pytest.approx(trained_ms)


def test_an_offloaded_optimizer_copies_no_frozen_parameter():
    """ZeRO 1 with the optimizer on the host: the frozen layer has nothing to copy nor step; the trained one its
    offload_ms beside its reduce-scatter and send (0.262144 ms each, as above)."""
    costs = {layer.name: layer for layer in layer_costs(_frozen_four("blocks.0"))}
    s = setup(1, dp=2, zero=1, offload=True, host_gb_per_s=1.0, host_step_ns_per_param=10.0, **LINK)
    assert rules.layer_step_ms(costs["blocks.0"], s) == 0.0
    assert rules.layer_step_ms(costs["blocks.1"], s) == pytest.approx(2 * 0.262144 + dataparallel.offload_ms(131072, s))


def test_zero_one_partitions_the_trained_tensors_alone():
    """Four single-tensor layers, embed and blocks.0 frozen, dp 4 ZeRO 1 (fp32 Adam): ZeroRedundancyOptimizer
    partitions blocks.1 (131,072) and head (32,768), so one rank steps blocks.1 whole: 131,072 x 8 B of Adam state,
    where an even 1/4 of the trained 163,840 is 327,680 B; the excess 720,896 B (with frozen ones counted, 1/4 of
    360,448 would have left 327,680). Static, by hand: 196,608 x 4 + 163,840 x (4 + 4 + 8 / 4) + 720,896."""
    profile = _frozen_four("embed", "blocks.0")
    profile = profile.model_copy(update={"layers": [layer.model_copy(update={"largest_param_count": layer.param_count})
                                                    for layer in profile.layers]})
    names = ["embed", "blocks.0", "blocks.1", "head"]
    assert stage_of(profile, setup(1, dp=4, zero=1), 0, names, []).static_bytes == pytest.approx(
        196608 * 4 + 163840 * 10 + 720896)


def _whole_tensors(*frozen_names: str):
    """_frozen_four with each layer one tensor (largest_param_count its param_count)."""
    profile = _frozen_four(*frozen_names)
    return profile.model_copy(update={"layers": [layer.model_copy(update={"largest_param_count": layer.param_count})
                                                 for layer in profile.layers]})


def test_zero_one_takes_the_largest_trained_tensor():
    """blocks.0 and blocks.1 (131,072 each) frozen, embed (65,536) and head (32,768) trained, dp 4 ZeRO 1: the rank
    holding embed keeps its Adam state whole, (65,536 - 98,304 / 4) x 8 = 327,680 B beyond the even share; with the
    frozen blocks' tensor taken as the largest it was (131,072 - 24,576) x 8 = 851,968 B. Static, by hand:
    262,144 x 4 + 98,304 x (4 + 4 + 8 / 4) + 327,680."""
    names = ["embed", "blocks.0", "blocks.1", "head"]
    static = stage_of(_whole_tensors("blocks.0", "blocks.1"), setup(1, dp=4, zero=1), 0, names, []).static_bytes
    assert static == pytest.approx(262144 * 4 + 98304 * 10 + 327680)


@pytest.mark.parametrize("solver", ["dp", "milp"])
def test_the_solvers_charge_frozen_parameters_as_the_score_does(tmp_path, solver):
    """dp 4 ZeRO 1 at 1 GB/s over the four single-tensor layers, embed and blocks.0 frozen: each solver's plan
    predicts, stage by stage, the static bytes and step time stage_cost scores its split at (no frozen reduction,
    ZeRO 1's whole tensors among the trained ones alone)."""
    profile = _frozen_four("embed", "blocks.0")
    profile = profile.model_copy(update={"layers": [layer.model_copy(update={"largest_param_count": layer.param_count})
                                                    for layer in profile.layers]})
    io.save_profile(profile, tmp_path / "p.json")
    run_ok("solve", "--profile", tmp_path / "p.json", "--mem", "1GiB", "--stages", "2", "--microbatches", "4",
           "--dp", "4", "--zero", "1", "--shard-bandwidth", "1", "--solver", solver, "--out", tmp_path / "plan.yaml")
    plan = io.load_plan(tmp_path / "plan.yaml")
    s = plan.setup
    for stage in plan.stages:
        scored = stage_of(profile, s, stage.index, stage.layers, stage.checkpointed)
        assert stage.predicted.static_bytes == pytest.approx(scored.static_bytes)
        assert stage.predicted.step_ms == pytest.approx(scored.step_ms)


@pytest.mark.slow
def test_a_zero_one_launch_holds_the_trained_tensors_partition(frozen_plan):
    """dp 2 ZeRO 1 on one stage: ZeroRedundancyOptimizer partitions the 3 trained tensors (64; 16 and 2) over the 2
    ranks, so rank 0 holds the 80 frozen x 4 B, the 82 trained weights and gradients x 8 B, Adam's m and v of its
    64 (x 8 B) and one step count (4 B): 1,492 B, measured. The plan charges exactly that (zeroone.py: the fullest
    rank's partition, its step counts its own; before, the other rank's two step counts too, 8 B over). With the
    frozen ones in the even share (162 / 2 > 64) it charged no whole tensor: 1,316 B, 176 under."""
    folder, _ = frozen_plan
    run_ok("solve", "--profile", folder / "p.json", "--mem", "100MiB", "--stages", "1", "--microbatches", "2",
           "--dp", "2", "--zero", "1", "--out", folder / "z1.yaml")
    run_ok("launch", folder / "z1.yaml", "--steps", "1", "--warmup-steps", "0", "--report", folder / "z1.json")
    measured = io.load_report(folder / "z1.json").stages[0].measured.static_bytes
    assert measured == 80 * 4 + 82 * 8 + 64 * 8 + 4
    assert io.load_plan(folder / "z1.yaml").stages[0].predicted.static_bytes == measured
