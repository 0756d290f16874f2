"""A layer whose input the layer before already saves (a tanh's output, a norm's input): the profile
charges the storage once, to the earlier layer, and records it as the later layer's input_shared_bytes;
the cost model charges it to the later layer, whole where it opens a stage, and nets it out of the
earlier one, so a stage counts it once wherever it is cut (planner/cost/layers.py shared_out), and both
solvers score what evaluate scores. Hand counts: batch 4 x 8 tokens x 16 wide fp32, a tensor 2,048 B;
LayerNorm's mean and rstd 4 x 8 floats each, 128 B."""

from __future__ import annotations

from itertools import product

import pytest
import torch
from torch import nn

from planner.cost import costmodel
from planner.models.synthetic import profile_of
from planner.profiler.saved import saved_bytes
from planner.schema import LayerProfile, TrainSetup
from planner.solve import search

T = 2048  # one 4 x 8 x 16 fp32 tensor


class Squash(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x):
        return torch.tanh(self.proj(x))  # proj saves x, tanh its output: the next layer's input


class Res(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.lin = nn.LayerNorm(16), nn.Linear(16, 16)

    def forward(self, x):
        return x + torch.relu(self.lin(self.norm(x)))  # the norm saves its input x, mean, rstd


def test_the_profile_records_the_input_the_layer_before_saved_as_shared():
    layers = [("0", Squash()), ("1", Res()), ("2", Res())]
    found = saved_bytes(layers, torch.randn(4, 8, 16), torch.zeros(4, 8, 16), nn.functional.mse_loss)
    # 0: x (the batch) + tanh's output; 1: its norm's output, relu's output, mean and rstd (its input is
    # 0's tanh output, charged there); 2: the same and its input, which the add made and no one saved
    assert found.act_bytes == [2 * T, 2 * T + 256, 3 * T + 256]
    assert found.input_in_act_bytes == [T, 0, T]
    assert found.input_shared_bytes == [0, T, 0]


def _profile():
    def one(name, kind, act, in_act, shared, buffers=0):
        return LayerProfile(name=name, kind=kind, fwd_ms=1.0, bwd_ms=2.0, fwd_ms_min=1.0, fwd_ms_max=1.0,
                            bwd_ms_min=2.0, bwd_ms_max=2.0, act_bytes=act, input_bytes=T, output_bytes=T,
                            input_in_act_bytes=in_act, input_shared_bytes=shared, param_count=272,
                            param_bytes=1088, transient_bytes=0, recompute_ms=1.0, buffer_bytes=buffers)
    return profile_of([one("0", "Squash", 2 * T, T, 0, buffers=512), one("1", "Res", 2 * T + 256, 0, T),
                       one("2", "Res", 3 * T + 256, T, 0), one("3", "Res", 3 * T + 256, T, 0)])


def test_each_layer_is_charged_its_own_bytes_and_the_stage_counts_the_shared_storage_once():
    layers = costmodel.layer_costs(_profile())
    # 0 net of its tanh output (1 pays it); every Res whole, its input its own
    assert [layer.act_bytes for layer in layers] == [T, 3 * T + 256, 3 * T + 256, 3 * T + 256]
    assert [layer.input_in_act_bytes for layer in layers] == [T, T, T, T]
    assert layers[0].recompute_peak_bytes == T  # recomputed, 0 saves its tanh output again
    setup = TrainSetup(stages=2, microbatches=4, micro_batch_size=4, mem_caps_bytes=[2**30] * 2)

    def kept(first, last, stage):
        return costmodel.stage_cost(layers[first:last], [0] * (last - first), stage=stage, profile=_profile(),
                                    setup=setup).kept_bytes
    # stage 0 of 0-1: tanh's output once, 1's other three, 1's output waiting (the batch is in buffers)
    assert kept(0, 2, 0) == T + (2 * T + 256) + T
    # stage 1 opening at 1: its input in the receive buffer, its three, 2's four, 2's output waiting;
    # before, 1 took the kind's 3 T + 256 and opened a stage at the kind's least input (0): T over
    assert kept(1, 3, 1) == (2 * T + 256) + (3 * T + 256) + T
    # cut between 0 and 1: 0 keeps its tanh output, the stage output that same tensor: once
    assert kept(0, 1, 0) == T


@pytest.mark.parametrize("stages, fraction", [(2, 0.3), (2, 0.7), (3, 0.5)])
def test_the_solvers_score_the_shared_storage_as_evaluate_does(stages, fraction):
    """Brute force over every cut and every layer's none or full: the least iteration that fits is the
    DP's and the MILP's, each scored by evaluate."""
    profile = _profile()
    roomy = TrainSetup(stages=stages, microbatches=2 * stages, micro_batch_size=4, mem_caps_bytes=[2**30] * stages)
    n = len(profile.layers)
    plans = []
    for cuts in product(range(1, n), repeat=stages - 1):
        starts = [0, *cuts]
        if starts != sorted(set(starts)):
            continue
        for mask in product((0, 1), repeat=n):
            plans.append(costmodel.split_to_stages(starts, list(mask), profile))
    peaks = [costmodel.evaluate(plan, profile, roomy).peak_bytes_per_stage for plan in plans]
    low, high = min(max(p) for p in peaks), max(max(p) for p in peaks)
    setup = roomy.model_copy(update={"mem_caps_bytes": [int(low + fraction * (high - low))] * stages})
    best = min(cost.iteration_ms for cost in (costmodel.evaluate(plan, profile, setup) for plan in plans)
               if cost.feasible)
    for solver in ("dp", "milp"):
        found = search.plan(profile, setup, solver=solver, mip_gap=0.0, threads=1)
        assert found.cost.feasible and found.cost.iteration_ms == pytest.approx(best, rel=1e-9), solver
        assert found.cost.iteration_ms == costmodel.evaluate(found.stages, profile, setup).iteration_ms


def test_a_layers_registered_buffers_are_on_its_stage_all_along():
    """The CPU runtime's MemTracker counts a module's buffers (torch 2.13.0 mem_tracker.py 573-618); a table of
    8 x 16 fp32 registered on the first layer, used or not, is 512 B on stage 0 and nowhere else."""
    from planner.profiler.kinds import buffer_bytes

    squash = Squash()
    squash.register_buffer("table", torch.zeros(8, 16))
    squash.register_buffer("view", squash.table[:4])  # a view of it: the same storage, once
    assert buffer_bytes(squash) == 512 and buffer_bytes(Res()) == 0
    profile = _profile()
    bare = profile.model_copy(update={"layers": [item.model_copy(update={"buffer_bytes": 0}) for item in profile.layers]})
    setup = TrainSetup(stages=2, microbatches=4, micro_batch_size=4, mem_caps_bytes=[2**30] * 2)
    plan = costmodel.split_to_stages([0, 2], [0] * 4, profile)
    with_table, without = (costmodel.evaluate(plan, p, setup).peak_bytes_per_stage for p in (profile, bare))
    assert [a - b for a, b in zip(with_table, without)] == [512, 0]


def test_a_chain_of_one_kind_is_not_one_run_where_its_last_layer_keeps_its_output():
    """Five Squash layers, each saving its input (the tanh output the layer before saved) and its own tanh output:
    every layer but the last is charged net of its output (the next pays it), the last keeps it, so the five are
    not interchangeable. The MILP took them as one run at the first layer's numbers, 1 MiB a microbatch under
    evaluate on the stage holding the last, and handed a plan over its cap (SolverMismatch)."""
    big = 2**20

    def one(name, act, in_act, shared):
        return LayerProfile(name=name, kind="Squash", fwd_ms=1.0, bwd_ms=2.0, fwd_ms_min=1.0, fwd_ms_max=1.0,
                            bwd_ms_min=2.0, bwd_ms_max=2.0, act_bytes=act, input_bytes=big, output_bytes=big,
                            input_in_act_bytes=in_act, input_shared_bytes=shared, param_count=272,
                            param_bytes=1088, transient_bytes=0, recompute_ms=1.0)
    profile = profile_of([one("0", 2 * big, big, 0), *(one(str(i), big, 0, big) for i in range(1, 5))])
    assert [layer.act_bytes for layer in costmodel.layer_costs(profile)] == [big] * 4 + [2 * big]
    roomy = TrainSetup(stages=2, microbatches=4, micro_batch_size=4, mem_caps_bytes=[2**30] * 2)
    plans = [costmodel.split_to_stages([0, cut], list(mask), profile) for cut in range(1, 5)
             for mask in product((0, 1), repeat=5)]
    # stage 1's cap a little under its peak with layers 2-4 as they run (the last layer's output once)
    need = costmodel.evaluate(costmodel.split_to_stages([0, 2], [0] * 5, profile), profile, roomy).peak_bytes_per_stage[1]
    setup = roomy.model_copy(update={"mem_caps_bytes": [2**30, need + costmodel.FIT_MARGIN_BYTES - 300_000]})
    best = min(cost.iteration_ms for cost in (costmodel.evaluate(plan, profile, setup) for plan in plans)
               if cost.feasible)
    for solver in ("dp", "milp"):
        found = search.plan(profile, setup, solver=solver, mip_gap=0.0, threads=1)
        assert found.cost.feasible and found.cost.iteration_ms == pytest.approx(best, rel=1e-9), solver


def test_a_shared_input_larger_than_what_the_layer_before_kept_is_refused_in_one_sentence(tmp_path):
    """The cost model nets a layer's input_shared_bytes out of the layer before it; a profile whose figure is more
    than that layer kept (10 x layer 0's 4,096 B) was read, layer 0 charged -36,864 B and stage 0's peak under-said
    without a word. Now the file is refused, as another invalid profile is; the first layer can share nothing."""
    import json

    from click.testing import CliRunner

    from planner.cli import cli

    data = json.loads(_profile().model_dump_json())
    for layer, shared, said in ((1, 10 * 2 * T, "layer 1's input_shared_bytes 40,960 is more than the layer before "
                                                "it saved (layer 0 keeps 4,096)"),
                                (0, T, "layer 0's input_shared_bytes 2,048 is more than the layer before it saved "
                                       "(it is the first layer)")):
        bad = json.loads(json.dumps(data))
        bad["layers"][layer]["input_shared_bytes"] = shared
        path = tmp_path / f"bad{layer}.json"
        path.write_text(json.dumps(bad))
        result = CliRunner().invoke(cli, ["solve", "--profile", str(path), "--stages", "2", "--microbatches", "4",
                                          "--mem", "1GiB", "--out", str(tmp_path / "plan.yaml")])
        assert result.exit_code != 0 and said in result.output and "Traceback" not in result.output, result.output
    fine = tmp_path / "fine.json"
    fine.write_text(json.dumps(data))  # layer 1's 2,048 B, of layer 0's 4,096: read
    result = CliRunner().invoke(cli, ["solve", "--profile", str(fine), "--stages", "2", "--microbatches", "4",
                                      "--mem", "1GiB", "--out", str(tmp_path / "plan.yaml")])
    assert result.exit_code == 0, result.output
