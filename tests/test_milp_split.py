"""The chunked solver prices a split backward (ZB, ZBV, DualPipeV) as the evaluator runs it: each
layer's recorded input and weight passes past the pipeline's first stage, its full backward on the
first (splittime.layer_extra_ms in the MILP's rows, splittime.stage_times in chunked_linear_ms and
evaluate), so the MILP's optimum is the least linear time of every plan that fits."""

import itertools
import random

import pytest

from planner.cost import costmodel, splittime
from planner.models.synthetic import layer, profile_of
from planner.schema import StagePlan, TrainSetup
from planner.schema.profile import RecomputeOption
from planner.solve import milp, search

MIB = 2**20


def _block(name: str, kind: str, fwd_ms: float, act_mib: float, *, recorded: bool = True):
    """F fwd_ms, B 2·F; none keeps act_mib and its passes run I 1.2·F, W 1.0·F (2.2·F against its B
    of 2·F: 1.1, framework-facts §62's measured GPT block 1.04-1.21); full keeps its 1 MiB input,
    recomputes F, and its passes run I 2.2·F, W 6.8·F (9·F against B + recompute 3·F: 3.0, §62's
    2.7-3.4, the weight pass rerunning the forward in each parameter group's call)."""
    found = layer(name, kind, fwd_ms=fwd_ms, act_mib=act_mib, input_mib=1, output_mib=1, param_count=1000,
                  transient_mib=0.5)
    split = (lambda i, w: {"input_grad_ms": i * fwd_ms, "weight_grad_ms": w * fwd_ms}) if recorded else (lambda i, w: {})
    options = [RecomputeOption(name="none", kept_bytes=found.act_bytes, **split(1.2, 1.0)),
               RecomputeOption(name="full", kept_bytes=found.input_bytes, recompute_ms=fwd_ms, **split(2.2, 6.8))]
    return found.model_copy(update={"recompute_options": options})


def _profile(seed: int, *, recorded: bool = True, num_layers: int = 6):
    rng = random.Random(seed)
    sizes = [(1 + rng.uniform(-0.3, 0.3), 10 * (1 + rng.uniform(-0.3, 0.3))) for _ in range(num_layers)]
    return profile_of([_block(f"l{i}", f"L{i}", f, act, recorded=recorded) for i, (f, act) in enumerate(sizes)])


def _setup(schedule: str, cap_bytes: int = 2**50) -> TrainSetup:
    return TrainSetup(stages=2, microbatches=4, micro_batch_size=1, schedule=schedule, chunks=2,
                      mem_caps_bytes=[cap_bytes] * 2)


def _key(ranks):
    return [(rank.chunks, sorted(rank.checkpointed)) for rank in ranks]


def _linear_as_evaluated(ranks, profile, setup) -> float:
    """The chunked MILP's linear time written out from evaluate's own per-stage passes: each stage's
    sums (stage_sums), its F and its split backward's I and W as plan_iteration_ms gives the simulation
    (split_pass_ms over stage_split), then M·Σ a rank's F + I + W + (P - 1)·the slowest stage + the
    slowest step."""
    order = costmodel.schedule_of(setup)
    inner = costmodel.stages_view(setup, order)
    costs = {c.name: c for c in costmodel.layer_costs(profile)}
    busy, steps = [], []
    for k, stage in enumerate(costmodel.pipeline_stages(ranks, setup)):
        layers = [costs[name] for name in stage.layers]
        options = costmodel.option_indices(stage, layers)
        sums = costmodel.stage_sums(layers, options, stage=k, profile=profile, setup=inner)
        forward = sums.forward_ms + sums.comm_ms / 2
        passes = splittime.split_pass_ms(sums.busy_ms - forward, splittime.stage_split(layers, options, setup), stage=k)
        busy.append(forward + sum(passes))
        steps.append(sums.step_ms)
    work = max(setup.pipeline.microbatches * sum(busy[k] for k in order.stages_of(r)) for r in range(order.num_ranks))
    return work + (order.num_ranks - 1) * max(busy) + max(sum(steps[k] for k in order.stages_of(r))
                                                         for r in range(order.num_ranks))


