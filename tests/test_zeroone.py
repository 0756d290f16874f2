"""ZeRO 1 on ckplan's runtime: ZeroRedundancyOptimizer's whole-tensor partition (planner/cost/zeroone.py), charged
exactly where the profile records each trained tensor's size, in evaluate, the DP and the MILP alike."""

from __future__ import annotations

import pytest
from export_plans import llm_profile

from planner.cost import costmodel, zeroone
from planner.models.synthetic import layer, profile_of
from planner.schema import StagePlan, TrainSetup
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
    # one optimizer over two chunks' [10, 7, 6] and [9, 8]: 10, 9, 8 (rank 1 at 17), 7 (rank 0 at 17), 6 (the tie: rank 0)
    assert zeroone.greedy_loads([10, 7, 6, 9, 8], 2) == [[10, 7, 6], [9, 8]]
    assert zeroone.greedy_loads([10, 7, 6], 2) == [[10], [7, 6]] and zeroone.greedy_loads([9, 8], 2) == [[9], [8]]


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


def _blocks_profile():
    """llm_profile(8) with blocks of two tensors (150 k and 50 k) between a 100 k embedding and head (untied)."""
    base = llm_profile(8)
    sizes = {"tok_embeddings": [100_000], "output": [100_000]}
    return base.model_copy(update={"layers": [
        item.model_copy(update={"trained_param_numels": sizes.get(item.name, [150_000, 50_000]),
                                "param_tensors": len(sizes.get(item.name, [0, 0])),
                                "largest_param_count": max(sizes.get(item.name, [150_000]))})
        for item in base.layers]})


@pytest.mark.parametrize("cap_mib", [40, 48, 60])
def test_solvers_and_evaluate_charge_the_partition(cap_mib):
    """Blocks of two tensors (150 k and 50 k) between a 100 k embedding and head, dp 4, bf16-mixed Adam (o = 12): a
    stage of blocks puts two 150 k tensors on one rank, more than the even share, where the largest tensor (150 k)
    is less than it. Both solvers' plans are evaluate's, each stage's static the fullest rank's by brute force."""
    profile = _blocks_profile()
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


def _four_layers(sizes: list[list[int]]):
    def one(index, numels):  # a kind each: layers of one kind share its largest's numbers (layer_costs)
        item = layer(f"l{index}", f"KIND{index}", fwd_ms=1, act_mib=0, input_mib=0, param_count=sum(numels),
                     largest_param_count=max(numels))
        return item.model_copy(update={"param_tensors": len(numels), "trained_param_numels": numels})
    return profile_of([one(index, numels) for index, numels in enumerate(sizes)])


@pytest.mark.parametrize(("first", "third", "fullest", "apart"), [
    # one tensor of 300 a chunk: the union gives each rank one (300 elements, 1 count: 2,404 B); apart each chunk's
    # fullest rank holds its tensor, charged as one rank holding both (2 x 2,404): 2,404 B over
    ([300], [300], 8 * 300 + 4, 2 * (8 * 300 + 4)),
    # [10, 7, 6] and [9, 8]: the union's greedy gives rank 0 10, 7, 6 (23 elements, 3 counts) against 9, 8;
    # apart [10, 7, 6] puts 13 (7, 6) on rank 1 and [9, 8] 9 on rank 0: 22 elements, 3 counts, 8 B under
    ([10, 7, 6], [9, 8], 8 * 23 + 4 * 3, 8 * 13 + 4 * 2 + 8 * 9 + 4),
])
def test_a_rank_of_two_chunks_holds_one_partition_of_both(first, third, fullest, apart):
    """Interleaved 1F1B, 2 ranks x 2 chunks, dp 2, fp32 Adam on the CPU (o = 8 B an element, 4 B a step count): rank 0
    holds stages 0 and 2 in one module and one ZeroRedundancyOptimizer (runtime/worker.py _build), so its optimizer
    state is the fullest rank's of the union's greedy partition (torch 2.13 _partition_parameters), not the sum of
    each chunk's fullest (charged before); weights and gradients 4 + 4 B each."""
    profile = _four_layers([first, [5], third, [5]])
    s = setup(stages=2, mem_caps_bytes=[2**50] * 2, schedule="interleaved-1F1B", chunks=2)
    ranks = [StagePlan(index=0, layers=["l0", "l2"], chunks=[["l0"], ["l2"]]),
             StagePlan(index=1, layers=["l1", "l3"], chunks=[["l1"], ["l3"]])]
    params = sum(first) + sum(third)
    assert costmodel.evaluate(ranks, profile, s).stages[0].static_bytes == 8 * params + fullest
    # the chunks apart, as charged before: their fullest ranks' state summed
    mine = costmodel.layer_costs(profile)
    assert zeroone.rank_excess_bytes([mine[:1], mine[2:3]], profile=profile, setup=s) == (fullest - apart)


