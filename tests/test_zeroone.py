"""ZeRO 1 on ckplan's runtime: ZeroRedundancyOptimizer's whole-tensor partition (planner/cost/zeroone.py), charged
exactly where the profile records each trained tensor's size, in evaluate, the DP and the MILP alike."""

from __future__ import annotations

import pytest
from export_plans import llm_profile

from planner.cost import costmodel, zeroone
from planner.models.synthetic import layer, profile_of
from planner.schema import TrainSetup
from planner.solve import search

MIB = 2**20


def setup(**fields) -> TrainSetup:
    base = dict(stages=1, microbatches=4, micro_batch_size=1, mem_caps_bytes=[2**50], dp=2, zero=1)
    return TrainSetup(**(base | fields))


def test_the_partition_is_greedy_largest_first():
    # torch 2.13 _partition_parameters: sorted by numel, each to the first rank with the fewest elements so far
    assert zeroone.greedy_loads([2, 3, 2, 3, 2], 2) == [[3, 2, 2], [3, 2]]
    assert zeroone.greedy_loads([1, 1, 1, 1, 1, 5], 2) == [[5], [1, 1, 1, 1, 1]]
    assert zeroone.greedy_loads([4, 4, 4], 3) == [[4], [4], [4]]


def test_the_fullest_rank_by_hand():
    # fp32 Adam: o = 8 B an element, a step count 4 B a tensor; static charges every rank o x 12 / 2 = 48 and 5 counts
    fp32 = setup()
    # [3, 3, 2, 2, 2]: rank 0 holds 3 + 2 + 2 = 7 elements (56 B) and 3 counts; rank 1 5 and 2
    assert zeroone.excess_bytes([3, 3, 2, 2, 2], param_count=12, largest=3, setup=fp32) == 56 - 48
    assert zeroone.excess_bytes([3, 3, 2, 2, 2], param_count=12, largest=3, setup=fp32, step_bytes=4) == 68 - 68
    # [5, 1 x 5]: 40 B each, rank 1 five counts of the six charged: 4 B over before, exact now
    assert zeroone.excess_bytes([5, 1, 1, 1, 1, 1], param_count=10, largest=5, setup=fp32, step_bytes=4) == -4
    # sizes not known: the largest tensor's bound as before; ZeRO 2 splits every tensor
    assert zeroone.excess_bytes(None, param_count=12, largest=9, setup=fp32) == 8 * (9 - 6)
    assert zeroone.excess_bytes([3, 3, 2, 2, 2], param_count=12, largest=3, setup=setup(zero=2)) == 0


def _two_layers(numels: bool):
    def one(name, sizes):
        item = layer(name, name.upper(), fwd_ms=1, act_mib=0, input_mib=0, param_count=sum(sizes),
                     largest_param_count=max(sizes))
        return item.model_copy(update={"param_tensors": len(sizes),
                                       "trained_param_numels": sizes if numels else None})
    return profile_of([one("a", [300, 200]), one("b", [300, 200, 200])])


def test_evaluate_charges_the_fullest_rank():
    """Tensors of 300, 200 | 300, 200, 200 on one stage at dp 2 (fp32 Adam): rank 0 holds 300 + 200 + 200 = 700
    elements (o = 8 B each) and 3 step counts (4 B) where static charges every rank 1,200 / 2 and all 5: 792 B more.
    The largest tensor's bound (300 < 600) charged none: 792 B under."""
    stages = costmodel.split_to_stages([0], [False, False], _two_layers(True))
    exact = costmodel.evaluate(stages, _two_layers(True), setup()).stages[0].static_bytes
    bound = costmodel.evaluate(stages, _two_layers(False), setup()).stages[0].static_bytes
    assert exact - bound == 8 * (700 - 600) + 4 * (3 - 5) == 792


def _fullest(numels: list[int], ranks: int, optim: float) -> float:
    """Brute force beside zeroone's: the greedy partition written out again, its fullest rank's state and counts."""
    loads, counts = [0] * ranks, [0] * ranks
    for numel in sorted(numels, reverse=True):
        rank = min(range(ranks), key=lambda r: (loads[r], r))
        loads[rank] += numel
        counts[rank] += 1
    return max(optim * load + 4 * count for load, count in zip(loads, counts))


@pytest.mark.parametrize("cap_mib", [40, 48, 60])
def test_solvers_and_evaluate_charge_the_partition(cap_mib):
    """Blocks of two tensors (150 k and 50 k) between a 100 k embedding and head, dp 4, bf16-mixed Adam (o = 12): a
    stage of blocks puts two 150 k tensors on one rank, more than the even share, where the largest tensor (150 k)
    is less than it. Both solvers' plans are evaluate's, each stage's static the fullest rank's by brute force."""
    base = llm_profile(8)
    sizes = {"tok_embeddings": [100_000], "output": [100_000]}
    profile = base.model_copy(update={"layers": [
        item.model_copy(update={"trained_param_numels": sizes.get(item.name, [150_000, 50_000]),
                                "param_tensors": len(sizes.get(item.name, [0, 0])),
                                "largest_param_count": max(sizes.get(item.name, [150_000]))})
        for item in base.layers]})
    s = TrainSetup(stages=3, microbatches=6, micro_batch_size=1, mem_caps_bytes=[cap_mib * MIB] * 3,
                   precision="bf16-mixed", dp=4, zero=1)
    numels = {item.name: item.trained_param_numels for item in profile.layers}
    results = [search.plan(profile, s, time_limit_s=30, solver=solver, mip_gap=0.0) for solver in ("dp", "milp")]
    for result in results:
        assert isinstance(result, search.PlanResult)
        again = costmodel.evaluate(result.stages, profile, s)
        assert again.feasible and again.iteration_ms == pytest.approx(result.cost.iteration_ms, rel=1e-9)
        for stage, cost in zip(result.stages, again.stages, strict=True):
            held = [n for name in stage.layers for n in numels[name]]
            # weights and gradients 2 + 2 B, o / 4 and every step count charged on each rank, then the fullest's
            even = sum(held) * (2 + 2 + 12 / 4) + 4 * len(held)
            assert cost.static_bytes == pytest.approx(even + _fullest(held, 4, 12) - 12 * sum(held) / 4
                                                      - 4 * len(held))
    assert results[1].cost.iteration_ms == pytest.approx(results[0].cost.iteration_ms, rel=1e-6)


def test_a_measured_profile_records_each_trained_tensor(tmp_path):
    """The tied GPT (tests/fixtures/tied_gpt.py, dim 32, vocab 64, seq 16): each layer's trained tensors in its
    parameters() order (a module's own before its children's); on one stage the head's tied weight is the embedding's tensor, partitioned once."""
    from conftest import ROOT
    from fixtures.cli import run_ok

    from planner import io

    run_ok("profile", ROOT / "tests" / "fixtures" / "tied_gpt.py", "--micro-batch-size", "2", "--threads", "1",
           "--repeats", "1", "--warmup", "0", "--out", tmp_path / "p.json")
    profile = io.load_profile(tmp_path / "p.json")
    numels = {item.name: item.trained_param_numels for item in profile.layers}
    block = [32, 32, 32 * 96, 96, 32 * 32, 32, 32, 32, 32 * 128, 128, 128 * 32, 32]  # ln1, attn in/out, ln2, mlp
    assert numels == {"embed": [64 * 32, 16 * 32], **{f"blocks.{i}": block for i in range(4)}, "head": [64 * 32, 32, 32]}
    head = costmodel.layer_costs(profile)[-1]
    assert head.zero_one_numels(1) == (32, 32) and head.zero_one_numels(2) == (64 * 32, 32, 32)