def test_a_layers_extra_is_its_recorded_passes_beyond_the_backward_charged():
    """F 1: none 1.2 + 1.0 - 2 = 0.2 ms more; full 2.2 + 6.8 - (2 + 1) = 6 ms more; nothing
    recorded: nothing more."""
    costs = costmodel.layer_costs(profile_of([_block("a", "A", 1.0, 10), _block("b", "B", 1.0, 10, recorded=False)]))
    setup = _setup("ZBV")
    assert splittime.layer_extra_ms(costs[0], 0, setup) == pytest.approx(0.2)
    assert splittime.layer_extra_ms(costs[0], 1, setup) == pytest.approx(6.0)
    assert splittime.layer_extra_ms(costs[1], 1, setup) == 0.0


def test_the_linear_time_of_a_zbv_plan_counts_the_split_passes_by_hand():
    """ZBV, 2 ranks x 2 one-layer stages (rank 0: stages 0 and 3), M 2, every layer F 1, B 2, none:
    stage 0 busy 3 (its full backward as W), stages 1-3 3.2 (I 1.2 + W 1.0). Rank 0: 2·(3 + 3.2)
    = 12.4, rank 1: 2·6.4 = 12.8; plus (P - 1)·3.2: 16.0. The MILP's rows say the same."""
    profile = profile_of([_block(f"l{k}", "Block", 1.0, 10) for k in range(4)])
    setup = TrainSetup(stages=2, microbatches=2, micro_batch_size=1, schedule="ZBV", chunks=2,
                       mem_caps_bytes=[2**50] * 2)
    ranks = [StagePlan(index=0, layers=["l0", "l3"], chunks=[["l0"], ["l3"]]),
             StagePlan(index=1, layers=["l1", "l2"], chunks=[["l1"], ["l2"]])]
    assert costmodel.chunked_linear_ms(ranks, profile, setup) == pytest.approx(16.0)
    problem = milp.build_problem(profile, setup)
    assert milp.solve(problem, mip_gap=0.0, threads=1).objective == pytest.approx(16.0)


@pytest.mark.parametrize("schedule", ["ZBV", "ZB", "DualPipeV"])
def test_the_split_milp_is_brute_force_over_every_plan_on_the_evaluators_time(schedule):
    """6 different layers into P·V = 4 stages, none or full each (640 plans), each scored by the
    evaluator: at caps between the least and the largest peak, the MILP's objective is the least
    linear time (the split passes as evaluate hands them to its simulation; chunked_linear_ms the
    same) of the plans that fit,
    and its plan is one of those that reach it (ties: a rank off the critical path)."""
    profile = _profile(1)
    roomy = _setup(schedule)
    plans = []
    for cuts in itertools.combinations(range(1, 6), 3):
        for mask in range(2**6):
            ranks = costmodel.ranks_of(costmodel.split_to_stages([0, *cuts], [mask >> i & 1 for i in range(6)], profile),
                                       roomy)
            peak = max(costmodel.evaluate(ranks, profile, roomy).peak_bytes_per_stage)
            linear = _linear_as_evaluated(ranks, profile, roomy)
            assert costmodel.chunked_linear_ms(ranks, profile, roomy) == pytest.approx(linear, rel=1e-12)
            plans.append((ranks, peak, linear))
    least, most = min(p[1] for p in plans), max(p[1] for p in plans)
    for fraction in (0.2, 0.4):
        cap = int(least + fraction * (most - least))
        setup = _setup(schedule, cap)
        fitting = [(ranks, linear) for ranks, peak, linear in plans if peak + costmodel.FIT_MARGIN_BYTES <= cap]
        best = min(linear for _, linear in fitting)
        problem = milp.build_problem(profile, setup)
        assert milp.solve(problem, mip_gap=0.0, threads=1).objective == pytest.approx(best, rel=1e-6)
        chosen = milp.extract_plan(problem)
        assert _key(chosen) in [_key(ranks) for ranks, linear in fitting if linear == pytest.approx(best, rel=1e-9)]
        assert costmodel.evaluate(chosen, profile, setup).feasible