@pytest.mark.parametrize(("schedule", "cap_mib"), [("interleaved-1F1B", 44), ("ZBV", 36), ("ZBV", 40)])
def test_the_chunked_milp_charges_each_rank_one_partition(schedule, cap_mib):
    """_blocks_profile on 2 ranks x 2 chunks, dp 4, bf16-mixed Adam (o = 12, 4 B step counts on the CPU): each rank's
    one ZeroRedundancyOptimizer partitions all its chunks' tensors (milp_zeroone: one E a rank, its cuts over every
    chunk's counts). The MILP's plan is evaluate's, each rank's static the union's fullest rank by brute force. Before,
    both charged each chunk's fullest apart: at 36 MiB ZBV had no plan, at 40 MiB 854 ms where 716 fits now, and
    interleaved 1F1B at 44 MiB 894 ms where 849.5 fits."""
    profile = _blocks_profile()
    s = TrainSetup(stages=2, microbatches=4, micro_batch_size=1, mem_caps_bytes=[cap_mib * MIB] * 2,
                   precision="bf16-mixed", dp=4, zero=1, schedule=schedule, chunks=2)
    numels = {item.name: item.trained_param_numels for item in profile.layers}
    result = search.plan(profile, s, time_limit_s=30, solver="milp", mip_gap=0.0)
    assert isinstance(result, search.PlanResult)
    again = costmodel.evaluate(result.stages, profile, s)
    assert again.feasible and again.iteration_ms == pytest.approx(result.cost.iteration_ms, rel=1e-9)
    for rank, cost in zip(result.stages, again.stages, strict=True):
        assert len(rank.chunks) == 2
        held = [n for name in rank.layers for n in numels[name]]
        even = sum(held) * (2 + 2 + 12 / 4) + 4 * len(held)
        assert cost.static_bytes == pytest.approx(even + _fullest(held, 4, 12) - 12 * sum(held) / 4 - 4 * len(held))


# Each rank's static by hand, 2 ranks x 2 chunks at dp 2, fp32 Adam on the CPU: weights and gradients 8 B a parameter,
# then the fullest rank of the union's greedy partition, m and v 8 B an element and 4 B a step count. A block: 4,096 x 2,
# 3,072, 1,024, 128, 96 and 32 x 6 (12,704); the embedding 2,048 and 512; the head 2,048 (the embedding's, tied) and
# 32 x 2. Untied interleaved, rank 0 [embed, blocks.0] + [blocks.2] (27,968): 13,984 a rank, rank 1's 16 tensors
# fullest; rank 1 [blocks.1] + [blocks.3, head] (27,520): 13,760 a rank, rank 1's 14 tensors. Tied ZBV, rank 0
# [embed, blocks.0] + [blocks.3, head], the tied table once (28,032): 14,016 a rank, rank 1's 17; rank 1 [blocks.1] +
# [blocks.2] (25,408): 12,704 a rank, 12 each. Before, each chunk's fullest apart: 6,868 and 6,636 B over; 484 and
# 13,024 (the tied weight's second step count among the 484: stepcounts.rank_tied_once_bytes).
RANK_STATICS = {
    ("untied", "interleaved-1F1B"): (8 * 27_968 + 8 * 13_984 + 4 * 16, 8 * 27_520 + 8 * 13_760 + 4 * 14),
    ("tied", "ZBV"): (8 * 28_032 + 8 * 14_016 + 4 * 17, 8 * 25_408 + 8 * 12_704 + 4 * 12),
}


@pytest.mark.slow
@pytest.mark.parametrize(("fixture", "schedule"), list(RANK_STATICS))
def test_a_chunked_launch_holds_one_partition_a_rank(tmp_path, fixture, schedule):
    """The GPT fixture on ckplan's runtime (gloo), 2 ranks x 2 chunks, dp 2, ZeRO 1, M 4, stages pinned to [embed,
    blocks.0] | [blocks.1] | [blocks.2] | [blocks.3, head]: each rank's measured static is its prediction and the
    hand count (RANK_STATICS)."""
    from conftest import ROOT
    from fixtures.cli import run_ok

    from planner import io
    from planner.runtime.launcher import run_plan

    run_ok("profile", ROOT / "tests" / "fixtures" / f"{fixture}_gpt.py", "--micro-batch-size", "2", "--threads", "1",
           "--repeats", "1", "--warmup", "0", "--out", tmp_path / "p.json")
    run_ok("solve", "--profile", tmp_path / "p.json", "--stages", "2", "--dp", "2", "--zero", "1", "--mem", "1GiB",
           "--microbatches", "4", "--schedule", schedule, "--chunks", "2", "--out", tmp_path / "plan.yaml")
    plan, profile = io.load_plan(tmp_path / "plan.yaml"), io.load_profile(tmp_path / "p.json")
    names = [layer.name for layer in profile.layers]
    stages = [names[:2], names[2:3], names[3:4], names[4:]]
    order = costmodel.schedule_of(plan.setup)
    chunks = [[stages[k] for k in order.stages_of(rank)] for rank in range(2)]
    ranks = [StagePlan(index=rank, layers=[n for chunk in mine for n in chunk], chunks=mine)
             for rank, mine in enumerate(chunks)]
    cost = costmodel.evaluate(ranks, profile, plan.setup)
    plan = plan.model_copy(update={"stages": [rank.model_copy(update={"predicted": c.predicted()})
                                              for rank, c in zip(ranks, cost.stages)]})
    report = run_plan(plan, plan_file=tmp_path / "plan.yaml", steps=2, warmup_steps=1)
    measured = tuple(stage.measured.static_bytes for stage in report.stages)
    assert measured == tuple(stage.predicted.static_bytes for stage in report.stages) == RANK_STATICS[fixture, schedule]