def test_pricing_the_split_picks_a_faster_plan_than_pricing_one_backward():
    """ZBV, 6 layers, 60 MiB a rank: the solver that priced a layer's backward as one number (the
    same profile with no split recorded: what the MILP read before) checkpoints l0 on stage 0 and l3,
    l4 on stage 2; priced as the passes run, full costs 6.8·F more than none on a stage past the
    first and F on the first, and the MILP checkpoints l0 alone. Under the evaluator (the simulated
    schedule) the new plan takes 42.78 ms, the old 74.00 ms."""
    profile = _profile(7)
    setup = _setup("ZBV", 60 * MIB)
    plans = {}
    for name, priced in (("old", _profile(7, recorded=False)), ("new", profile)):
        problem = milp.build_problem(priced, setup)
        assert milp.solve(problem, mip_gap=0.0, threads=1).status == "optimal"
        plans[name] = milp.extract_plan(problem)
    old, new = (costmodel.evaluate(plans[name], profile, setup) for name in ("old", "new"))
    assert _key(plans["old"]) != _key(plans["new"])
    assert old.feasible and new.feasible
    assert _key(plans["old"]) == [([["l0", "l1"], ["l5"]], ["l0"]), ([["l2"], ["l3", "l4"]], ["l3", "l4"])]
    assert _key(plans["new"]) == [([["l0"], ["l3", "l4", "l5"]], ["l0"]), ([["l1"], ["l2"]], [])]
    assert (old.iteration_ms, new.iteration_ms) == pytest.approx((74.00, 42.78), abs=0.01)
    assert costmodel.chunked_linear_ms(plans["new"], profile, setup) < costmodel.chunked_linear_ms(plans["old"], profile, setup)
    # the search reports the new plan (or one the simulation scores no slower)
    found = search.plan(profile, setup, mip_gap=0.0, threads=1)
    assert found.cost.iteration_ms <= new.iteration_ms + 1e-9


def test_an_option_faster_only_past_the_first_stage_is_kept():
    """Two options that keep the same bytes at the same peak: full (recompute 1, B + recompute 3, its
    passes 2 + 4) and a dearer recompute that splits cleanly (1.5; its passes 2 + 1.5). Full is faster
    where the backward runs whole (4 against 4.5 ms; ZBV's first stage, interleaved), the other past
    ZBV's first stage (4.5 against 4 + 3 = 7): useful_options keeps both under ZBV, full alone under
    interleaved."""
    found = layer("a", "A", fwd_ms=1.0, act_mib=10, input_mib=1, output_mib=1, param_count=1000)
    options = [RecomputeOption(name="none", kept_bytes=found.act_bytes),
               RecomputeOption(name="full", kept_bytes=found.input_bytes, recompute_ms=1.0,
                               input_grad_ms=2.0, weight_grad_ms=4.0),
               RecomputeOption(name="selective", kept_bytes=found.input_bytes, recompute_ms=1.5,
                               recompute_peak_bytes=found.act_bytes - found.input_bytes,  # full's, recomputed
                               input_grad_ms=2.0, weight_grad_ms=1.5)]
    profile = profile_of([found.model_copy(update={"recompute_options": options})])
    costs = costmodel.layer_costs(profile)
    split_ctx = costmodel.Context(profile, _setup("ZBV"))
    plain_ctx = costmodel.Context(profile, _setup("interleaved-1F1B"))
    assert costmodel.useful_options(costs[0], split_ctx) == [1, 2]
    assert costmodel.useful_options(costs[0], plain_ctx) == [1]
